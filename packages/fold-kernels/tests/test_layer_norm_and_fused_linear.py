"""LayerNorm, fused LayerNorm+Linear and SwiGLU vs float64 references (outputs, all grads).

Tolerances (relative Frobenius norm): fp32 1e-5 (exact fp32 products); bf16 1.5e-2 (y and the
normalized activations are rounded to bf16, eps 3.9e-3, before a product); fp16 3e-3.
"""

from __future__ import annotations

import importlib

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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [72, 128])
def test_layer_norm_gain_only(dtype, c):
    # AF3's AdaLN normalises s with a gain and no bias: no bias gradient, the rest as above
    x = _rand(3, 11, c, seed=c + 1, scale=2.0, shift=-1.0)
    _run(fk.layer_norm, ref.layer_norm, [x, _rand(c, seed=3), None], dtype)


def test_layer_norm_gain_only_transposed_input_and_refusals():
    x = _rand(13, 6, 40, seed=8).to(DEVICE).transpose(0, 1)  # [6, 13, 40], rows strided
    w = _rand(40, seed=9).to(DEVICE)
    y = fk.layer_norm(x, w, None)
    y_ref = ref.layer_norm(x.double().cpu(), w.double().cpu(), None)
    assert rel_err(y, y_ref) < TOL[torch.float32]
    with pytest.raises(ValueError, match="weight and bias"):
        fk.layer_norm_fork(x, w, None)  # the fork keeps its bias
    with pytest.raises(ValueError, match="weight and bias"):
        fk.layer_norm(x, w, torch.zeros(39, device=DEVICE))


def _bwd_candidates(c: int):
    """The backward's launch candidates: every one the tuner may pick on this GPU; under the
    interpreter, small ones with each way of keeping the partial sums."""
    from fold_kernels import tuning

    ln = importlib.import_module("fold_kernels.layer_norm")  # the module, not the function
    if DEVICE == "cpu":
        return [tuning.Config(block_m=4, block_n=1, num_warps=1, acc_tile=t) for t in (False, True)]
    return list(ln._bwd_configs_for(c, False))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [72, 128])
def test_layer_norm_backward_every_candidate(dtype, c):
    """Each launch candidate of the backward (rows a block, programs, warps, the partial sums
    as row tiles or column sums per block) against float64, with several row blocks per
    program and a ragged last block."""
    from fold_kernels import tuning

    if DEVICE == "cpu":
        rows = 45
    else:  # 3 blocks a program at the most programs (8 per SM) of the 16-row candidates
        rows = 3 * 8 * torch.cuda.get_device_properties(0).multi_processor_count * 16 + 5
    x = _rand(rows, c, seed=c + 7, scale=2.0, shift=3.0)
    w, b = _rand(c, seed=8), _rand(c, seed=9)
    for cfg in _bwd_candidates(c):
        with tuning.pinned("ln_bwd", cfg):
            _run(fk.layer_norm, ref.layer_norm, [x, w, b], dtype)


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


def _fork_reference(x, w, b, branches, dys, dres):
    """float64 reference of layer_norm_fork's gradients: autograd adds them."""
    ins = [t.double().cpu().clone().requires_grad_() for t in (x, w, b)]
    outs = ref.layer_norm_fork(*ins, 1e-5, branches)
    seeds = [(o, g) for o, g in zip(outs, (dres, *dys)) if g is not None]
    torch.autograd.backward([o for o, _ in seeds], [g.double().cpu() for _, g in seeds])
    return outs[1], [t.grad for t in ins]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("branches", [1, 2, 3])
@pytest.mark.parametrize("read", ["all", "branches only", "stream and first branch"])
def test_layer_norm_fork(dtype, branches, read):
    """Outputs and the gradients of x, weight and bias against float64 when the stream and any
    set of the branches are read (an unread output's gradient is None: nothing is added)."""
    c = 72
    gen = torch.Generator().manual_seed(branches)
    x = _rand(3, 11, c, seed=20 + branches, scale=2.0, shift=3.0).to(dtype)
    w, b = _rand(c, seed=30).to(dtype), _rand(c, seed=31).to(dtype)
    dys = [torch.randn(3, 11, c, generator=gen).to(dtype) for _ in range(branches)]
    dres = torch.randn(3, 11, c, generator=gen).to(dtype)
    if read == "branches only":
        dres = None
    elif read == "stream and first branch":
        dys = dys[:1] + [None] * (branches - 1)
    ins = [t.to(DEVICE).clone().requires_grad_() for t in (x, w, b)]
    outs = fk.layer_norm_fork(*ins, 1e-5, branches)
    assert len(outs) == branches + 1 and torch.equal(outs[0], ins[0])
    seeds = [(o, g) for o, g in zip(outs, (dres, *dys)) if g is not None]
    torch.autograd.backward([o for o, _ in seeds], [g.to(DEVICE) for _, g in seeds])
    y_ref, grads_ref = _fork_reference(x, w, b, branches, dys, dres)
    tol = TOL[dtype]
    for y in outs[1:]:
        assert rel_err(y, y_ref) < tol
    for name, t, g in zip(("x", "weight", "bias"), ins, grads_ref):
        assert rel_err(t.grad, g) < tol, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_fork_strided(dtype):
    """A transposed x (the ending node's pair) and gradients in other layouts: read through
    their strides, dx in x's layout, the same numbers as for contiguous tensors."""
    c = 40
    gen = torch.Generator().manual_seed(5)
    base = _rand(2, 9, 7, c, seed=40, scale=1.5, shift=-1.0).to(dtype)  # [B, I, J, C]
    w, b = _rand(c, seed=41).to(dtype), _rand(c, seed=42).to(dtype)
    dy1 = torch.randn(2, 7, 9, c, generator=gen).to(dtype)  # [B, J, I, C]: contiguous
    dy2 = torch.randn(2, 9, 7, c, generator=gen).to(dtype).transpose(1, 2)  # transposed
    dres = torch.randn(2, 9, 7, c, generator=gen).to(dtype).transpose(1, 2)
    leaf = base.to(DEVICE).clone().requires_grad_()
    wd, bd = (t.to(DEVICE).clone().requires_grad_() for t in (w, b))
    x = leaf.transpose(1, 2)  # [B, J, I, C], a view
    xs, y1, y2 = fk.layer_norm_fork(x, wd, bd, 1e-5, 2)
    assert xs.stride() == x.stride()
    torch.autograd.backward([xs, y1, y2], [g.to(DEVICE) for g in (dres, dy1, dy2)])
    y_ref, (gx, gw, gb) = _fork_reference(base.transpose(1, 2), w, b, 2, [dy1, dy2], dres)
    tol = TOL[dtype]
    assert rel_err(y1, y_ref) < tol
    assert rel_err(leaf.grad, gx.transpose(1, 2)) < tol
    assert rel_err(wd.grad, gw) < tol and rel_err(bd.grad, gb) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["fork 1, all read", "fork 0 (bias only)", "fork 2, no stream",
                                  "bias unread", "transposed x, 16 heads"])
def test_layer_norm_pair_bias(dtype, case):
    """Outputs and the gradients of x, weight, bias and the heads' weight against float64: the
    bias's gradient enters LayerNorm's pass as ``g^T W`` (no d(y) of the projection), with or
    without the other readers of y and of the stream, and for a transposed x (the ending node)
    with a heads-first bias gradient in another layout."""
    c, heads, branches = 37, 3, 1
    shape = (2, 7, 5, c)
    if case == "fork 0 (bias only)":
        branches = 0
    elif case == "fork 2, no stream":
        branches = 2
    elif case == "transposed x, 16 heads":
        heads = 16
    gen = torch.Generator().manual_seed(len(case))
    base = _rand(*shape, seed=50, scale=1.5, shift=2.0).to(dtype)  # [B, I, J, C]
    w, b = _rand(c, seed=51).to(dtype), _rand(c, seed=52).to(dtype)
    wh = _rand(heads, c, seed=53).to(dtype)
    transposed = case.startswith("transposed")
    x_shape = (2, 5, 7, c) if transposed else shape
    dys = [torch.randn(x_shape, generator=gen).to(dtype) for _ in range(branches)]
    dres = None if case == "fork 2, no stream" else torch.randn(x_shape, generator=gen).to(dtype)
    dbias = None if case == "bias unread" else torch.randn(
        (x_shape[0], heads, *x_shape[1:3]), generator=gen).to(dtype)
    if transposed and dbias is not None:  # the same values in a [B, H, J, I]-major layout
        dbias = dbias.transpose(-1, -2).contiguous().transpose(-1, -2)

    leaf = base.to(DEVICE).clone().requires_grad_()
    wd, bd, whd = (t.to(DEVICE).clone().requires_grad_() for t in (w, b, wh))
    x = leaf.transpose(1, 2) if transposed else leaf
    outs = fk.layer_norm_pair_bias(x, wd, bd, whd, 1e-5, branches)
    assert len(outs) == branches + 2 and torch.equal(outs[0], x)
    seeds = [(o, g) for o, g in zip(outs, (dres, *dys, dbias)) if g is not None]
    torch.autograd.backward([o for o, _ in seeds], [g.to(DEVICE) for _, g in seeds])

    ins = [t.double().clone().requires_grad_() for t in (base, w, b, wh)]
    x64 = ins[0].transpose(1, 2) if transposed else ins[0]
    ref_outs = ref.layer_norm_pair_bias(x64, *ins[1:3], ins[3], 1e-5, branches)
    ref_seeds = [(o, g) for o, g in zip(ref_outs, (dres, *dys, dbias)) if g is not None]
    torch.autograd.backward([o for o, _ in ref_seeds], [g.double() for _, g in ref_seeds])
    tol = TOL[dtype]
    for o, r in zip(outs[1:], ref_outs[1:]):
        assert o.shape == r.shape and rel_err(o, r) < tol
    for name, t, r in zip(("x", "weight", "bias", "heads' weight"), (leaf, wd, bd, whd), ins):
        if r.grad is None:
            assert t.grad is None or not t.grad.any(), name
        else:
            assert rel_err(t.grad, r.grad) < tol, name


class _LaunchSpy:
    """Stands in for a kernel (``kernel[grid](...)``) and records each launch's keywords."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dense", ["1", "0"])
@pytest.mark.parametrize("fma", ["1", "0"])
def test_layer_norm_fork_many_row_blocks_per_program(monkeypatch, dtype, dense, fma):
    """Enough rows that each backward program walks several row blocks (on a GPU too: more
    than its programs times rows per block), its partial weight and bias sums carried across
    them, with a ragged last block. Contiguous operands take the dense addressing (``DENSE``:
    one in-tile offset tile for x, dy, both extra gradients and dx); ``FOLD_KERNELS_LN_DENSE=0``
    reads them through the general row dims. The loop's FMA form (no select: C 72 pads its
    blocks to 128 columns, and the ragged last block has rows past the end) and its textbook
    form (``FOLD_KERNELS_LN_FMA=0``). Each against float64."""
    monkeypatch.setenv("FOLD_KERNELS_LN_DENSE", dense)
    monkeypatch.setenv("FOLD_KERNELS_LN_FMA", fma)
    ln = importlib.import_module("fold_kernels.layer_norm")
    spy = _LaunchSpy(ln._ln_bwd)
    monkeypatch.setattr(ln, "_ln_bwd", spy)
    c = 72
    if DEVICE == "cpu":  # the interpreter: 3 programs of 4-row blocks
        rows = 45
    else:  # 3 blocks a program at the most programs (8 per SM) and rows (64) a candidate has
        rows = 3 * 8 * torch.cuda.get_device_properties(0).multi_processor_count * 64 + 5
    gen = torch.Generator().manual_seed(6)
    x = _rand(rows, c, seed=60, scale=2.0, shift=3.0).to(dtype)
    w, b = _rand(c, seed=61).to(dtype), _rand(c, seed=62).to(dtype)
    dys = [torch.randn(rows, c, generator=gen).to(dtype) for _ in range(2)]
    dres = torch.randn(rows, c, generator=gen).to(dtype)
    ins = [t.to(DEVICE).clone().requires_grad_() for t in (x, w, b)]
    outs = fk.layer_norm_fork(*ins, 1e-5, 2)
    torch.autograd.backward(list(outs), [g.to(DEVICE) for g in (dres, *dys)])
    y_ref, grads_ref = _fork_reference(x, w, b, 2, dys, dres)
    tol = TOL[dtype]
    assert rel_err(outs[1], y_ref) < tol
    for name, t, g in zip(("x", "weight", "bias"), ins, grads_ref):
        assert rel_err(t.grad, g) < tol, name
    assert spy.launches and all(kw["DENSE"] == (dense == "1") and kw["FMA"] == (fma == "1")
                                for kw in spy.launches)
    assert all(kw["HAS_DY2"] and kw["HAS_DR"] for kw in spy.launches)


def test_layer_norm_fork_without_autograd_is_layer_norm():
    x = _rand(4, 33, seed=50).to(DEVICE)
    w, b = _rand(33, seed=51).to(DEVICE), _rand(33, seed=52).to(DEVICE)
    with torch.no_grad():
        xs, y1, y2 = fk.layer_norm_fork(x, w, b, 1e-5, 2)
    assert xs is x and y1 is y2
    assert torch.equal(y1, fk.layer_norm(x, w, b))
    with pytest.raises(ValueError, match="branches must be >= 1"):
        fk.layer_norm_fork(x, w, b, 1e-5, 0)


def test_row_tile_switch_leaves_the_tile_candidates_out(monkeypatch):
    """``FOLD_KERNELS_LN_TILE=0`` (for comparisons) tunes the backward without the row-tile
    candidates; by default they are among the candidates on a GPU."""
    ln = importlib.import_module("fold_kernels.layer_norm")
    assert any(cfg.acc_tile for cfg in ln._bwd_configs_for(128, False, True))
    monkeypatch.setenv("FOLD_KERNELS_LN_TILE", "0")
    assert not ln._TILE.get()
    assert not any(cfg.acc_tile for cfg in ln._bwd_configs_for(128, False, ln._TILE.get()))


# ---------------------------------------------------------------------------------------------
# Under autocast (fold_ops.autocast), as fold-train runs the stacks: x an fp32 stream, weights in
# fp32 (predict) or bf16 (system.bf16_weights). The LayerNorm is computed in fp32 from x as it
# is; y (and the pair bias, the fused projection) come out in bf16, rounded once. So y is within
# bf16's rounding (TOL) of float64; x's gradient, from bf16 dy values given exactly to both, in
# fp32's reach; the LayerNorm's weight and bias gradients in the weights' dtype. Products of a
# bf16 y with bf16 weights (the pair bias, the fused linear) carry both roundings: bf16's TOL.

def _autocast():
    return torch.autocast(DEVICE, dtype=torch.bfloat16)


def _leaves(*tensors, dtype=None):
    return [t.to(DEVICE, dtype or t.dtype).clone().requires_grad_() for t in tensors]


def _float64(*tensors):
    return [t.double().cpu().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_grad", [True, False])
def test_layer_norm_fork_under_autocast(weights, with_grad):
    c, branches = 72, 2
    gen = torch.Generator().manual_seed(60)
    x = _rand(3, 11, c, seed=61, scale=2.0, shift=3.0)
    w, b = _rand(c, seed=62).to(weights), _rand(c, seed=63).to(weights)
    ins = _leaves(x, w, b)
    with _autocast(), torch.set_grad_enabled(with_grad):
        outs = fk.layer_norm_fork(*ins, 1e-5, branches)
    assert outs[0].dtype == torch.float32 and torch.equal(outs[0], ins[0])
    assert all(y.dtype == torch.bfloat16 for y in outs[1:])
    y_ref, grads_ref = _fork_reference(x, w, b, branches, [
        torch.randn(3, 11, c, generator=gen).to(torch.bfloat16) for _ in range(branches)],
        torch.randn(3, 11, c, generator=gen))
    for y in outs[1:]:
        assert rel_err(y, y_ref) < TOL[torch.bfloat16]
    if not with_grad:
        return
    gen = torch.Generator().manual_seed(60)  # the same gradients as the reference's
    dys = [torch.randn(3, 11, c, generator=gen).to(torch.bfloat16) for _ in range(branches)]
    dres = torch.randn(3, 11, c, generator=gen)
    torch.autograd.backward(list(outs), [g.to(DEVICE) for g in (dres, *dys)])
    assert ins[0].grad.dtype == torch.float32 and ins[1].grad.dtype == weights
    assert rel_err(ins[0].grad, grads_ref[0]) < TOL[torch.float32]
    for name, t, g in zip(("weight", "bias"), ins[1:], grads_ref[1:]):
        assert rel_err(t.grad, g) < TOL[weights], name


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_layer_norm_pair_bias_under_autocast(weights):
    c, heads, branches = 37, 3, 1
    gen = torch.Generator().manual_seed(64)
    x = _rand(2, 7, 5, c, seed=65, scale=1.5, shift=2.0)
    w, b = _rand(c, seed=66).to(weights), _rand(c, seed=67).to(weights)
    wh = _rand(heads, c, seed=68).to(weights)
    dres = torch.randn(x.shape, generator=gen)
    dy = torch.randn(x.shape, generator=gen).to(torch.bfloat16)
    dbias = torch.randn(2, heads, 7, 5, generator=gen).to(torch.bfloat16)
    ins = _leaves(x, w, b, wh)
    with _autocast():
        outs = fk.layer_norm_pair_bias(*ins, 1e-5, branches)
    assert [o.dtype for o in outs] == [torch.float32, torch.bfloat16, torch.bfloat16]
    torch.autograd.backward(list(outs), [g.to(DEVICE) for g in (dres, dy, dbias)])
    ref_ins = _float64(x, w, b, wh)
    ref_outs = ref.layer_norm_pair_bias(*ref_ins, 1e-5, branches)
    torch.autograd.backward(list(ref_outs), [g.double() for g in (dres, dy, dbias)])
    for o, r in zip(outs[1:], ref_outs[1:]):
        assert rel_err(o, r) < TOL[torch.bfloat16]
    for name, t, r in zip(("x", "weight", "bias", "heads' weight"), ins, ref_ins):
        assert t.grad.dtype == t.dtype, name
        assert rel_err(t.grad, r.grad) < TOL[torch.bfloat16], name  # g^T W: W in bf16


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_layer_norm_linear_under_autocast(weights):
    k, n_out = 40, 37
    x = _rand(2, 9, k, seed=70, scale=1.5, shift=-2.0)
    params = [_rand(k, seed=71), _rand(k, seed=72), _rand(n_out, k, seed=73, scale=k**-0.5),
              _rand(n_out, seed=74)]
    ins = _leaves(x) + _leaves(*params, dtype=weights)
    with _autocast():
        y = fk.layer_norm_linear(*ins)
    assert y.dtype == torch.bfloat16
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(75)).to(torch.bfloat16)
    y.backward(dy.to(DEVICE))
    ref_ins = _float64(x, *(p.to(weights) for p in params))
    y_ref = ref.layer_norm_linear(*ref_ins)
    y_ref.backward(dy.double())
    assert rel_err(y, y_ref) < TOL[torch.bfloat16]
    for i, (t, r) in enumerate(zip(ins, ref_ins)):
        assert t.grad.dtype == t.dtype and rel_err(t.grad, r.grad) < TOL[torch.bfloat16], i
