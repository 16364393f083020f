"""AlphaFold3 data pipeline: CCD and RDKit molecules, tokens, atoms, reference conformers, MSA
and template features, cropping, the ahead-of-time cache, the mmCIF of a prediction.

As in :mod:`fold_data.af2`: ``parse`` reads an entry (the AlphaFold3 input JSON, mmCIF
complexes, FASTA); ``features`` (``make_features(path_or_entry)``) builds the deterministic raw
features (schema ``RAW_FEATURES``: what the cache stores, :func:`fetch_af3_features`);
``transforms`` (``make_sample(raw, preset, seed=...)``) the per-step sample (schema
``SAMPLE_FEATURES``) that fold-model's AF3 consumes; ``write`` builds the mmCIF structure of a
prediction.

Names are imported lazily (:mod:`fold_data._lazy`): training from a built cache (``af3_cache``,
``make_sample``, the presets and schema) needs numpy only, so a GPU node without gemmi, RDKit or
biotite trains from a cache made elsewhere; the parsers load gemmi when first touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fold_data._lazy import lazy_getattr

_EXPORTS = {
    "af3_cache": ".cache",
    "af3_pipeline_version": ".cache",
    "fetch_af3_features": ".cache",
    "Ccd": ".ccd",
    "ChemComp": ".ccd",
    "default_ccd": ".ccd",
    "load_entry": ".features",
    "make_features": ".features",
    "ChainFilters": ".filters",
    "filter_chains": ".filters",
    "RDKitUnavailable": ".molecules",
    "Bond": ".parse",
    "Chain": ".parse",
    "Entry": ".parse",
    "parse_af3_json": ".parse",
    "parse_complex_mmcif": ".parse",
    "parse_fasta_entry": ".parse",
    "PRESETS": ".presets",
    "AF3DataPreset": ".presets",
    "get_preset": ".presets",
    "RAW_FEATURES": ".schema",
    "SAMPLE_FEATURES": ".schema",
    "make_sample": ".transforms",
    "SMILES_LIGAND_NAME": ".write",
    "AF3Prediction": ".write",
    "af3_prediction_to_structure": ".write",
}

__all__ = [
    "PRESETS",
    "SMILES_LIGAND_NAME",
    "AF3Prediction",
    "RDKitUnavailable",
    "RAW_FEATURES",
    "SAMPLE_FEATURES",
    "AF3DataPreset",
    "Bond",
    "Ccd",
    "Chain",
    "ChainFilters",
    "ChemComp",
    "Entry",
    "af3_cache",
    "af3_prediction_to_structure",
    "af3_pipeline_version",
    "default_ccd",
    "fetch_af3_features",
    "filter_chains",
    "get_preset",
    "load_entry",
    "make_features",
    "make_sample",
    "parse_af3_json",
    "parse_complex_mmcif",
    "parse_fasta_entry",
]  # the keys of _EXPORTS (tests/test_public_api.py)

if TYPE_CHECKING:
    from .cache import af3_cache, af3_pipeline_version, fetch_af3_features
    from .ccd import Ccd, ChemComp, default_ccd
    from .features import load_entry, make_features
    from .filters import ChainFilters, filter_chains
    from .molecules import RDKitUnavailable
    from .parse import Bond, Chain, Entry, parse_af3_json, parse_complex_mmcif, parse_fasta_entry
    from .presets import PRESETS, AF3DataPreset, get_preset
    from .schema import RAW_FEATURES, SAMPLE_FEATURES
    from .transforms import make_sample
    from .write import SMILES_LIGAND_NAME, AF3Prediction, af3_prediction_to_structure

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
