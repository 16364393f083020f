"""Triangle multiplication and outer product mean under bf16 autocast: the 0/1 masks are applied
in the projections' dtype, so the projections are not promoted to fp32 and cast back (forward
and backward), and the numbers equal the fp32-mask formula exactly."""

from __future__ import annotations

import pytest
import torch
from fold_model.layers import OuterProductMean, TriangleMultiplication
from torch.utils._python_dispatch import TorchDispatchMode


class _Casts(TorchDispatchMode):
    """Shapes of every ``_to_copy`` (dtype cast) dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default:
            self.shapes.append(tuple(out.shape))
        return out


def _run(mod, x, mask):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mod(x, mask)
    out.float().square().sum().backward()
    return out


def _reference_tri(mod: TriangleMultiplication, z, pair_mask):
    """The previous formula: the mask in the LayerNorm output's dtype (fp32) multiplies the
    bf16 gated projections (promoting them), the einsum casts them back."""
    if not mod.outgoing:
        z, pair_mask = z.transpose(-2, -3), pair_mask.transpose(-1, -2)
    z_ln = mod.layer_norm_in(z)
    mask = pair_mask.unsqueeze(-1).to(z_ln.dtype)
    a = torch.sigmoid(mod.linear_a_g(z_ln)) * mod.linear_a_p(z_ln) * mask
    b = torch.sigmoid(mod.linear_b_g(z_ln)) * mod.linear_b_p(z_ln) * mask
    left, right = (a, b) if mod.outgoing else (b, a)
    x = torch.einsum("...ikc,...jkc->...ijc", left, right)
    out = mod.linear_z(mod.layer_norm_out(x)) * torch.sigmoid(mod.linear_g(z_ln))
    return out if mod.outgoing else out.transpose(-2, -3)


@pytest.mark.parametrize("outgoing", [True, False])
def test_triangle_multiplication_mask_in_projection_dtype(outgoing):
    torch.manual_seed(0)
    n, c_z, c = 9, 12, 10  # odd sizes, c_hidden distinct from c_z
    mod = TriangleMultiplication(c_z, c, outgoing)
    for p in mod.parameters():
        torch.nn.init.normal_(p, std=0.3)
    z = torch.randn(1, n, n, c_z, requires_grad=True)
    mask = (torch.rand(1, n, n) > 0.3).float()
    assert 0 < mask.sum() < mask.numel()  # holes
    with _Casts() as casts:
        out = _run(mod, z, mask)
    # the update stays in the autocast dtype: linear_z's and linear_g's fp32 biases, added by
    # the gate op, are added in their operands' dtype as the layers' GEMMs add them
    assert out.dtype == torch.bfloat16
    # no cast of an [.., N, N, c_hidden] projection (nor of its gradient)
    assert not [s for s in casts.shapes if s[-1] == c and len(s) >= 3], casts.shapes
    grads = [z.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
    z.grad = None
    mod.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _reference_tri(mod, z, mask)
    ref.float().square().sum().backward()
    ref_grads = [z.grad] + [p.grad for p in mod.parameters()]
    # bf16 autocast on both sides; the 0/1 mask multiplies exactly in either dtype. A small
    # tolerance only for the reference's unfused sigmoid gate (ops.bias_sigmoid_gate's own order)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)
    assert torch.isfinite(out.float()).all()


def test_outer_product_mean_mask_in_projection_dtype():
    torch.manual_seed(1)
    s, n, c_m, c_z, c = 5, 7, 16, 12, 6
    mod = OuterProductMean(c_m, c_z, c)
    for p in mod.parameters():
        torch.nn.init.normal_(p, std=0.3)
    m = torch.randn(1, s, n, c_m, requires_grad=True)
    mask = (torch.rand(1, s, n) > 0.3).float()
    with _Casts() as casts:
        out = _run(mod, m, mask)
    assert not [sh for sh in casts.shapes if sh[-1] == c and len(sh) >= 3], casts.shapes
    # the masked projections: exactly zero where the mask has holes
    a, b, _, m_out = mod._projections(m, mask)
    assert m_out is m or torch.equal(m_out, m)  # m passed on
    assert bool((a[mask == 0] == 0).all()) and bool((b[mask == 0] == 0).all())
    assert out.shape == (1, n, n, c_z) and torch.isfinite(out.float()).all()
