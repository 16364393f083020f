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
]


def __getattr__(name: str) -> Any:
    if name == "AlphaFold2":
        from fold_model.af2.model import AlphaFold2

        return AlphaFold2
    raise AttributeError(f"module 'fold_model.af2' has no attribute {name!r}")
