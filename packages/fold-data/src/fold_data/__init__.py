"""fold-data: the data pipeline of fold (mmCIF, MSAs, templates, features, cache, loader).

Layout: the modules both families share sit at the top (``schema`` the feature-spec validator,
``readers`` the one table that picks a file's reader by suffix, ``msa`` and ``templates`` the
alignment and template loaders, ``mmcif`` / ``template_hits`` the parsers, ``write`` the mmCIF
writer, ``cache`` / ``loader`` / ``dataset``); ``af2`` and ``af3`` are siblings, each with
``parse``, ``features``, ``transforms``, ``write`` and its own ``schema``.

Names are imported lazily (:mod:`fold_data._lazy`): ``import fold_data`` needs numpy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "af2": "",
    "af3": "",
    "InputError": ".errors",
    "InputWarning": ".errors",
    "FeatureSpec": ".schema",
    "SchemaError": ".schema",
    "validate": ".schema",
    "reader": ".readers",
    "Msa": ".msa",
    "load_msa": ".msa",
    "parse_a3m": ".msa",
    "parse_fasta": ".msa",
    "parse_stockholm": ".msa",
    "TemplateHit": ".template_hits",
    "parse_hhr": ".template_hits",
    "parse_hmmsearch_sto": ".template_hits",
    "load_template_hits": ".templates",
    "make_template_features": ".templates",
    "MmcifStructure": ".mmcif",
    "parse_mmcif": ".mmcif",
    "write_mmcif": ".write",
    "FeatureCache": ".cache",
    "build_cache": ".cache",
    "NonBlockingLoader": ".loader",
    "ChainEntry": ".dataset",
    "discover_chains": ".dataset",
}

__all__ = [
    "ChainEntry",
    "FeatureCache",
    "FeatureSpec",
    "InputError",
    "InputWarning",
    "MmcifStructure",
    "Msa",
    "NonBlockingLoader",
    "SchemaError",
    "TemplateHit",
    "af2",
    "af3",
    "build_cache",
    "discover_chains",
    "load_msa",
    "load_template_hits",
    "make_template_features",
    "parse_a3m",
    "parse_fasta",
    "parse_hhr",
    "parse_hmmsearch_sto",
    "parse_mmcif",
    "parse_stockholm",
    "reader",
    "validate",
    "write_mmcif",
]  # the keys of _EXPORTS (tests/test_public_api.py)

if TYPE_CHECKING:
    from . import af2, af3
    from .cache import FeatureCache, build_cache
    from .dataset import ChainEntry, discover_chains
    from .errors import InputError, InputWarning
    from .loader import NonBlockingLoader
    from .mmcif import MmcifStructure, parse_mmcif
    from .msa import Msa, load_msa, parse_a3m, parse_fasta, parse_stockholm
    from .readers import reader
    from .schema import FeatureSpec, SchemaError, validate
    from .template_hits import TemplateHit, parse_hhr, parse_hmmsearch_sto
    from .templates import load_template_hits, make_template_features
    from .write import write_mmcif

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
