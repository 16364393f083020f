"""Second stage of the deterministic two-stage reductions: sum fp32 partials over their first
dim, in a fixed order, and store the result directly in the parameter's dtype.

The LayerNorm backward (weight and bias gradients) and EvoAttention's bias gradient (split over
rows) write one fp32 partial sum per program; ``torch.sum(0)`` then ``.to(dtype)`` would be two
more launches (a reduction and a cast copy) per gradient. Here it is one launch for both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import tuning

__all__ = ["sum_partials"]


@triton.jit
def _sum_partials(P, Out, S, M, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < M
    acc = tl.zeros([BLOCK], tl.float32)
    ptrs = P + offs  # pointer arithmetic is 64-bit: no overflow for S * M >= 2**31
    for _ in range(0, S):  # fixed order: deterministic
        acc += tl.load(ptrs, mask=valid, other=0.0)
        ptrs += M
    tl.store(Out + offs, acc.to(Out.dtype.element_ty), mask=valid)


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``partials [S, *shape]`` fp32 (contiguous) -> ``sum(0)`` of shape ``shape`` in ``dtype``."""
    if partials.shape[0] == 1 and partials.dtype == dtype:
        return partials[0]
    s = partials.shape[0]
    m = partials[0].numel()
    out = torch.empty(partials.shape[1:], device=partials.device, dtype=dtype)
    block = 64 if tuning.interpreting() else 1024
    _sum_partials[(triton.cdiv(m, block),)](partials, out, s, m, BLOCK=block,
                                            num_warps=1 if tuning.interpreting() else 4)
    return out
