"""Environment variables read on hot paths (op dispatch, kernel launch)."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["EnvVar"]


class EnvVar:
    """An environment variable read cheaply on every call: the raw value is looked up in
    ``os.environ``'s backing dict and re-parsed only when that value object changes, so
    ``monkeypatch.setenv`` / ``os.environ[...] = ...`` take effect at once while a hot path
    pays a dict lookup instead of ``os.environ.get`` (a few microseconds: it encodes the key).

    ``parse`` receives the value, or None when the variable is unset.
    """

    def __init__(self, name: str, parse: Callable[[str | None], object]) -> None:
        self.name = name
        self.parse = parse
        data = getattr(os.environ, "_data", None)
        encode = getattr(os.environ, "encodekey", None)
        self._data = data if isinstance(data, dict) and encode is not None else None
        self._key = encode(name) if self._data is not None else name
        self._raw: object = object()  # matches nothing: the first get() parses
        self._value: object = None

    def get(self):
        raw = self._data.get(self._key) if self._data is not None else os.environ.get(self.name)
        if raw is not self._raw:
            text = None if raw is None else (raw.decode() if isinstance(raw, bytes) else raw)
            self._value = self.parse(text)
            self._raw = raw
        return self._value
