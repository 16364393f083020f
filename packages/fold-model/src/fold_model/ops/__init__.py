"""fold-model's op registry and one wrapper per op around :func:`dispatch`.

Model code calls the wrappers (``ops.attention(...)``, ``ops.layer_norm(...)``); each one
dispatches to the selected backend (the torch references of :mod:`fold_ops.reference` are always
registered). The ops, their signatures and references are :data:`fold_ops.contract.OPS`: a
wrapper has its op's reference's signature and docstring, plus a keyword ``backend``. See
:mod:`fold_model.ops.registry` for the selection rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from fold_ops.contract import OPS as CONTRACT
from fold_ops.contract import Op

from fold_model.ops.registry import (
    OPS,
    BackendUnavailable,
    backends,
    dispatch,
    register,
    resolve,
    unregister,
    use_backend,
)


def _wrapper(op: Op) -> Callable:
    def call(*args, backend: str | None = None, **kwargs):
        return dispatch(op.name, *args, backend=backend, **kwargs)

    functools.update_wrapper(call, op.reference)
    call.__name__ = call.__qualname__ = op.name
    return call


for _op in CONTRACT.values():  # ops.linear, ops.attention, ...: one per op of the contract
    globals()[_op.name] = _wrapper(_op)

__all__ = [  # the op wrappers are named by the contract
    "OPS",
    "BackendUnavailable",
    "backends",
    "dispatch",
    "register",
    "resolve",
    "unregister",
    "use_backend",
    *CONTRACT,
]
