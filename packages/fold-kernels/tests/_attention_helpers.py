"""What EvoAttention's tests share: the device, the dtype tolerances and the error measure.

Tolerances are relative Frobenius norms set by the dtype: fp32 products are exact ("ieee"), so
1e-5; bf16 (8-bit mantissa, eps 3.9e-3) rounds q, k, v, then p and dS again before two more
products: 2.5e-2; fp16 (eps 4.9e-4): 4e-3.
"""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.5e-2, torch.float16: 4e-3}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in float64; NaN or inf in ``a`` fails."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
