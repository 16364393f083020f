"""LayerNorm, fused LayerNorm+Linear and SwiGLU vs float64 references (outputs, all grads).

Tolerances (relative Frobenius norm): fp32 1e-5 (exact fp32 products); bf16 1.5e-2 (y and the
normalized activations are rounded to bf16, eps 3.9e-3, before a product); fp16 3e-3.
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _run(fn, ref_fn, tensors, dtype, seed=1):
    ins = [t.to(dtype).to(DEVICE).clone().requires_grad_() if t is not None else None
           for t in tensors]
    y = fn(*ins)
    assert y.dtype == dtype
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    y.backward(dy.to(DEVICE))
    ref_ins = [t.to(dtype).double().clone().requires_grad_() if t is not None else None
               for t in tensors]
    y_ref = ref_fn(*ref_ins)
    y_ref.backward(dy.double())
    tol = TOL[dtype]
    assert rel_err(y, y_ref) < tol
    for i, (a, b) in enumerate(zip(ins, ref_ins)):
        if a is not None:
            assert rel_err(a.grad, b.grad) < tol, f"grad of input {i}"


def _rand(*shape, seed, scale=1.0, shift=0.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale + shift


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [64, 72, 128])
def test_layer_norm(dtype, c):
    # rows not a multiple of the rows per program; a mean far from 0 tests the statistics
    x = _rand(3, 11, c, seed=c, scale=2.0, shift=3.0)
    _run(fk.layer_norm, ref.layer_norm, [x, _rand(c, seed=1), _rand(c, seed=2)], dtype)


def test_layer_norm_fp32_weight_with_bf16_input():
    x = _rand(7, 40, seed=3).to(torch.bfloat16).to(DEVICE)
    w, b = _rand(40, seed=4).to(DEVICE), _rand(40, seed=5).to(DEVICE)
    y = fk.layer_norm(x, w, b)
    assert y.dtype == torch.bfloat16
    y_ref = ref.layer_norm(x.double().cpu(), w.double().cpu(), b.double().cpu())
    assert rel_err(y, y_ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_linear(dtype, bias):
    k, n_out = 40, 37
    x = _rand(2, 9, k, seed=6, scale=1.5, shift=-2.0)
    w = _rand(n_out, k, seed=7, scale=k**-0.5)
    tensors = [x, _rand(k, seed=8), _rand(k, seed=9), w, _rand(n_out, seed=10) if bias else None]
    _run(fk.layer_norm_linear, ref.layer_norm_linear, tensors, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_swiglu(dtype, bias):
    k, h = 36, 19
    tensors = [_rand(2, 7, k, seed=11), _rand(2 * h, k, seed=12, scale=k**-0.5),
               _rand(2 * h, seed=13) if bias else None]
    _run(fk.swiglu, ref.swiglu, tensors, dtype)


def test_bad_shapes_are_rejected():
    x = torch.randn(4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="weight and bias must be"):
        fk.layer_norm(x, torch.ones(15, device=DEVICE), torch.zeros(16, device=DEVICE))
    with pytest.raises(ValueError, match="weight must be"):
        fk.layer_norm_linear(x, torch.ones(16, device=DEVICE), torch.zeros(16, device=DEVICE),
                             torch.randn(8, 15, device=DEVICE))
    with pytest.raises(ValueError, match="2 H"):
        fk.swiglu(x, torch.randn(7, 16, device=DEVICE))
