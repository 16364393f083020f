"""Triangle multiplication's projection GEMM with the gate in its epilogue vs float64.

``triangle_projection(z, W, bias, mask)`` against ``triangle_projection_gate(
linear_channel_first(z, W), bias, mask)`` in float64: outputs and the gradients of z, W and the
bias, with odd sizes (I, J, c and C_z multiples of no tile), masks with holes and fully masked
rows (bool and float, shared by the batch or per entry), several batch dims, a z that is a view
(AutoChunk's row slices), output gradients arriving transposed (the batched product's backward
returns one of d(a), d(b) I-fast) and one output unused. Tolerances: fp32 ~1e-5 (the GEMM's
sums over C_z); bf16 1e-2 (bf16 operands and outputs, fp32 accumulation).
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


def _check(z, w, bias, mask, dtype, *, bias_dtype=torch.float32, transpose=("a",),
           unused=None, view=None):
    zd = z.to(dtype).to(DEVICE).clone().requires_grad_()
    wd = w.to(dtype).to(DEVICE).clone().requires_grad_()
    bd = bias.to(bias_dtype).to(DEVICE).clone().requires_grad_()
    z_in = zd if view is None else view(zd)
    a_out, b_out = fk.triangle_projection(z_in, wd, bd, mask.to(DEVICE))
    shape = z_in.shape[:-3] + (w.shape[0] // 4, *z_in.shape[-3:-1])
    assert a_out.shape == shape and b_out.shape == shape and a_out.dtype == dtype
    g = torch.Generator().manual_seed(5)
    grads = {}
    for name in ("a", "b"):
        d = torch.randn(shape, generator=g).to(dtype)
        if name in transpose:  # an I-fast gradient, read through its strides
            d = d.mT.contiguous().mT
            assert not d.is_contiguous()
        grads[name] = d
    outs = [(o, grads[n]) for o, n in ((a_out, "a"), (b_out, "b")) if n != unused]
    torch.autograd.backward([o for o, _ in outs], [d.to(DEVICE) for _, d in outs])

    z64 = z.to(dtype).double().requires_grad_()
    w64 = w.to(dtype).double().requires_grad_()
    b64 = bias.to(bias_dtype).double().requires_grad_()
    m64 = mask.double() if mask.is_floating_point() else mask
    ra, rb = ref.triangle_projection(z64 if view is None else view(z64), w64, b64, m64)
    refs = [(o, grads[n]) for o, n in ((ra, "a"), (rb, "b")) if n != unused]
    torch.autograd.backward([o for o, _ in refs], [d.double() for _, d in refs])
    tol = TOL[dtype]
    assert rel_err(a_out, ra) < tol and rel_err(b_out, rb) < tol
    assert rel_err(zd.grad, z64.grad) < tol
    assert rel_err(wd.grad, w64.grad) < tol
    assert bd.grad.dtype == bias_dtype and rel_err(bd.grad, b64.grad) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead,mask_lead,bool_mask", [((1,), (1,), True), ((2,), (), False),
                                                      ((2, 3), (3,), True)])
def test_against_float64(dtype, lead, mask_lead, bool_mask):
    z, w, bias, mask = _inputs(lead, 7, 5, 37, 6, mask_lead=mask_lead, bool_mask=bool_mask,
                               seed=len(lead) + bool_mask)
    _check(z, w, bias, mask, dtype)


@pytest.mark.parametrize("transpose", [(), ("a",), ("b",), ("a", "b")])
def test_gradient_layouts(transpose):
    """Both directions' layouts: outgoing (d(b) I-fast), incoming (d(a) I-fast), both, none."""
    z, w, bias, mask = _inputs((2,), 9, 11, 20, 5, mask_lead=(2,), bool_mask=True, seed=7)
    _check(z, w, bias, mask, torch.float32, transpose=transpose)


@pytest.mark.parametrize("unused", ["a", "b"])
def test_one_output_unused(unused):
    z, w, bias, mask = _inputs((1,), 6, 7, 16, 4, mask_lead=(1,), bool_mask=False, seed=8)
    _check(z, w, bias, mask, torch.float32, unused=unused)


def test_bias_in_the_inputs_dtype_and_a_row_slice_of_z():
    """A bf16 bias (the model's parameters cast to bf16) and z a row slice of a larger pair
    (AutoChunk's chunks: not contiguous, copied first)."""
    z, w, bias, mask = _inputs((1,), 12, 13, 24, 9, mask_lead=(1,), bool_mask=True, seed=9)
    _check(z, w, bias, mask[:, 3:8], torch.bfloat16, bias_dtype=torch.bfloat16,
           view=lambda t: t[:, 3:8])


def test_masked_pairs_give_zero_and_no_gradient_to_z():
    z, w, bias, mask = _inputs((1,), 5, 6, 16, 2, mask_lead=(1,), bool_mask=True, seed=10)
    zd = z.to(DEVICE).requires_grad_()
    a_out, b_out = fk.triangle_projection(zd, w.to(DEVICE), bias.to(DEVICE), mask.to(DEVICE))
    (a_out.sum() + b_out.sum()).backward()
    hole = ~mask.to(DEVICE)
    assert (a_out.movedim(-3, -1)[hole] == 0).all() and (b_out.movedim(-3, -1)[hole] == 0).all()
    assert (zd.grad[hole] == 0).all() and zd.grad[~hole].abs().sum() > 0


def test_the_two_op_path_for_comparisons(monkeypatch):
    """``FOLD_KERNELS_TRI_PROJ=0``: the GEMM and the gate kernel, the same numbers."""
    monkeypatch.setenv("FOLD_KERNELS_TRI_PROJ", "0")
    z, w, bias, mask = _inputs((1,), 7, 5, 19, 3, mask_lead=(1,), bool_mask=True, seed=11)
    _check(z, w, bias, mask, torch.float32)


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
