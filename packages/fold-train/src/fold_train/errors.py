"""fold-train's configuration error (its own module: the config and the families raise it, and
neither imports the other for it)."""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad configuration key or value (the message names the key and the expected type)."""
