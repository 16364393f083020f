"""AF3's adaptive LayerNorm (``sigmoid(gate) * LayerNorm(a) + shift``) vs a float64 reference.

Odd hidden sizes (a partial column block) and row counts (a partial row block), each dtype,
non-contiguous inputs and output gradients (copied before the kernels read them), inputs of
very different scales per row, and every gradient (a, gate, shift). Tolerances: fp32 2e-6 (a
row's mean and variance accumulate in fp32), bf16 / fp16 1e-2 and 2e-3 (one rounding of each
output from fp32).
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(shape, seed, row_scale=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g) * 3.0 + 0.5
    if row_scale:  # rows of very different scale and offset: the statistics per row (an
        # offset / spread of up to ~20: fp32's rounding of x - mean stays near 1e-6 relative)
        rows = shape[-2]
        a = a * torch.logspace(-1, 2, rows)[:, None] + torch.linspace(-5, 5, rows)[:, None]
    gate = torch.randn(*shape, generator=g) * 2.0
    shift = torch.randn(*shape, generator=g)
    dy = torch.randn(*shape, generator=g)
    return a, gate, shift, dy


def _check(a, gate, shift, dy, dtype, eps=1e-5, transform=None):
    """The kernel (inputs in ``dtype``, optionally made non-contiguous by ``transform``)
    against the float64 reference on the same rounded inputs."""
    leaves = [t.to(dtype).to(DEVICE).clone().requires_grad_() for t in (a, gate, shift)]
    args = [transform(t) if transform else t for t in leaves]
    g_out = transform(dy.to(dtype).to(DEVICE)) if transform else dy.to(dtype).to(DEVICE)
    y = fk.adaptive_layer_norm(*args, eps)
    assert y.dtype == dtype and y.shape == args[0].shape
    y.backward(g_out)

    leaves64 = [t.to(dtype).double().clone().requires_grad_() for t in (a, gate, shift)]
    args64 = [transform(t) if transform else t for t in leaves64]
    dy64 = dy.to(dtype).double()
    y64 = ref.adaptive_layer_norm(*args64, eps)
    y64.backward(transform(dy64) if transform else dy64)
    tol = TOL[dtype]
    assert rel_err(y, y64) < tol
    for got, want in zip(leaves, leaves64):
        assert got.grad is not None and rel_err(got.grad, want.grad) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 37), (1, 5, 96), (2, 130)])
def test_matches_float64_reference(shape, dtype):
    _check(*_inputs(shape, seed=sum(shape)), dtype)


def test_rows_of_different_scales_and_large_eps():
    a, gate, shift, dy = _inputs((9, 48), seed=3, row_scale=True)
    _check(a, gate, shift, dy, torch.float32)
    _check(a, gate, shift, dy, torch.float32, eps=1e-2)


def test_constant_rows_are_finite():
    """A row with zero variance normalises to 0 (1/sqrt(eps) times 0): y = shift, and the
    gradients stay finite."""
    a, gate, shift, dy = _inputs((4, 33), seed=4)
    a[1] = 7.25
    _check(a, gate, shift, dy, torch.float32)


def test_non_contiguous_inputs_and_gradient():
    a, gate, shift, dy = _inputs((6, 5, 40), seed=5)
    _check(a, gate, shift, dy, torch.float32, transform=lambda t: t.transpose(0, 1))


def test_shift_gradient_is_the_output_gradient_and_empty_input():
    a, gate, shift, dy = (t.to(DEVICE).clone().requires_grad_() if i < 3 else t.to(DEVICE)
                          for i, t in enumerate(_inputs((2, 3, 24), seed=6)))
    fk.adaptive_layer_norm(a, gate, shift).backward(dy)
    assert torch.equal(shift.grad, dy)
    empty = [torch.zeros(0, 8, device=DEVICE, requires_grad=True) for _ in range(3)]
    out = fk.adaptive_layer_norm(*empty)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == (0, 8) for t in empty)


def test_bad_inputs_are_refused_with_the_reason():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="gate and shift must have a's shape"):
        fk.adaptive_layer_norm(x, x[:1], x)
    with pytest.raises(ValueError, match="share a dtype"):
        fk.adaptive_layer_norm(x, x.double(), x)
    big = torch.empty(1, 8193, device=DEVICE)
    with pytest.raises(ValueError, match="hidden size"):
        fk.adaptive_layer_norm(big, big, big)


def test_inference_path_matches_the_autograd_path():
    """Without gradients the op skips autograd (no saved tensors): the same bits."""
    a, gate, shift, _ = (t.to(DEVICE) for t in _inputs((3, 5, 40), seed=7))
    with torch.no_grad():
        y = fk.adaptive_layer_norm(a, gate, shift)
    assert y.grad_fn is None
    a.requires_grad_()
    assert torch.equal(y, fk.adaptive_layer_norm(a, gate, shift).detach())
