"""What the ops do under autocast, stated once for every backend.

fold-train runs the models in bf16 autocast (``system.precision=bf16``, and every ``fold-train
predict``) with fp32 single and pair streams: the stacks' LayerNorms read fp32 and their
projections run in bf16. Two rules keep each op's backends in step there:

* **Lowered ops** (:data:`LOWERED`: ``linear``, ``linear_channel_first``, ``swiglu``,
  ``triangle_projection``, whose reference starts with a matrix product of its inputs): under
  autocast on the inputs' device, the dispatcher casts every floating input that is not fp64
  to the autocast dtype before any backend runs (:func:`lower`), as ``torch.library``'s autocast
  registration does for a custom op. A backend then sees the dtypes it serves, and the reference
  computes what autocast's matrix product computes; the op's elementwise tail (a bias, a gate)
  runs in the autocast dtype too, as F.linear's bias does under autocast.
* **A LayerNorm that feeds projections** (``layer_norm_fork``, ``layer_norm_pair_bias``,
  ``adaptive_layer_norm``): under autocast its ``y`` outputs are in the autocast dtype
  (:func:`projection_dtype`). Its readers are projections that autocast would cast y for, so
  the values the model computes do not change; y is stored at half the bytes and its readers'
  kernels take it as it is. (One reader is not a projection: the atom transformer's key
  AdaLN with ``key_norm="query"`` normalises the query AdaLN's y again, now from its bf16
  rounding.) ``layer_norm`` keeps PyTorch's rule (y in fp32 for fp32 x).

Outside autocast (and for fp64, the tests' ground truth) nothing changes.
"""

from __future__ import annotations

import torch

from fold_ops.weight_casts import cast_weight

__all__ = ["LOWERED", "autocast_dtype", "projection_dtype", "lower"]

LOWERED = frozenset({"linear", "linear_channel_first", "swiglu", "triangle_projection"})


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast gives a matrix product on ``x``'s device type, or None when autocast
    is off there."""
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def projection_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a LayerNorm output ``y`` of ``x`` that only projections read: the autocast
    dtype under autocast (fp64 excepted), else x's dtype."""
    dtype = autocast_dtype(x) if x.dtype != torch.float64 else None
    return x.dtype if dtype is None else dtype


def _needs_cast(a, dtype: torch.dtype) -> bool:
    return (isinstance(a, torch.Tensor) and a.dtype != dtype and a.is_floating_point()
            and a.dtype != torch.float64)


def lower(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of a lowered op's call with its floating tensors (fp64 aside) in the
    autocast dtype of the first tensor's device, or the same objects when autocast is off
    there or nothing needs a cast (a host-side check per call: every op's first argument is
    its data tensor)."""
    first = args[0] if args else None
    if not isinstance(first, torch.Tensor):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None:
            return args, kwargs
    kind = first.device.type
    if not torch.is_autocast_enabled(kind):
        return args, kwargs
    dtype = torch.get_autocast_dtype(kind)
    if not (any(_needs_cast(a, dtype) for a in args)
            or any(_needs_cast(v, dtype) for v in kwargs.values())):
        return args, kwargs
    return (tuple(_cast(a, dtype) if _needs_cast(a, dtype) else a for a in args),
            {k: _cast(v, dtype) if _needs_cast(v, dtype) else v for k, v in kwargs.items()})


def _cast(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a`` in ``dtype``: a parameter's cast from the active :class:`WeightCasts` (a
    prediction's: made once, not per call) where it may be served."""
    if isinstance(a, torch.nn.Parameter):
        a = cast_weight(a)
    return a if a.dtype == dtype else a.to(dtype)
