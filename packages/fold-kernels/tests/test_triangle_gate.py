"""The fused gated projections of triangle multiplication vs a float64 reference.

Odd sizes (I, J and c not multiples of any block), masks with holes (bool and float, shared by
the batch or per entry), projections with permuted batch strides (what the channel-first einsum
returns for several templates) and output gradients arriving transposed (the incoming update's
``a.mT @ b``). The bias gradient (one fp32 partial row per batch entry and tile, summed in a
fixed order) is checked over several tiles and batch entries, in fp32 and bf16. Tolerances as
for the other elementwise kernels: fp32 1e-6, bf16 8e-3 (one rounding of each output; the bias
gradient sums over I x J in fp32 before one rounding).
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(lead, c, n_i, n_j, *, mask_lead, bool_mask, seed):
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(*lead, 4 * c, n_i, n_j, generator=g)
    bias = torch.randn(4 * c, generator=g)
    mask = torch.rand(*mask_lead, n_i, n_j, generator=g) > 0.3  # holes
    return proj, bias, mask if bool_mask else mask.float()


def _check(proj, bias, mask, dtype, transpose_grads=False, bias_dtype=torch.float32):
    p = proj.to(dtype).to(DEVICE).clone().requires_grad_()
    # fp32 by default, as the model's parameters under autocast
    b = bias.to(bias_dtype).to(DEVICE).clone().requires_grad_()
    a_out, b_out = fk.triangle_projection_gate(p, b, mask.to(DEVICE))
    assert a_out.dtype == dtype and a_out.shape == proj.shape[:-3] + (proj.shape[-3] // 4,
                                                                     *proj.shape[-2:])
    g = torch.Generator().manual_seed(5)
    da, db = (torch.randn(a_out.shape, generator=g).to(dtype) for _ in range(2))
    if transpose_grads:  # gradients as a transposed view: read through their strides
        da = da.mT.contiguous().mT
        assert not da.is_contiguous()
    torch.autograd.backward((a_out, b_out), (da.to(DEVICE), db.to(DEVICE)))

    p64 = proj.to(dtype).double().requires_grad_()
    b64 = bias.to(bias_dtype).double().requires_grad_()
    m64 = mask.double() if mask.is_floating_point() else mask
    ra, rb = ref.triangle_projection_gate(p64, b64, m64)
    torch.autograd.backward((ra, rb), (da.double(), db.double()))
    tol = TOL[dtype]
    assert rel_err(a_out, ra) < tol and rel_err(b_out, rb) < tol
    assert rel_err(p.grad, p64.grad) < tol
    assert b.grad.dtype == bias_dtype and rel_err(b.grad, b64.grad) < TOL[bias_dtype]
    return b.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_odd_sizes(dtype):
    proj, bias, mask = _inputs((1,), 3, 7, 11, mask_lead=(1,), bool_mask=True, seed=1)
    _check(proj, bias, mask, dtype)


def test_batch_dims_shared_float_mask_and_transposed_gradients():
    proj, bias, mask = _inputs((2, 3), 5, 9, 6, mask_lead=(), bool_mask=False, seed=2)
    _check(proj, bias, mask, torch.float32, transpose_grads=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gradient_over_many_tiles_and_batch_entries(dtype):
    """The bias gradient's partial rows: several tiles in I and in J (odd sizes, partial edge
    tiles), three batch entries under one broadcast mask; the same bits on a second call."""
    proj, bias, mask = _inputs((3,), 3, 13, 19, mask_lead=(1,), bool_mask=True, seed=6)
    first = _check(proj, bias, mask, dtype, bias_dtype=dtype)
    assert torch.equal(first, _check(proj, bias, mask, dtype, bias_dtype=dtype))


def test_bias_without_gradient():
    """Only proj needs a gradient: the kernel skips the partial sums."""
    proj, bias, mask = _inputs((2,), 2, 9, 10, mask_lead=(), bool_mask=False, seed=7)
    p = proj.to(DEVICE).clone().requires_grad_()
    a_out, b_out = fk.triangle_projection_gate(p, bias.to(DEVICE), mask.to(DEVICE))
    (a_out.square().sum() + b_out.sum()).backward()
    p64 = proj.double().requires_grad_()
    ra, rb = ref.triangle_projection_gate(p64, bias.double(), mask.double())
    (ra.square().sum() + rb.sum()).backward()
    assert rel_err(p.grad, p64.grad) < 1e-6


def test_permuted_batch_strides_and_per_entry_mask():
    # the einsum "oc,...ijc->...oij" over 3 templates returns [T, 4c, I, J] with the channel
    # dim outermost in memory
    g = torch.Generator().manual_seed(3)
    proj = torch.randn(8, 3, 5, 7, generator=g).permute(1, 0, 2, 3)  # [3, 8, 5, 7] view
    assert not proj.is_contiguous()
    bias = torch.randn(8, generator=g)
    mask = torch.rand(3, 5, 7, generator=g) > 0.4
    p = proj.to(DEVICE).clone().requires_grad_()
    a_out, b_out = fk.triangle_projection_gate(p, bias.to(DEVICE), mask.to(DEVICE))
    (a_out.square().sum() + b_out.sum()).backward()
    p64 = proj.double().requires_grad_()
    ra, rb = ref.triangle_projection_gate(p64, bias.double(), mask)
    (ra.square().sum() + rb.sum()).backward()
    assert rel_err(a_out, ra) < 1e-6 and rel_err(b_out, rb) < 1e-6
    assert rel_err(p.grad, p64.grad) < 1e-6


def test_masked_pairs_give_zero_and_no_gradient():
    proj, bias, mask = _inputs((1,), 2, 5, 5, mask_lead=(1,), bool_mask=True, seed=4)
    p = proj.to(DEVICE).clone().requires_grad_()
    a_out, b_out = fk.triangle_projection_gate(p, bias.to(DEVICE), mask.to(DEVICE))
    (a_out.sum() + b_out.sum()).backward()
    hole = ~mask.to(DEVICE).unsqueeze(-3).expand_as(a_out)
    assert (a_out[hole] == 0).all() and (b_out[hole] == 0).all()
    assert (p.grad[~mask.to(DEVICE).unsqueeze(-3).expand_as(p)] == 0).all()


def test_bad_shapes_are_rejected():
    proj = torch.randn(1, 6, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match="4c"):
        fk.triangle_projection_gate(proj, torch.randn(6, device=DEVICE),
                                    torch.ones(1, 3, 3, device=DEVICE))
    proj = torch.randn(1, 8, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match="bias"):
        fk.triangle_projection_gate(proj, torch.randn(4, device=DEVICE),
                                    torch.ones(1, 3, 3, device=DEVICE))
    with pytest.raises(ValueError, match="mask"):
        fk.triangle_projection_gate(proj, torch.randn(8, device=DEVICE),
                                    torch.ones(1, 3, 4, device=DEVICE))
