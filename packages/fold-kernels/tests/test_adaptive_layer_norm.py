"""AF3's adaptive LayerNorm (``sigmoid(gate + gate_bias) * LayerNorm(a) + shift``, gate and
shift the halves of one ``[*, 2C]`` projection) vs a float64 reference.

Odd hidden sizes (a partial column block) and row counts (a partial row block, and more row
blocks than the backward's programs, so that each walks several), each dtype, with and without
the gate bias (fp32 beside half inputs, as under autocast), non-contiguous inputs and output
gradients (copied before the kernels read them), inputs of very different scales per row, and
every gradient (a, cond, gate_bias), also with ``FOLD_KERNELS_ONE_PASS=0``. Tolerances: fp32
2e-6 (a row's mean and variance accumulate in fp32), bf16 / fp16 1e-2 and 2e-3 (one rounding of
each output from fp32); the gate bias's gradient, a sum over every row, is summed in fp32 from
the unrounded d(gate) (against the reference's sum of rounded values: the half tolerances).
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
    """``(a [*, C], cond [*, 2C], gate_bias [C], dy [*, C])``."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g) * 3.0 + 0.5
    if row_scale:  # rows of very different scale and offset: the statistics per row (an
        # offset / spread of up to ~20: fp32's rounding of x - mean stays near 1e-6 relative)
        rows = shape[-2]
        a = a * torch.logspace(-1, 2, rows)[:, None] + torch.linspace(-5, 5, rows)[:, None]
    gate = torch.randn(*shape, generator=g) * 2.0
    shift = torch.randn(*shape, generator=g)
    gate_bias = torch.randn(shape[-1], generator=g)
    dy = torch.randn(*shape, generator=g)
    return a, torch.cat([gate, shift], -1), gate_bias, dy


def _check(a, cond, gate_bias, dy, dtype, eps=1e-5, transform=None, bias_dtype=None):
    """The kernel (inputs in ``dtype``, the gate bias in ``bias_dtype`` or ``dtype``; a and cond
    optionally made non-contiguous by ``transform``) against the float64 reference on the same
    rounded inputs."""
    bias_dtype = bias_dtype or dtype
    leaves = [t.to(dtype).to(DEVICE).clone().requires_grad_() for t in (a, cond)]
    if gate_bias is not None:
        leaves.append(gate_bias.to(bias_dtype).to(DEVICE).clone().requires_grad_())
    args = [transform(t) if transform else t for t in leaves[:2]]
    g_out = dy.to(dtype).to(DEVICE)
    g_out = transform(g_out) if transform else g_out
    y = fk.adaptive_layer_norm(*args, leaves[2] if gate_bias is not None else None, eps)
    assert y.dtype == dtype and y.shape == args[0].shape
    y.backward(g_out)

    leaves64 = [t.detach().cpu().double().clone().requires_grad_() for t in leaves]
    args64 = [transform(t) if transform else t for t in leaves64[:2]]
    dy64 = dy.to(dtype).double()
    y64 = ref.adaptive_layer_norm(*args64, leaves64[2] if gate_bias is not None else None, eps)
    y64.backward(transform(dy64) if transform else dy64)
    tol = TOL[dtype]
    assert rel_err(y, y64) < tol
    for got, want in zip(leaves, leaves64):
        assert got.grad is not None and got.grad.dtype == got.dtype
        assert rel_err(got.grad, want.grad) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 37), (1, 5, 96), (2, 130)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_float64_reference(shape, dtype, with_bias):
    a, cond, gate_bias, dy = _inputs(shape, seed=sum(shape))
    _check(a, cond, gate_bias if with_bias else None, dy, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_gate_bias_with_half_inputs(dtype):
    """Under autocast the GEMM gives a half cond while the bias parameter stays fp32: its
    gradient comes back in fp32."""
    _check(*_inputs((4, 9, 40), seed=11), dtype, bias_dtype=torch.float32)


def test_many_row_blocks_per_program():
    """More row blocks than the backward's fixed grid: each program adds several blocks'
    d(gate) into its partial row before the last ones sum the rows."""
    _check(*_inputs((101, 24), seed=12), torch.float32)


def test_two_launch_reduction_matches(monkeypatch):
    """``FOLD_KERNELS_ONE_PASS=0``: the partial rows are summed by a second launch."""
    monkeypatch.setenv("FOLD_KERNELS_ONE_PASS", "0")
    _check(*_inputs((37, 20), seed=13), torch.float32)


def test_rows_of_different_scales_and_large_eps():
    a, cond, gate_bias, dy = _inputs((9, 48), seed=3, row_scale=True)
    _check(a, cond, gate_bias, dy, torch.float32)
    _check(a, cond, gate_bias, dy, torch.float32, eps=1e-2)


def test_constant_rows_are_finite():
    """A row with zero variance normalises to 0 (1/sqrt(eps) times 0): y = shift, and the
    gradients stay finite."""
    a, cond, gate_bias, dy = _inputs((4, 33), seed=4)
    a[1] = 7.25
    _check(a, cond, gate_bias, dy, torch.float32)


def test_non_contiguous_inputs_and_gradient():
    a, cond, gate_bias, dy = _inputs((6, 5, 40), seed=5)
    _check(a, cond, gate_bias, dy, torch.float32, transform=lambda t: t.transpose(0, 1))


def test_shift_gradient_is_the_output_gradient_and_empty_input():
    a, cond, gate_bias, dy = (t.to(DEVICE).clone().requires_grad_() if i < 3 else t.to(DEVICE)
                              for i, t in enumerate(_inputs((2, 3, 24), seed=6)))
    fk.adaptive_layer_norm(a, cond, gate_bias).backward(dy)
    assert torch.equal(cond.grad[..., 24:], dy)
    empty = [torch.zeros(0, c, device=DEVICE, requires_grad=True) for c in (8, 16)]
    bias = torch.zeros(8, device=DEVICE, requires_grad=True)
    out = fk.adaptive_layer_norm(*empty, bias)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (*empty, bias))


def test_bad_inputs_are_refused_with_the_reason():
    x = torch.randn(2, 8, device=DEVICE)
    cond = torch.randn(2, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"cond must be \[\*, 2C\]"):
        fk.adaptive_layer_norm(x, x)
    with pytest.raises(ValueError, match=r"cond must be \[\*, 2C\]"):
        fk.adaptive_layer_norm(x, torch.randn(3, 16, device=DEVICE))  # 3 rows against 2
    with pytest.raises(ValueError, match="in a.s dtype"):
        fk.adaptive_layer_norm(x, cond.double())
    with pytest.raises(ValueError, match="gate_bias must be a float"):
        fk.adaptive_layer_norm(x, cond, torch.zeros(7, device=DEVICE))
    big = torch.empty(1, 8193, device=DEVICE)
    with pytest.raises(ValueError, match="hidden size"):
        fk.adaptive_layer_norm(big, torch.empty(1, 16386, device=DEVICE))


def test_inference_path_matches_the_autograd_path():
    """Without gradients the op skips autograd (no saved tensors): the same bits."""
    a, cond, gate_bias, _ = (t.to(DEVICE) for t in _inputs((3, 5, 40), seed=7))
    with torch.no_grad():
        y = fk.adaptive_layer_norm(a, cond, gate_bias)
    assert y.grad_fn is None
    a.requires_grad_()
    assert torch.equal(y, fk.adaptive_layer_norm(a, cond, gate_bias).detach())


def test_backward_keeps_a_c_wide_gate_not_the_projection():
    """What the backward keeps is ``[*, C]`` wide (a and the biased gate), never the ``[*, 2C]``
    projection: the activation memory of the separate gate and shift layers."""
    a, cond, gate_bias, _ = (t.to(DEVICE).requires_grad_() for t in _inputs((3, 5, 40), seed=8))
    y = fk.adaptive_layer_norm(a, cond, gate_bias)
    kept = [t for t in y.grad_fn.saved_tensors if t.dim() == 3]
    assert kept and all(t.shape == a.shape for t in kept)


@pytest.mark.parametrize("with_grad", [True, False])
def test_fp32_stream_under_autocast(with_grad):
    """As fold-train runs the diffusion transformer: a an fp32 stream, cond a bf16 projection,
    an fp32 gate bias, under bf16 autocast (fold_ops.autocast). y comes out in bf16 (one
    rounding of the fp32 result: bf16's tolerance); a's gradient in fp32 from y's bf16
    gradient given exactly to both, the biased gate kept in a's fp32 (fp32's reach: 1e-5);
    cond's in bf16; the gate bias's in fp32 summed from unrounded terms (bf16's tolerance
    against the reference's sum over the bf16 d(gate) it rounds)."""
    _check_autocast(*_inputs((3, 7, 37), seed=90), with_grad)


def _check_autocast(a, cond, gate_bias, dy, with_grad: bool) -> None:
    """a and the gate bias in fp32, cond in bf16, under bf16 autocast, against float64 (see
    test_fp32_stream_under_autocast for the tolerances)."""
    leaves = [a.to(DEVICE).clone().requires_grad_(),
              cond.to(torch.bfloat16).to(DEVICE).clone().requires_grad_(),
              gate_bias.to(DEVICE).clone().requires_grad_()]
    with torch.autocast(DEVICE, dtype=torch.bfloat16), torch.set_grad_enabled(with_grad):
        y = fk.adaptive_layer_norm(*leaves)
    assert y.dtype == torch.bfloat16 and y.shape == a.shape
    leaves64 = [t.detach().cpu().double().clone().requires_grad_() for t in leaves]
    y64 = ref.adaptive_layer_norm(*leaves64)
    assert rel_err(y, y64) < TOL[torch.bfloat16]
    if not with_grad:
        return
    dy16 = dy.to(torch.bfloat16)
    y.backward(dy16.to(DEVICE))
    y64.backward(dy16.double())
    for got, want, tol in zip(leaves, leaves64, (1e-5, TOL[torch.bfloat16],
                                                 TOL[torch.bfloat16])):
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape
        assert rel_err(got.grad, want.grad) < tol


def _broadcast_inputs(shape, cond_shape, seed):
    """a and dy ``shape``, cond ``cond_shape`` (1 over the dims it shares), a gate bias."""
    a, _, gate_bias, dy = _inputs(shape, seed)
    g = torch.Generator().manual_seed(seed + 1)
    cond = torch.cat([torch.randn(*cond_shape[:-1], shape[-1], generator=g) * 2.0,
                      torch.randn(*cond_shape[:-1], shape[-1], generator=g)], -1)
    return a, cond, gate_bias, dy


BROADCASTS = [
    ((2, 3, 37, 40), (2, 1, 37, 80)),  # the atom transformers': [B, S, A] with [B, 1, A]
    ((3, 5, 24), (1, 1, 48)),  # a run from the first dim
    ((2, 3, 4, 5, 24), (2, 1, 1, 5, 48)),  # a run of two dims in the middle
    ((4, 7, 33), (4, 7, 66)),  # no broadcast through the same path
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: "x".join(map(str, s[1])))
@pytest.mark.parametrize("with_bias", [True, False])
def test_conditioning_broadcast_over_samples(shapes, dtype, with_bias):
    """cond shared by the rows of one run of a's batch dims, read in place: y and every
    gradient against the float64 reference (cond's: the sum over the rows that shared it)."""
    a, cond, gate_bias, dy = _broadcast_inputs(*shapes, seed=sum(shapes[0]))
    _check(a, cond, gate_bias if with_bias else None, dy, dtype)


@pytest.mark.parametrize("with_grad", [True, False])
def test_broadcast_conditioning_under_autocast(with_grad):
    """The atom transformers under fold-train's autocast: an fp32 stream ``[B, S, A, C]`` with
    a bf16 ``[B, 1, A, 2C]`` projection (tolerances as test_fp32_stream_under_autocast; cond's
    gradient is summed over the samples from bf16 rows: bf16's tolerance)."""
    _check_autocast(*_broadcast_inputs((2, 3, 37, 40), (2, 1, 37, 80), seed=91), with_grad)


def test_broadcast_shapes_the_kernel_refuses():
    """cond must match a's batch dims but for one run of ones: other broadcasts are errors, and
    the registry's predicate declines them (PyTorch serves them)."""
    from fold_kernels.adaptive_layer_norm import broadcast_layout

    assert broadcast_layout((2, 3, 37, 40), (2, 1, 37, 80)) == (2, 3, 37)
    assert broadcast_layout((2, 3, 4, 5, 8), (2, 1, 1, 5, 16)) == (2, 12, 5)
    assert broadcast_layout((4, 7, 8), (4, 7, 16)) == (28, 1, 1)
    for a_shape, c_shape in [((2, 3, 4, 8), (1, 3, 1, 16)),  # two runs
                             ((2, 3, 4, 8), (3, 4, 16)),  # fewer dims
                             ((2, 3, 4, 8), (2, 2, 4, 16))]:  # not a broadcast
        assert broadcast_layout(a_shape, c_shape) is None
        with pytest.raises(ValueError, match=r"cond must be \[\*, 2C\]"):
            fk.adaptive_layer_norm(torch.randn(*a_shape, device=DEVICE),
                                   torch.randn(*c_shape, device=DEVICE))
