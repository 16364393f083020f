"""AlphaFold2 features: deterministic raw features of a chain and per-step training samples.

``make_features`` / ``make_features_from_sequence`` build the raw features (schema
``RAW_FEATURES``, cacheable); ``make_sample`` turns them into one fixed-size sample for a
preset (schema ``SAMPLE_FEATURES``), which fold-model consumes.
"""

from .features import make_features, make_features_from_sequence
from .presets import PRESETS, DataPreset, get_preset
from .schema import RAW_FEATURES, SAMPLE_FEATURES, FeatureSpec, SchemaError, validate
from .transforms import make_sample

__all__ = [
    "PRESETS",
    "RAW_FEATURES",
    "SAMPLE_FEATURES",
    "DataPreset",
    "FeatureSpec",
    "SchemaError",
    "get_preset",
    "make_features",
    "make_features_from_sequence",
    "make_sample",
    "validate",
]
