"""AlphaFold2 data: parse, features, transforms and write for one protein chain.

``parse`` reads the chain (an mmCIF chain or a query sequence); ``features``
(``make_features`` / ``make_features_from_sequence``) builds the raw features (schema
``RAW_FEATURES``, cacheable); ``transforms`` (``make_sample``) turns them into one fixed-size
sample for a preset (schema ``SAMPLE_FEATURES``), which fold-model consumes; ``write`` builds
the mmCIF structure of a prediction. MSAs and templates come from the shared
:mod:`fold_data.msa` and :mod:`fold_data.templates`.

Names are imported lazily: ``fold_data.af2.schema`` and ``fold_data.af2.ground_truth`` need only
numpy, so fold-model can use them on a machine without gemmi (a GPU node that only trains from a
cache); the parsers load gemmi when ``make_features`` is first touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fold_data._lazy import lazy_getattr

_EXPORTS = {
    "parse_protein_chain": ".parse",
    "parse_query_sequence": ".parse",
    "make_features": ".features",
    "make_features_from_sequence": ".features",
    "PRESETS": ".presets",
    "DataPreset": ".presets",
    "get_preset": ".presets",
    "RAW_FEATURES": ".schema",
    "SAMPLE_FEATURES": ".schema",
    "make_sample": ".transforms",
    "Prediction": ".write",
    "prediction_to_structure": ".write",
}

__all__ = [
    "DataPreset",
    "PRESETS",
    "Prediction",
    "RAW_FEATURES",
    "SAMPLE_FEATURES",
    "get_preset",
    "make_features",
    "make_features_from_sequence",
    "make_sample",
    "parse_protein_chain",
    "parse_query_sequence",
    "prediction_to_structure",
]  # the keys of _EXPORTS (tests/test_public_api.py)

if TYPE_CHECKING:
    from .features import make_features, make_features_from_sequence
    from .parse import parse_protein_chain, parse_query_sequence
    from .presets import PRESETS, DataPreset, get_preset
    from .schema import RAW_FEATURES, SAMPLE_FEATURES
    from .transforms import make_sample
    from .write import Prediction, prediction_to_structure

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
