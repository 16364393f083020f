"""AlphaFold3 in fold-model: ``config(preset_name, **overrides)`` and ``AlphaFold3(config)``.

``AlphaFold3`` is imported on first use, so importing a sub-module (the Pairformer, the losses)
does not build the whole model's import graph.
"""

from __future__ import annotations

from typing import Any

from fold_model.af3.config import PRESETS, AlphaFold3Config, config

__all__ = ["PRESETS", "AlphaFold3", "AlphaFold3Config", "config"]


def __getattr__(name: str) -> Any:
    if name == "AlphaFold3":
        from fold_model.af3.model import AlphaFold3

        return AlphaFold3
    raise AttributeError(f"module 'fold_model.af3' has no attribute {name!r}")
