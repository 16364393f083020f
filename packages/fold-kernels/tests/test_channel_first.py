"""``linear_channel_first`` (triangle multiplication's projections) vs a float64 einsum.

Odd sizes, batch dims (), (1,), (2,), (2, 3), a non-contiguous input and an output gradient in
another layout than the forward's. What the op exists for is checked explicitly: ``d(x)`` comes
back contiguous, i.e. in x's channel-last layout (the einsum's backward returns it
channel-first). Tolerances: fp32 1e-5 (sums of C and of M products), bf16 1e-2 (one rounding of
each output).
"""

from __future__ import annotations

import pytest
import torch
from fold_kernels import linear_channel_first
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
I, J, C, O = 5, 7, 6, 12


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "NaN/inf in the op's result"
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(lead: tuple[int, ...], seed: int):
    """float64 ``x [*lead, I, J, C]``, ``weight [O, C]``, ``dy [*lead, O, I, J]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, I, J, C, generator=g, dtype=torch.float64)
    w = torch.randn(O, C, generator=g, dtype=torch.float64) / C**0.5
    dy = torch.randn(*lead, O, I, J, generator=g, dtype=torch.float64)
    return x, w, dy


def _reference(x, w, dy):
    """Output and gradients of the float64 einsum at the given (rounded) inputs."""
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y = ref.linear_channel_first(x64, w64)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad


def _run(x, w, dy):
    """The op on DEVICE: ``(y, dx, dw)``. ``autograd.grad``, not ``.grad``: accumulating into
    a leaf's ``.grad`` would copy the gradient to the leaf's layout and hide the op's."""
    xd = x.to(DEVICE).clone().requires_grad_()
    wd = w.to(DEVICE).clone().requires_grad_()
    y = linear_channel_first(xd, wd)
    dx, dw = torch.autograd.grad(y, (xd, wd), dy.to(DEVICE))
    return y, dx, dw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead", [(), (1,), (2,), (2, 3)])
def test_matches_float64_einsum(lead, dtype):
    x64, w64, dy64 = _inputs(lead, seed=len(lead) * 10 + sum(lead))
    x, w, dy = x64.to(dtype), w64.to(dtype), dy64.to(dtype)
    y, dx, dw = _run(x, w, dy)
    ry, rdx, rdw = _reference(x, w, dy)
    assert y.shape == (*lead, O, I, J) and y.dtype == dtype
    assert dx.shape == x.shape and dx.dtype == dtype and dw.shape == (O, C) and dw.dtype == dtype
    tol = TOL[dtype]
    assert rel_err(y, ry) < tol
    assert rel_err(dx, rdx) < tol
    assert rel_err(dw, rdw) < tol


@pytest.mark.parametrize("lead", [(), (1,), (2,), (2, 3)])
def test_input_gradient_is_channel_last(lead):
    """The point of the op: d(x) contiguous like x, where the einsum's has C stride I * J."""
    x, w, dy = (t.float() for t in _inputs(lead, seed=7))
    _, dx, _ = _run(x, w, dy)
    assert dx.is_contiguous() and dx.stride(-1) == 1
    x_e = x.clone().requires_grad_()
    (dx_e,) = torch.autograd.grad(torch.einsum("oc,...ijc->...oij", w, x_e), x_e, dy)
    assert dx_e.stride(-1) != 1  # the layout the op avoids (else this test shows nothing)


def test_single_batch_output_is_contiguous_channel_first():
    x, w, _ = (t.float() for t in _inputs((1,), seed=3))
    y = linear_channel_first(x.to(DEVICE), w.to(DEVICE))
    assert y.is_contiguous()  # the standard [1, O, I, J] layout


def test_non_contiguous_input_and_contiguous_output_gradient():
    """x a transposed view (made contiguous inside); dy in the standard [B, O, I, J] layout,
    not the forward's [O, B, I, J] memory order (the backward copies it)."""
    x64, w64, dy64 = _inputs((2,), seed=11)
    x = x64.float().transpose(-2, -3).contiguous().transpose(-2, -3)  # [2, I, J, C], strided
    assert not x.is_contiguous()
    dy = dy64.float().contiguous()
    y, dx, dw = _run(x, w64.float(), dy)
    ry, rdx, rdw = _reference(x, w64.float(), dy)
    assert rel_err(y, ry) < 1e-5 and rel_err(dx, rdx) < 1e-5 and rel_err(dw, rdw) < 1e-5
    assert dx.is_contiguous()


def test_only_weight_gradient_and_nan_propagates():
    x, w, dy = (t.float() for t in _inputs((2,), seed=13))
    wd = w.to(DEVICE).clone().requires_grad_()
    linear_channel_first(x.to(DEVICE), wd).backward(dy.to(DEVICE))  # x needs no gradient
    assert rel_err(wd.grad, _reference(x, w, dy)[2]) < 1e-5
    x[1, 2, 3, 4] = float("nan")
    y = linear_channel_first(x.to(DEVICE), w.to(DEVICE)).cpu()
    assert y[1, :, 2, 3].isnan().all()  # the NaN row reaches every output channel ...
    assert torch.isfinite(y[0]).all()  # ... and nothing else


def test_bad_shapes_and_dtypes_are_rejected():
    x = torch.randn(2, 3, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must be \[O, C=4\]"):
        linear_channel_first(x, torch.randn(5, 3, device=DEVICE))
    with pytest.raises(ValueError, match=r"weight must be \[O, C=4\]"):
        linear_channel_first(x, torch.randn(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"x must be \[\*, I, J, C\]"):
        linear_channel_first(torch.randn(3, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE))
    with pytest.raises(ValueError, match="share a dtype"):
        linear_channel_first(x, torch.randn(5, 4, device=DEVICE, dtype=torch.bfloat16))
