"""fold-train: training, prediction and evaluation for fold models, and the ``fold-train`` CLI.

Modules: :mod:`~fold_train.config` (TrainConfig in sections, presets, overrides),
:mod:`~fold_train.families` (the ``Family`` interface; AF2 and AF3), :mod:`~fold_train.parallelize`
(the one function that applies DAP/BP, checkpointing, chunking, compile and CUDA graphs),
:mod:`~fold_train.optim` (tensor fusion: FlatParams, FlatAdam with the AF2 schedule, clipping and
EMA), :mod:`~fold_train.loop` (Trainer), :mod:`~fold_train.data` (sample stream over the feature
cache), :mod:`~fold_train.checkpoint` (atomic, checksummed, weights-only),
:mod:`~fold_train.metrics` (RMSD, lDDT-Ca, TM-score, GDT-TS/HA), :mod:`~fold_train.predict`,
:mod:`~fold_train.evaluate`, :mod:`~fold_train.distributed`, :mod:`~fold_train.plot`,
:mod:`~fold_train.cli`.

The names of ``__all__`` are imported from their modules on first use, so ``import fold_train``
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "TrainConfig": "config", "ConfigError": "config", "apply_overrides": "config",
    "preset": "config", "presets": "config",
    "Family": "families", "AF2Family": "families", "AF3Family": "families",
    "FAMILIES": "families", "make_family": "families",
    "Techniques": "parallelize", "Parallelized": "parallelize", "parallelize": "parallelize",
    "Trainer": "loop", "NonFiniteError": "loop", "TrainingInterrupted": "loop",
    "SampleStream": "data", "DistContext": "distributed",
    "AdamConfig": "optim", "FlatAdam": "optim", "FlatParams": "optim",
    "load_trained_model": "predict", "predict_structure": "predict",
    "predict_af3": "predict_af3", "sample_af3": "predict_af3", "AF3Runner": "predict_af3",
    "AF2Runner": "predict_af2",
    "CheckpointError": "checkpoint", "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fold_train' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fold_train.{module}"), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
