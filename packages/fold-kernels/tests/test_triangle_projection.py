"""Triangle multiplication's projection GEMM with the gate in its epilogue vs float64.

``triangle_projection(z, W, bias, mask)`` against ``triangle_projection_gate(
linear_channel_first(z, W), bias, mask)`` in float64. Without autograd (the fused kernel): odd
sizes (I, J, c and C_z multiples of no tile), masks with holes and fully masked rows (bool and
float, shared by the batch or per entry), several batch dims, a z that is a row slice (copied),
a bias in fp32 or the inputs' dtype. With autograd (the two ops): values and the gradients of z,
W and the bias. Tolerances: fp32 2e-5 (sums over C_z of fp32 products); bf16 1e-2 (bf16
operands and outputs, fp32 accumulation).
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(lead, n_i, n_j, k, c, *, mask_lead, bool_mask, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*lead, n_i, n_j, k, generator=g)
    w = torch.randn(4 * c, k, generator=g) / k**0.5
    bias = torch.randn(4 * c, generator=g)
    mask = torch.rand(*mask_lead, n_i, n_j, generator=g) > 0.3  # holes
    mask[..., 1, :] = False  # a fully masked row
    return z, w, bias, mask if bool_mask else mask.float()


def _reference(z, w, bias, mask, dtype, bias_dtype):
    m64 = mask.double() if mask.is_floating_point() else mask
    return ref.triangle_projection(z.to(dtype).double(), w.to(dtype).double(),
                                   bias.to(bias_dtype).double(), m64)


def _forward(z, w, bias, mask, dtype, bias_dtype=torch.float32, view=None):
    zd = z.to(dtype).to(DEVICE)
    with torch.no_grad():
        a_out, b_out = fk.triangle_projection(zd if view is None else view(zd),
                                              w.to(dtype).to(DEVICE),
                                              bias.to(bias_dtype).to(DEVICE), mask.to(DEVICE))
    ra, rb = _reference(z if view is None else view(z), w, bias, mask, dtype, bias_dtype)
    assert a_out.shape == ra.shape and b_out.shape == rb.shape and a_out.dtype == dtype
    assert a_out.is_contiguous() and b_out.is_contiguous()
    tol = TOL[dtype]
    assert rel_err(a_out, ra) < tol and rel_err(b_out, rb) < tol
    return a_out, b_out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead,mask_lead,bool_mask", [((1,), (1,), True), ((2,), (), False),
                                                      ((2, 3), (3,), True)])
def test_fused_forward_against_float64(dtype, lead, mask_lead, bool_mask):
    z, w, bias, mask = _inputs(lead, 7, 5, 37, 6, mask_lead=mask_lead, bool_mask=bool_mask,
                               seed=len(lead) + bool_mask)
    _forward(z, w, bias, mask, dtype)


def test_bias_in_the_inputs_dtype_and_a_row_slice_of_z():
    """A bf16 bias (the model's parameters cast to bf16) and z a row slice of a larger pair
    (AutoChunk's chunks: not contiguous, copied first)."""
    z, w, bias, mask = _inputs((1,), 12, 13, 24, 9, mask_lead=(1,), bool_mask=True, seed=9)
    _forward(z, w, bias, mask[:, 3:8], torch.bfloat16, bias_dtype=torch.bfloat16,
             view=lambda t: t[:, 3:8])


def test_masked_pairs_give_zero():
    z, w, bias, mask = _inputs((1,), 5, 6, 16, 2, mask_lead=(1,), bool_mask=True, seed=10)
    a_out, b_out = _forward(z, w, bias, mask, torch.float32)
    hole = ~mask.to(DEVICE)
    assert (a_out.movedim(-3, -1)[hole] == 0).all() and (b_out.movedim(-3, -1)[hole] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_path_against_float64(dtype):
    """With autograd the op is the two ops: values and every gradient, d(z) channel-last."""
    z, w, bias, mask = _inputs((2,), 9, 11, 20, 5, mask_lead=(2,), bool_mask=True, seed=7)
    zd, wd = (t.to(dtype).to(DEVICE).clone().requires_grad_() for t in (z, w))
    bd = bias.to(DEVICE).clone().requires_grad_()
    a_out, b_out = fk.triangle_projection(zd, wd, bd, mask.to(DEVICE))
    g = torch.Generator().manual_seed(5)
    da, db = (torch.randn(a_out.shape, generator=g).to(dtype) for _ in range(2))
    torch.autograd.backward((a_out, b_out), (da.to(DEVICE), db.to(DEVICE)))
    z64, w64, b64 = (t.to(dtype).double().requires_grad_() for t in (z, w, bias))
    ra, rb = ref.triangle_projection(z64, w64, b64, mask)
    torch.autograd.backward((ra, rb), (da.double(), db.double()))
    tol = TOL[dtype]
    assert rel_err(a_out, ra) < tol and rel_err(b_out, rb) < tol
    for t, r in ((zd, z64), (wd, w64), (bd, b64)):
        assert rel_err(t.grad, r.grad) < tol
    assert zd.grad.is_contiguous()


def test_the_two_op_path_for_comparisons(monkeypatch):
    """``FOLD_KERNELS_TRI_PROJ=0``: the GEMM and the gate kernel without autograd too."""
    monkeypatch.setenv("FOLD_KERNELS_TRI_PROJ", "0")
    z, w, bias, mask = _inputs((1,), 7, 5, 19, 3, mask_lead=(1,), bool_mask=True, seed=11)
    _forward(z, w, bias, mask, torch.float32)


def test_bad_shapes_are_rejected():
    z = torch.randn(1, 3, 3, 8, device=DEVICE)
    ones = torch.ones(1, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match="4c"):
        fk.triangle_projection(z, torch.randn(6, 8, device=DEVICE), torch.randn(6), ones)
    with pytest.raises(ValueError, match="C=8"):
        fk.triangle_projection(z, torch.randn(8, 7, device=DEVICE), torch.randn(8), ones)
    with pytest.raises(ValueError, match="bias"):
        fk.triangle_projection(z, torch.randn(8, 8, device=DEVICE),
                               torch.randn(4, device=DEVICE), ones)
    with pytest.raises(ValueError, match="mask"):
        fk.triangle_projection(z, torch.randn(8, 8, device=DEVICE),
                               torch.randn(8, device=DEVICE), torch.ones(1, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[\*, I, J, C\]"):
        fk.triangle_projection(torch.randn(3, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE),
                               torch.randn(8, device=DEVICE), torch.ones(3, device=DEVICE))
