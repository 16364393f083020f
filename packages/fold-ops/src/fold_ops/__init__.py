"""fold-ops: the op contract shared by fold-model (which dispatches the ops) and fold-kernels
(which implements them), with the two runtime checks both need.

* :mod:`fold_ops.contract`: ``OPS``, each op's name, signature and PyTorch reference;
* :mod:`fold_ops.reference`: the references themselves;
* :mod:`fold_ops.autocast`: what the ops do under autocast (the lowered ops' input casts, the
  LayerNorm forks' output dtype);
* :mod:`fold_ops.env`: ``EnvVar``, an environment variable read cheaply on hot paths;
* :mod:`fold_ops.tracing`: ``fx_tracing()`` and ``compiling()``.

Needs only torch, so that fold-kernels depends on it without depending on fold-model, and
fold-model without depending on Triton.
"""

from __future__ import annotations

from fold_ops.contract import OPS, Op
from fold_ops.env import EnvVar
from fold_ops.tracing import compiling, fx_tracing

__version__ = "0.1.0"

__all__ = ["__version__", "OPS", "Op", "EnvVar", "fx_tracing", "compiling"]
