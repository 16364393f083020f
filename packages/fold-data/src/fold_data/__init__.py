"""fold-data: Data pipeline for AlphaFold-style models: mmCIF (gemmi), MSAs, templates, features, ahead-of-time cache, non-blocking loader."""

__version__ = "0.1.0"
