"""Triangle multiplication as one autograd node against float64.

``fold_kernels.triangle_multiplication`` (the composed ops' Functions run as the steps of one
node) against ``fold_ops.reference.triangle_multiplication`` in float64: the update, z passed
on, and the gradients of z and of all ten parameters, both directions, odd sizes (N, C_z and c
multiples of no tile), masks with holes and a fully masked row (bool, float), one and two batch
dims. Tolerances: fp32 1e-4 (two LayerNorms and four fp32 GEMM chains, the product a sum over
N); bf16 3e-2: each gradient passes up to six bf16-rounded steps (gate, projection, LayerNorm,
product, gate, projection), and the reference run in bf16 itself is 2.2-2.6% off float64 on
some [C] parameters' gradients at these sizes (fold's 0.2-2.0%); fp16 1e-2 (3 more mantissa
bits than bf16). Under bf16 autocast with an fp32 z and parameters, fold is held to the bf16
tolerance against float64 without autocast, or to half again the error of the reference under
the same autocast where that is larger.
Also: one autograd node, its saved tensors all through ``save_for_backward`` (activation
checkpointing drops and recomputes them), the no-autograd call, and bad shapes.
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_kernels.triangle_multiplication import PARAMETERS
from fold_ops import reference as ref
from torch.utils.checkpoint import checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all(), "NaN/inf in the op's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(lead, n, n_c, c, *, bool_mask, seed):
    """z, mask and the ten parameters (random: no zero-initialised layer)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    z = r(*lead, n, n, n_c)
    mask = torch.rand(*lead, n, n, generator=g) > 0.25  # holes
    mask[..., 2, :] = False  # a fully masked row
    params = [1 + 0.1 * r(n_c), 0.1 * r(n_c), r(4 * c, n_c, scale=n_c**-0.5), r(4 * c),
              r(n_c, n_c, scale=n_c**-0.5), r(n_c), 1 + 0.1 * r(c), 0.1 * r(c),
              r(n_c, c, scale=c**-0.5), r(n_c)]
    return z, (mask if bool_mask else mask.float()), params


def _grads(fn, z, mask, params, outgoing, d_update, d_z):
    """(update, z out, d(z), d(each parameter)) of ``fn`` for the output gradients given."""
    z = z.clone().requires_grad_()
    params = [p.clone().requires_grad_() for p in params]
    update, z_out = fn(z, mask, *params, outgoing, 1e-5)
    torch.autograd.backward((update, z_out), (d_update.to(update.dtype), d_z.to(z_out.dtype)))
    return update, z_out, z.grad, [p.grad for p in params]


def _check(lead, n, n_c, c, dtype, outgoing, bool_mask, seed):
    z, mask, params = _inputs(lead, n, n_c, c, bool_mask=bool_mask, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    d_update, d_z = torch.randn(z.shape, generator=g), torch.randn(z.shape, generator=g)
    on = lambda t: t.to(dtype).to(DEVICE)  # noqa: E731
    got = _grads(fk.triangle_multiplication, on(z), mask.to(DEVICE), [on(p) for p in params],
                 outgoing, on(d_update), on(d_z))
    # the float64 reference of the same rounded inputs
    f64 = lambda t: t.to(dtype).double()  # noqa: E731
    m64 = mask.double() if mask.is_floating_point() else mask
    want = _grads(ref.triangle_multiplication, f64(z), m64, [f64(p) for p in params],
                  outgoing, f64(d_update), f64(d_z))
    tol = TOL[dtype]
    assert got[0].dtype == dtype and got[0].shape == z.shape
    assert rel_err(got[0], want[0]) < tol, "update"
    assert torch.equal(got[1].cpu(), on(z).cpu()), "z passed on"
    assert rel_err(got[2], want[2]) < tol, "d(z)"
    for name, a, b in zip(PARAMETERS, got[3], want[3], strict=True):
        assert a is not None and a.shape == b.shape, name
        assert rel_err(a, b) < tol, name


@pytest.mark.parametrize("outgoing", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_against_float64(dtype, outgoing):
    _check((1,), 7, 12, 5, dtype, outgoing, bool_mask=True, seed=1 + outgoing)


@pytest.mark.parametrize("outgoing", [True, False])
def test_two_batch_dims_and_a_float_mask(outgoing):
    _check((2, 1), 6, 9, 3, torch.float32, outgoing, bool_mask=False, seed=3 + outgoing)


@pytest.mark.skipif(DEVICE == "cpu", reason="needs CUDA autocast")
@pytest.mark.gpu
def test_fp32_under_bf16_autocast_equals_the_reference_under_it():
    _autocast_case("cuda")


def test_fp32_under_bf16_autocast_on_the_cpu():
    """The interpreter's tensors under CPU autocast: the projections in bf16, the LayerNorms'
    statistics in fp32, as the reference computes under the same autocast."""
    _autocast_case(DEVICE)


def _autocast_case(device: str):
    z, mask, params = _inputs((1,), 7, 12, 5, bool_mask=True, seed=7)
    g = torch.Generator().manual_seed(8)
    d_update, d_z = torch.randn(z.shape, generator=g), torch.randn(z.shape, generator=g)
    truth = _grads(ref.triangle_multiplication, z.double(), mask, [p.double() for p in params],
                   True, d_update.double(), d_z.double())
    errors = []
    for fn in (fk.triangle_multiplication, ref.triangle_multiplication):
        with torch.autocast(device, dtype=torch.bfloat16):
            got = _grads(fn, z.to(device), mask.to(device), [p.to(device) for p in params],
                         True, d_update.to(device), d_z.to(device))
        assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32
        assert all(a.dtype == torch.float32 for a in got[3])  # the parameters' own dtype
        errors.append([rel_err(a, b) for a, b in zip([got[0], got[2], *got[3]],
                                                     [truth[0], truth[2], *truth[3]],
                                                     strict=True)])
    # the reference under autocast is itself up to ~3.5% off on a [C] gradient here: fold is
    # held to the bf16 tolerance, or to half again the reference's own error where larger
    for i, (mine, theirs) in enumerate(zip(*errors, strict=True)):
        assert mine < max(TOL[torch.bfloat16], 1.5 * theirs), (i, mine, theirs)


def test_one_autograd_node():
    z, mask, params = _inputs((1,), 5, 8, 3, bool_mask=True, seed=9)
    z = z.to(DEVICE).requires_grad_()
    params = [p.to(DEVICE).requires_grad_() for p in params]
    update, z_out = fk.triangle_multiplication(z, mask.to(DEVICE), *params, False)
    assert type(update.grad_fn).__name__ == "_TriangleMultiplicationBackward"
    assert z_out.grad_fn is update.grad_fn and z_out._base is z  # z passed on: a view


def test_saved_tensors_go_through_save_for_backward():
    """Every tensor a step saves reaches the saved-tensor hooks: none is held by the node
    otherwise (activation checkpointing could not drop it), and checkpointing gives the same
    gradients."""
    z, mask, params = _inputs((1,), 6, 8, 3, bool_mask=True, seed=10)
    z, mask = z.to(DEVICE), mask.to(DEVICE)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    leaves = [z.clone().requires_grad_()] + [p.to(DEVICE).requires_grad_() for p in params]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        update, _ = fk.triangle_multiplication(leaves[0], mask, *leaves[1:], True)
    ctx = update.grad_fn
    assert len(packed) == len(ctx.saved_tensors) > 10
    held = [v for step in ctx.steps for v in vars(step).values() if isinstance(v, torch.Tensor)]
    assert not held and all(s.saved_tensors == () for s in ctx.steps)
    d_update = torch.randn(update.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    plain = torch.autograd.grad(update, leaves, d_update)
    # after the backward nothing is held, though the output (and so the node) lives on
    assert all(s.saved_tensors == () for s in ctx.steps)

    def run(*leaves):
        return fk.triangle_multiplication(leaves[0], mask, *leaves[1:], True)[0]

    checkpointed = torch.autograd.grad(checkpoint(run, *leaves, use_reentrant=False), leaves,
                                       d_update)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.equal(a, b)


def test_without_autograd_the_same_update():
    z, mask, params = _inputs((1,), 7, 8, 3, bool_mask=False, seed=11)
    z, mask, params = z.to(DEVICE), mask.to(DEVICE), [p.to(DEVICE) for p in params]
    with torch.no_grad():
        plain, z_out = fk.triangle_multiplication(z, mask, *params, True)
    assert z_out is z
    leaves = [p.clone().requires_grad_() for p in params]
    recorded, _ = fk.triangle_multiplication(z, mask, *leaves, True)
    assert torch.equal(plain, recorded.detach())


def test_bad_shapes_are_rejected():
    z, mask, params = _inputs((1,), 4, 8, 3, bool_mask=True, seed=12)
    z, mask, params = z.to(DEVICE), mask.to(DEVICE), [p.to(DEVICE) for p in params]
    cases = {2: (torch.randn(10, 8), "4c"), 4: (torch.randn(8, 7), r"gate_weight must be \[8, 8\]"),
             8: (torch.randn(8, 4), r"out_weight must be \[8, 3\]"),
             6: (torch.randn(4), r"ln_out_weight must be \[3\]")}
    for i, (bad, match) in cases.items():
        args = list(params)
        args[i] = bad.to(DEVICE)
        with pytest.raises(ValueError, match=match):
            fk.triangle_multiplication(z, mask, *args, True)
    with pytest.raises(ValueError, match="mask"):
        fk.triangle_multiplication(z, mask[:, :3], *params, True)
    with pytest.raises(ValueError, match=r"\[\*, I, J, C\]"):
        fk.triangle_multiplication(z[0, 0], mask[0], *params, True)
    with pytest.raises(ValueError, match="proj_weight must be in"):
        fk.triangle_multiplication(z, mask, *params[:2], params[2].double(), *params[3:], True)
