"""fold-train: training, prediction and evaluation for fold models, and the ``fold-train`` CLI.

Modules: :mod:`~fold_train.config` (TrainConfig, presets, overrides), :mod:`~fold_train.optim`
(tensor fusion: FlatParams, FlatAdam with the AF2 schedule, clipping and EMA),
:mod:`~fold_train.loop` (Trainer), :mod:`~fold_train.data` (sample stream over the fold-data
cache), :mod:`~fold_train.checkpoint` (atomic, checksummed, weights-only),
:mod:`~fold_train.metrics` (RMSD, lDDT-Ca, TM-score, GDT-TS/HA), :mod:`~fold_train.predict`,
:mod:`~fold_train.evaluate`, :mod:`~fold_train.distributed`, :mod:`~fold_train.plot`,
:mod:`~fold_train.cli`. Sub-modules are imported on use, so ``import fold_train`` is cheap.
"""

__version__ = "0.1.0"
