"""The leaf function of each op of the contract: what a torch.fx graph calls for the op.

While torch.fx traces a module (AutoChunk), :func:`fold_model.ops.registry.resolve` records
each op call as one ``call_function`` node whose target is the op's leaf here
(``leaves.attention_packed``, ...): a module-level function that, when the graph runs,
dispatches the op like eager code does (the Triton kernels on a GPU, the reference elsewhere,
the backend's shape-only fake on FakeTensors). Each leaf carries ``fold_op``, the op's name in
:data:`fold_ops.contract.OPS`: fold-chunk recognises leaf nodes by that attribute (it imports
neither fold-model nor fold-kernels) and knows how chunk dims flow through each op by its
contract. ``__signature__`` is the op's (its reference's); a node may also pass ``backend=``,
an explicit request made while tracing.
"""

from __future__ import annotations

from collections.abc import Callable

from fold_ops.contract import OPS as CONTRACT
from fold_ops.contract import Op

__all__ = ["LEAVES", *CONTRACT]


def _leaf(op: Op) -> Callable:
    name = op.name

    def leaf(*args, **kwargs):
        from fold_model.ops.registry import dispatch  # the registry imports this module

        return dispatch(name, *args, **kwargs)

    leaf.__name__ = leaf.__qualname__ = name
    leaf.__module__ = __name__
    leaf.__doc__ = f"``dispatch({name!r}, ...)``: the op as a node of a traced graph."
    leaf.__signature__ = op.signature  # type: ignore[attr-defined]
    leaf.fold_op = name  # type: ignore[attr-defined]
    return leaf


LEAVES: dict[str, Callable] = {op.name: _leaf(op) for op in CONTRACT.values()}
globals().update(LEAVES)  # leaves.attention, leaves.layer_norm, ...: importable by name
