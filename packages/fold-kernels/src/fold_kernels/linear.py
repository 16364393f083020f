"""Linear layer whose backward computes the bias gradient with a fast deterministic column sum.

The forward is ``F.linear`` (cuBLAS, the bias added in the GEMM's epilogue) and the two matrix
products of the backward are cuBLAS too; what changes is ``dbias = dy.sum(rows)``. Autograd
computes it with PyTorch's generic reduction, which sums the outer dim of ``[N_res * N_res, c]``
tensors at about a tenth of the memory bandwidth: 27 such sums took 1.5 ms of an Evoformer
block's 11.5 ms forward + backward on an H100. :func:`fold_kernels.reduce.column_sum` reads
``dy`` once at near bandwidth.

The input is saved as it came (a view, no copy; PyTorch's matmul path keeps a folded copy of a
non-contiguous input) and flattened to ``[M, K]`` in the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fold_kernels import nograd, tuning
from fold_kernels.reduce import column_sum

__all__ = ["linear"]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = bias.dtype
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        n_out, k = weight.shape
        dy2 = dy.reshape(-1, n_out)  # [M, N_out]; a view when dy is dense
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = dy2.mm(weight).reshape(x.shape)  # [M, K] -> [*, K]
        if ctx.needs_input_grad[1]:
            dw = dy2.t().mm(x.reshape(-1, k))  # [N_out, K]
        if ctx.needs_input_grad[2]:
            db = column_sum(dy2, ctx.bias_dtype)  # [N_out]
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x ``[*, K]``, weight ``[N_out, K]``, bias ``[N_out]``, all
    of one dtype. Without a bias there is nothing to speed up: ``F.linear`` itself."""
    if bias is None:
        return F.linear(x, weight)
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: weight must be [N_out, K={x.shape[-1]}], got "
                         f"{tuple(weight.shape)}")
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if x.dtype != weight.dtype or bias.dtype != weight.dtype:
        raise ValueError(f"linear: x, weight and bias must share a dtype, got {x.dtype}, "
                         f"{weight.dtype}, {bias.dtype}")
    tuning.require_device("linear", x, "torch.nn.functional.linear")
    return nograd.apply(_Linear, x, weight, bias)
