"""fold-data: the data pipeline of fold (mmCIF, MSAs, templates, features, cache, loader)."""

__version__ = "0.1.0"
