"""fold-data: the data pipeline of fold (mmCIF, MSAs, templates, AF2/AF3 features, cache, loader)."""

__version__ = "0.1.0"
