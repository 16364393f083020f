"""fold-model: AlphaFold2 and AlphaFold3 models with seams for kernels, parallelism, chunking.

Sub-packages (imported on first use, so ``import fold_model`` stays cheap):

* :mod:`fold_model.layers`: the layers both families use and the one stack runner;
* :mod:`fold_model.geometry`: rigid frames;
* :mod:`fold_model.af2`, :mod:`fold_model.af3`: the two families, composed of layers;
* :mod:`fold_model.ops`: the op registry (the contract is :mod:`fold_ops.contract`);
* :mod:`fold_model.seams`: the axial seam (DAP) and the branch seam (BP);
* :mod:`fold_model.upgrades`: conversions of fold's earlier parameter layouts.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AlphaFold2",
    "AlphaFold3",
    "AxialComm",
    "BranchSeam",
    "IDENTITY_COMM",
    "af2",
    "af3",
    "geometry",
    "layers",
    "ops",
    "seams",
    "upgrades",
]

_LAZY = {
    "AlphaFold2": "fold_model.af2.model",
    "AlphaFold3": "fold_model.af3.model",
    "AxialComm": "fold_model.seams",
    "BranchSeam": "fold_model.seams",
    "IDENTITY_COMM": "fold_model.seams",
}
_SUBPACKAGES = {"af2", "af3", "geometry", "layers", "ops", "seams", "upgrades"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"fold_model.{name}")
    raise AttributeError(f"module 'fold_model' has no attribute {name!r}")
