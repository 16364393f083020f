"""Channel-first projection ``y [*, O, I, J] = W x^T`` of a channel-last ``x [*, I, J, C]``
whose backward returns ``d(x)`` channel-last.

Triangle multiplication computes its four projections channel-first in one GEMM (the sum over k
is then a batched matrix product per channel with no layout copy). Written as
``torch.einsum("oc,...ijc->...oij", weight, x)``, autograd's backward of the einsum returns
``d(x)`` with channel-first strides (C stride ``I * J``); adding it to the contiguous gradient
from the layer's other consumers of ``x`` runs in PyTorch's non-vectorized strided kernel (123 us
instead of ~26 us at N=384 on an H100, twice per block). Here both products are ``torch.mm``
(cuBLAS) on the rows of ``x`` flattened to ``[M, C]``: the forward writes ``[O, M]`` (the
channel-first layout) and the backward writes ``d(x)`` as a row-major ``[M, C]``, i.e. in
``x``'s own channel-last layout. No Triton kernel: the choice here is the layouts, not the math.
"""

from __future__ import annotations

import torch

from fold_kernels import nograd, tuning

__all__ = ["linear_channel_first"]


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [*, I, J, C]`` -> ``[M, C]``, M = prod(batch) * I * J (a view when x is dense)."""
    return x.reshape(-1, x.shape[-1])


class _LinearChannelFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        x = x if x.is_contiguous() else x.contiguous()  # reshape would copy anyway
        rows = _as_rows(x)  # [M, C]
        y2 = weight.mm(rows.t())  # [O, M]
        ctx.save_for_backward(rows, weight)
        ctx.x_shape = x.shape
        # [O, *batch, I, J] -> [*batch, O, I, J]: contiguous for one batch entry, else a view
        # with the O stride outermost (the consumers read strides)
        return y2.view(weight.shape[0], *x.shape[:-1]).movedim(0, -3)

    @staticmethod
    def backward(ctx, dy):
        rows, weight = ctx.saved_tensors
        # [*batch, O, I, J] -> [O, M]: a view when dy has the layout the forward produced
        dy2 = dy.movedim(-3, 0).reshape(weight.shape[0], -1)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = dy2.t().mm(weight).view(ctx.x_shape)  # row-major [M, C]: channel-last
        if ctx.needs_input_grad[1]:
            dw = dy2.mm(rows)  # [O, C]
        return dx, dw


def linear_channel_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``y[..., o, i, j] = sum_c weight[o, c] x[..., i, j, c]`` (no bias).

    Args:
        x: ``[*, I, J, C]`` (at least 3 dims), any strides.
        weight: ``[O, C]``, x's dtype.

    Returns:
        ``[*, O, I, J]`` in x's dtype: contiguous when ``prod(*) == 1``, else a view whose O dim
        is outermost in memory. Differentiable in x and weight; ``d(x)`` is contiguous.
    """
    if x.dim() < 3:
        raise ValueError(f"linear_channel_first: x must be [*, I, J, C] (3 dims or more), got "
                         f"shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"linear_channel_first: weight must be [O, C={x.shape[-1]}], got "
                         f"{tuple(weight.shape)}")
    if x.dtype != weight.dtype:
        raise ValueError(f"linear_channel_first: x and weight must share a dtype, got {x.dtype} "
                         f"and {weight.dtype}")
    tuning.require_device("linear_channel_first", x,
                          "fold_ops.reference.linear_channel_first")
    return nograd.apply(_LinearChannelFirst, x, weight)
