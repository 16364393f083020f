"""AlphaFold2 in fold-model: ``config(preset_name, **overrides)`` and ``AlphaFold2(config)``.

``AlphaFold2`` and the modules are imported on first use, so importing a sub-module (the structure
module, the losses) does not build the whole model's import graph.
"""

from __future__ import annotations

from typing import Any

from fold_model.af2.config import (
    PRESETS,
    AlphaFold2Config,
    EmbedderConfig,
    EvoformerConfig,
    ExtraMsaConfig,
    RecyclingConfig,
    TemplateConfig,
    config,
)

__all__ = [
    "PRESETS",
    "AlphaFold2",
    "AlphaFold2Config",
    "EmbedderConfig",
    "EvoformerConfig",
    "ExtraMsaConfig",
    "RecyclingConfig",
    "TemplateConfig",
    "config",
    "load_alphafold_params",
    "load_openfold_params",
]


def __getattr__(name: str) -> Any:
    if name == "AlphaFold2":
        from fold_model.af2.model import AlphaFold2

        return AlphaFold2
    if name == "load_alphafold_params":  # AF2's params_model_*.npz
        from fold_model.af2.params_af2 import load_alphafold_params

        return load_alphafold_params
    if name == "load_openfold_params":  # OpenFold's .pt checkpoints
        from fold_model.af2.params_openfold import load_openfold_params

        return load_openfold_params
    raise AttributeError(f"module 'fold_model.af2' has no attribute {name!r}")
