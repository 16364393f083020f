"""AlphaFold2 features: deterministic raw features of a chain and per-step training samples.

``make_features`` / ``make_features_from_sequence`` build the raw features (schema
``RAW_FEATURES``, cacheable); ``make_sample`` turns them into one fixed-size sample for a
preset (schema ``SAMPLE_FEATURES``), which fold-model consumes.

Names are imported lazily: ``fold_data.af2.schema`` and ``fold_data.af2.ground_truth`` need only
numpy, so fold-model can use them on a machine without gemmi (a GPU node that only trains from a
cache); the parsers load gemmi when ``make_features`` is first touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "make_features": ".features",
    "make_features_from_sequence": ".features",
    "PRESETS": ".presets",
    "DataPreset": ".presets",
    "get_preset": ".presets",
    "RAW_FEATURES": ".schema",
    "SAMPLE_FEATURES": ".schema",
    "make_sample": ".transforms",
}

__all__ = [
    "PRESETS",
    "RAW_FEATURES",
    "SAMPLE_FEATURES",
    "DataPreset",
    "get_preset",
    "make_features",
    "make_features_from_sequence",
    "make_sample",
]

if TYPE_CHECKING:
    from .features import make_features, make_features_from_sequence
    from .presets import PRESETS, DataPreset, get_preset
    from .schema import RAW_FEATURES, SAMPLE_FEATURES
    from .transforms import make_sample


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
