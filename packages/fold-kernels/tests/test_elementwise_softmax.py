"""bias+sigmoid+gate, bias+dropout+residual and the fused masked softmax vs float64 references.

Broadcast operands as AF2 uses them: a ``[C]`` bias, a dropout mask shared along one row dim,
a pair bias ``[H, N, N]`` and a key mask ``[S, 1, 1, N]`` against ``[S, H, N, N]`` logits.
Tolerances: fp32 1e-6 (elementwise, no reductions but the softmax's); bf16 8e-3 (one rounding
of the output, eps 3.9e-3, plus the inputs' own rounding carried through); fp16 1e-3.
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_ops import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _rand(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _run(fn, ref_fn, tensors, dtype, grads, extra=()):
    ins = [t.to(dtype).to(DEVICE).clone().requires_grad_(g) if t is not None else None
           for t, g in zip(tensors, grads)]
    y = fn(*ins, *[e.to(DEVICE) if e is not None else None for e in extra])
    dy = _rand(*y.shape, seed=99).to(dtype)
    y.backward(dy.to(DEVICE))
    ref_ins = [t.to(dtype).double().clone().requires_grad_(g) if t is not None else None
               for t, g in zip(tensors, grads)]
    y_ref = ref_fn(*ref_ins, *[e.double() if e is not None and e.is_floating_point() else e
                               for e in extra])
    y_ref.backward(dy.double())
    tol = TOL[dtype]
    assert y.shape == y_ref.shape and rel_err(y, y_ref) < tol
    for i, (a, b, g) in enumerate(zip(ins, ref_ins, grads)):
        if a is not None and g:
            assert a.grad.shape == a.shape and rel_err(a.grad, b.grad) < tol, f"grad {i}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_sigmoid_gate(dtype):
    x, g, b = _rand(3, 5, 33, seed=1), _rand(3, 5, 33, seed=2), _rand(33, seed=3)
    _run(fk.bias_sigmoid_gate, ref.bias_sigmoid_gate, [x, g, b], dtype, [True] * 3)
    _run(fk.bias_sigmoid_gate, ref.bias_sigmoid_gate, [x, g, None], dtype, [True, True, False])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", ["fused", "no_gate_sums", "no_one_pass"])
def test_bias_sigmoid_gate_x_bias(monkeypatch, dtype, path):
    """``(x + x_bias) * sigmoid(gate + bias)``: the ``[C]`` biases' gradients summed in the
    backward's own launch (three programs per column block under the interpreter, so a program
    walks several row tiles and the partial rows take two levels of groups), or by column sums
    after it with ``FOLD_KERNELS_GATE_SUMS=0`` / ``FOLD_KERNELS_ONE_PASS=0``; each against
    float64, with C odd and not a multiple of the column block."""
    if path == "no_gate_sums":
        monkeypatch.setenv("FOLD_KERNELS_GATE_SUMS", "0")
    elif path == "no_one_pass":
        monkeypatch.setenv("FOLD_KERNELS_ONE_PASS", "0")
    x, g = _rand(3, 7, 37, seed=11), _rand(3, 7, 37, seed=12)
    b, xb = _rand(37, seed=13), _rand(37, seed=14)

    def ref_fn(x, g, b, xb):
        return ref.bias_sigmoid_gate(x, g, b, x_bias=xb)

    def fn(x, g, b, xb):
        return fk.bias_sigmoid_gate(x, g, b, x_bias=xb)

    _run(fn, ref_fn, [x, g, b, xb], dtype, [True] * 4)
    _run(fn, ref_fn, [x, g, None, xb], dtype, [True, True, False, True])
    # a broadcast gate ([N, C] for [S, N, C]) and a bias that is not [C]: reduced after
    _run(fn, ref_fn, [x, g[0], g[1], xb], dtype, [True, True, True, True])


def test_bias_sigmoid_gate_x_bias_is_checked_and_deterministic():
    x = _rand(4, 9, 24, seed=21).to(DEVICE)
    with pytest.raises(ValueError, match="x_bias must be"):
        fk.bias_sigmoid_gate(x, x, x_bias=torch.zeros(4, 24, device=DEVICE))
    g = _rand(4, 9, 24, seed=22).to(DEVICE)
    b = _rand(24, seed=23).to(DEVICE).requires_grad_()
    xb = _rand(24, seed=24).to(DEVICE).requires_grad_()
    grads = [torch.autograd.grad(fk.bias_sigmoid_gate(x, g, b, xb), (b, xb),
                                 torch.ones_like(x)) for _ in range(2)]
    assert all(torch.isfinite(t).all() for t in grads[0])
    assert all(torch.equal(a, c) for a, c in zip(*grads))


def test_bias_sigmoid_gate_biases_of_two_dtypes():
    """x_bias and bias in different dtypes (fp32 and bf16): both gradients come from the one
    summed reduction (kept in fp32 then), against float64."""
    x, g = _rand(2, 9, 40, seed=31), _rand(2, 9, 40, seed=32)
    b, xb = _rand(40, seed=33), _rand(40, seed=34)
    dy = _rand(2, 9, 40, seed=35)
    ins = [x.bfloat16(), g.bfloat16(), b.float(), xb.bfloat16()]
    ins = [t.to(DEVICE).requires_grad_() for t in ins]
    y = fk.bias_sigmoid_gate(*ins[:3], x_bias=ins[3])
    y.backward(dy.bfloat16().to(DEVICE))
    ref_ins = [t.detach().cpu().double().requires_grad_() for t in ins]
    ref.bias_sigmoid_gate(*ref_ins[:3], x_bias=ref_ins[3]).backward(dy.bfloat16().double())
    for a, r in zip(ins, ref_ins):
        assert a.grad.dtype == a.dtype
        assert rel_err(a.grad, r.grad) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_dropout_residual_shared_row_mask(dtype):
    s, n, c = 3, 7, 20
    x, res, b = _rand(2, s, n, c, seed=4), _rand(2, s, n, c, seed=5), _rand(c, seed=6)
    # AF2 row-wise dropout: one mask per (batch, residue, channel), shared by the S rows
    keep = torch.rand(2, 1, n, c, generator=torch.Generator().manual_seed(7)) > 0.25
    mask = keep.float() / 0.75
    _run(fk.bias_dropout_residual, ref.bias_dropout_residual, [x, res, b], dtype, [True] * 3,
         extra=(mask.to(dtype),))
    _run(fk.bias_dropout_residual, ref.bias_dropout_residual, [x, res, None], dtype,
         [True, True, False], extra=(None,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.bool])
def test_bias_dropout_residual_scaled_mask(dtype, mask_dtype):
    """A 0/1 mask (bytes or bool, shared along the rows) with its scale 1/(1 - p): the same
    bits as the mask pre-scaled in x's dtype, forward and every gradient, and against the
    float64 reference."""
    s, n, c = 3, 7, 37
    x, res, b = _rand(2, s, n, c, seed=31), _rand(2, s, n, c, seed=32), _rand(c, seed=33)
    keep = torch.rand(2, 1, n, c, generator=torch.Generator().manual_seed(34)) > 0.25
    dy = _rand(2, s, n, c, seed=35).to(dtype).to(DEVICE)
    outs = []
    for mask, scale in ((keep.to(mask_dtype), 1 / 0.75), ((keep.float() / 0.75).to(dtype), 1.0)):
        ins = [t.to(dtype).to(DEVICE).clone().requires_grad_() for t in (x, res, b)]
        y = fk.bias_dropout_residual(*ins, mask.to(DEVICE), scale)
        y.backward(dy)
        outs.append((y.detach(), *[t.grad for t in ins]))
    for a, r in zip(*outs):
        assert torch.equal(a, r)
    ref_ins = [t.to(dtype).double().clone().requires_grad_() for t in (x, res, b)]
    y_ref = ref.bias_dropout_residual(*ref_ins, keep.to(mask_dtype), 1 / 0.75)
    y_ref.backward(dy.double().cpu())
    tol = TOL[dtype]
    assert rel_err(outs[0][0], y_ref.double()) < tol
    for a, r in zip(outs[0][1:], ref_ins):
        assert rel_err(a, r.grad) < tol


@pytest.mark.parametrize("case", ["transposed", "four_row_dims"])
def test_bias_dropout_residual_dx_in_x_layout(case):
    """x a permuted view of a dense tensor (the ending-node triangle attention's output): dx is
    written in x's layout, so the layer's own transposes back give it a contiguous gradient.
    A permutation of four row dims, which the kernels' three row dims cannot express, falls
    back to a dense dx. Values against float64 either way; with a bias, dx keeps the same
    layout and the bias gradient, summed from the permuted dx, matches float64 too."""
    c = 24
    if case == "transposed":
        x_base = _rand(3, 7, 5, c, seed=41)
        perm = (0, 2, 1, 3)  # x [3, 5, 7, C]
    else:
        x_base = _rand(7, 5, 2, 3, c, seed=41)
        perm = (2, 1, 3, 0, 4)  # x [2, 5, 3, 7, C]: no two neighbouring row dims merge
    x = x_base.bfloat16().to(DEVICE).requires_grad_().permute(*perm)
    shape = x.shape
    res = _rand(*shape, seed=42).bfloat16().to(DEVICE).requires_grad_()
    gen = torch.Generator().manual_seed(43)
    keep = (torch.rand(*shape[:-2], 1, c, generator=gen) > 0.3).to(DEVICE)  # row-shared
    dy = _rand(*shape, seed=44).bfloat16().to(DEVICE)
    y = fk.bias_dropout_residual(x, res, None, keep, 1.5)
    dx, dres = torch.autograd.grad(y, (x, res), dy)
    assert (dx.stride() == x.stride()) == (case == "transposed")
    assert dx.is_contiguous() == (case != "transposed")
    x64 = x.detach().cpu().double().requires_grad_()
    y64 = ref.bias_dropout_residual(x64, res.detach().cpu().double(), None, keep.cpu(), 1.5)
    (dx64,) = torch.autograd.grad(y64, (x64,), dy.cpu().double())
    assert rel_err(y, y64.detach()) < TOL[torch.bfloat16]
    assert rel_err(dx, dx64) < TOL[torch.bfloat16] and torch.equal(dres, dy)
    bias = _rand(c, seed=45).bfloat16().to(DEVICE).requires_grad_()
    dx_b, db = torch.autograd.grad(fk.bias_dropout_residual(x, res, bias, keep, 1.5),
                                   (x, bias), dy)
    assert dx_b.stride() == dx.stride() and torch.equal(dx_b, dx)
    b64 = bias.detach().cpu().double().requires_grad_()
    y64 = ref.bias_dropout_residual(x64, res.detach().cpu().double(), b64, keep.cpu(), 1.5)
    (db64,) = torch.autograd.grad(y64, (b64,), dy.cpu().double())
    assert rel_err(db, db64) < TOL[torch.bfloat16]


def test_bias_dropout_residual_bool_mask_column_shared():
    x, res = _rand(4, 6, 8, seed=8), _rand(4, 6, 8, seed=9)
    keep = torch.rand(4, 1, 8, generator=torch.Generator().manual_seed(10)) > 0.5
    y = fk.bias_dropout_residual(x.to(DEVICE), res.to(DEVICE), None, keep.to(DEVICE))
    assert rel_err(y, res.double() + x.double() * keep.double()) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_mask_bias_pair_bias_and_key_mask(dtype):
    s, h, n = 3, 2, 21
    logits, bias = _rand(s, h, n, n, seed=11), _rand(h, n, n, seed=12)
    mask = torch.rand(s, 1, 1, n, generator=torch.Generator().manual_seed(13)) > 0.3
    mask[1] = False  # fully masked rows: uniform, no gradient
    _run(lambda z, b, m: fk.softmax_mask_bias(z, m, b),
         lambda z, b, m: ref.softmax_mask_bias(z, m, b), [logits, bias], dtype, [True, True],
         extra=(mask,))


def test_softmax_fully_masked_row_is_uniform_and_no_mask_path():
    z = _rand(2, 3, 17, seed=14).to(DEVICE) * 30
    mask = torch.ones(2, 3, 17, dtype=torch.bool, device=DEVICE)
    mask[0, 1] = False
    p = fk.softmax_mask_bias(z, mask)
    torch.testing.assert_close(p[0, 1].cpu(), torch.full((17,), 1 / 17))
    assert rel_err(fk.softmax_mask_bias(z), torch.softmax(z.double().cpu(), -1)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_output_gradients_are_read_in_place(dtype):
    """dY as the model hands it over (a transposed view from the incoming triangle update, or a
    broadcast of stride 0): the backward kernels read it through strides, no contiguous copy,
    with the same gradients as the float64 reference (odd sizes, dropout mask with holes)."""
    x, g, b = _rand(3, 5, 33, seed=21), _rand(3, 5, 33, seed=22), _rand(33, seed=23)
    res = _rand(3, 5, 33, seed=24)
    keep = (torch.rand(3, 1, 33, generator=torch.Generator().manual_seed(25)) > 0.3) / 0.7
    for dy in (_rand(5, 3, 33, seed=26).to(dtype).transpose(0, 1),
               _rand(33, seed=27).to(dtype).expand(3, 5, 33)):
        assert not dy.is_contiguous()
        for fn, rfn, ins, extra in (
                (fk.bias_sigmoid_gate, ref.bias_sigmoid_gate, (x, g, b), ()),
                (fk.bias_dropout_residual, ref.bias_dropout_residual, (x, res, b),
                 (keep.to(dtype),))):
            ts = [t.to(dtype).to(DEVICE).clone().requires_grad_() for t in ins]
            fn(*ts, *[e.to(DEVICE) for e in extra]).backward(dy.to(DEVICE))
            rs = [t.to(dtype).double().clone().requires_grad_() for t in ins]
            rfn(*rs, *[e.double() for e in extra]).backward(dy.double())
            for a, r in zip(ts, rs):
                assert rel_err(a.grad, r.grad) < TOL[dtype], fn.__name__
