"""A residual whose update ends in a projection, added by the projection's GEMM (inference).

``x + h @ W^T`` as two ops writes the update (a pair-sized tensor), then reads it back with x and
writes the sum. With x as the GEMM's ``C`` operand (``addmm(x, h, W^T, out=x)``, beta = 1) the
GEMM reads x once and writes the sum into x's storage: on one H200 at 768^2 pair rows (h
``[*, 512]`` bf16, x ``[*, 128]`` fp32) 317 us against 453 us for the two ops
(``benchmarks/results/tools/addmm_residual_h200.md``). Out of place (a new tensor for the sum)
the GEMM gained nothing there: the sum goes into x itself, so only where no other reader of x is
left, i.e. in inference on a stream the block made (see :func:`residual_gemm`).

With an fp32 x under bf16 autocast the GEMM adds its fp32 accumulator into x (cuBLAS with an
fp32 ``C``: ``addmm(..., out_dtype=float32)``, CUDA only), where the two ops add the update's
bf16 rounding: the sum is closer to the exact one, by up to the update's bf16 rounding.

``FOLD_RESIDUAL_GEMM=0`` takes the two ops (for comparisons).
"""

from __future__ import annotations

import torch
from fold_ops.env import EnvVar
from fold_ops.tracing import fx_tracing
from fold_ops.weight_casts import cast_weight

__all__ = ["add_matmul_", "residual_gemm"]

_ENABLED = EnvVar("FOLD_RESIDUAL_GEMM", lambda v: (v if v is not None else "1") != "0")
_HALF = (torch.bfloat16, torch.float16)
# the fp32-C GEMM (addmm with out_dtype) was refused on this machine (a BLAS without it): the
# update is then added in place, as on the CPU
_FP32_C: dict[torch.device, bool] = {}


def residual_gemm(x: torch.Tensor, training: bool) -> bool:
    """Whether a residual's projection may add into ``x`` in place (:func:`add_matmul_`):
    inference (no autograd, not training, not traced or compiled) and x one dense tensor. The
    caller vouches that no one else reads x afterwards (x is a stream its own block made)."""
    # traced or compiled first: x may be an fx proxy, whose is_contiguous() is no bool
    return (_ENABLED.get() and not training and not torch.is_grad_enabled()
            and not fx_tracing() and not torch.compiler.is_compiling() and x.is_contiguous())


def add_matmul_(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x += h @ weight^T`` in x's storage; returns x. ``x [*, C_out]`` contiguous,
    ``h [*, C_in]``, ``weight [C_out, C_in]`` (a bias-free projection). The product runs in h's
    dtype (under autocast h is already in the autocast dtype; the weight is cast as F.linear's
    would be, from the predictor's casts where they are kept)."""
    x2 = x.view(-1, x.shape[-1])  # [R, C_out]
    h2 = h.reshape(-1, h.shape[-1])  # [R, C_in]
    w = cast_weight(weight)
    wt = (w if w.dtype == h2.dtype else w.to(h2.dtype)).t()  # [C_in, C_out]
    with torch.autocast(x.device.type, enabled=False):  # the dtypes are set here
        if x2.dtype == h2.dtype:
            torch.addmm(x2, h2, wt, out=x2)
        elif (x2.is_cuda and x2.dtype == torch.float32 and h2.dtype in _HALF
              and _FP32_C.get(x2.device, True)):
            try:
                torch.addmm(x2, h2, wt, out_dtype=torch.float32, out=x2)
            except (RuntimeError, NotImplementedError):  # before x is written: add it instead
                _FP32_C[x2.device] = False
                x2.add_(h2 @ wt)
        else:  # no mixed-dtype GEMM here (CPU): the update in h's dtype, added in place
            x2.add_(h2 @ wt)
    return x
