"""``tl.dot`` as every fold-kernels kernel calls it, and the precision a launch asks for.

Triton's CPU interpreter computes bf16/fp16 dots wrongly (about 1e10 off for a 16 x 16 bf16
product, Triton 3.6-3.9), so under ``TRITON_INTERPRET=1`` the operands are upcast first; the
rounding of the operands to their dtype is kept (they are cast before the call)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import tuning

__all__ = ["mm", "precision"]


@triton.jit
def mm(a, b, PRECISION: tl.constexpr):
    """``tl.dot(a, b)`` with fp32 accumulation; ``PRECISION`` from :func:`precision`."""
    if PRECISION == "interp":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


def precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products (1e-5 agreement); half types use the tensor cores;
    ``"interp"`` under the interpreter."""
    if tuning.interpreting():
        return "interp"
    return "ieee" if dtype == torch.float32 else "tf32"
