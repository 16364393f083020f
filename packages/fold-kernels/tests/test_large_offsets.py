"""Kernels on views whose element offsets pass 2**31, in Triton's CPU interpreter, vs float64.

An ``index * stride`` the kernel computes in int32 wraps once it reaches 2**31 (issue 23: a
4608-residue pair tensor has 2.7e9 elements). Allocating such tensors is out of reach of a CPU
test, but the offsets depend only on the strides: each operand here is a small tensor of values
written into a strided view of a *sparse* file mapping (``torch.from_file``), so an index of 20
times a stride of 2**27 reaches past 2**31 while the test touches a few pages. The view starts
2**31 elements into the mapping, so a wrapped (negative) offset reads mapped zeros: the result is
wrong, not a crash. The interpreter wraps int32 arithmetic as the GPU does.

Each test compares the output and every gradient with the float64 reference on dense copies of
the same values; tolerances as in the kernels' own tests (fp32: 1e-6 elementwise, 1e-5 for
attention's products). On a GPU the same kernels run at real sizes in
test_large_offsets_gpu.py; these views live in host memory, so the tests here are CPU-only.
"""

from __future__ import annotations

import os
import tempfile

import fold_kernels as fk
import pytest
import torch
from fold_kernels.reduce import column_sum
from fold_ops import reference as ref

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="host-memory views for the interpreter; test_large_offsets_gpu.py covers the GPU")

WRAP = 2**31
BIG = 2**27 + 1  # a column or key stride: index 16 times it passes 2**31
BATCH = 2**30 + 4096  # a batch stride: entry 2 times it passes 2**31 (the stride is still i32)


def _sparse(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor over a sparse file: pages are only allocated where written or read."""
    fd, path = tempfile.mkstemp(prefix="fold_large_offsets_")
    try:
        os.ftruncate(fd, numel * torch.empty((), dtype=dtype).element_size())
        return torch.from_file(path, shared=True, size=numel, dtype=dtype)
    finally:  # the mapping keeps the (unlinked) file alive until the tensor goes
        os.close(fd)
        os.unlink(path)


def huge(values: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``values`` copied into a view of ``strides`` (elements) that starts at element 2**31 of
    a sparse mapping: every int32 wrap of an offset into it lands in mapped memory."""
    span = sum((n - 1) * s for n, s in zip(values.shape, strides)) + 1
    storage = _sparse(WRAP + span, values.dtype)
    view = storage.as_strided(values.shape, strides, WRAP)
    view.copy_(values)
    return view


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _rand(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _holes(*shape, seed):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask.view(-1)[::7] = True  # never a row without keys by chance alone
    return mask


def _check(fn, ref_fn, kernel_ins, values, dy_seed, tol, *, n_out=1, no_grad=()):
    """Run ``fn`` on ``kernel_ins`` (huge views or small tensors; the float ones get
    gradients, but those at ``no_grad``) and ``ref_fn`` on float64 copies of ``values``;
    compare outputs and gradients."""
    wants = [t is not None and t.is_floating_point() and i not in no_grad
             for i, t in enumerate(kernel_ins)]
    ins = [t.requires_grad_() if w else t for t, w in zip(kernel_ins, wants)]
    refs = [v.double().requires_grad_() if w else
            (v.double() if v is not None and v.is_floating_point() else v)
            for v, w in zip(values, wants)]
    outs, ref_outs = fn(*ins), ref_fn(*refs)
    if n_out == 1:
        outs, ref_outs = (outs,), (ref_outs,)
    dys = [_rand(*o.shape, seed=dy_seed + i) for i, o in enumerate(outs)]
    torch.autograd.backward(outs, dys)
    torch.autograd.backward(ref_outs, [d.double() for d in dys])
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert rel_err(o, r) < tol, f"output {i}: {rel_err(o, r):.2e}"
    for i, (a, r, w) in enumerate(zip(ins, refs, wants)):
        if w:
            assert a.grad is not None and rel_err(a.grad, r.grad) < tol, f"grad of input {i}"


def test_softmax_column_strides():
    """logits, bias and mask read with a column stride of 2**27: the fused softmax's
    ``cols * stride`` (forward: all three; backward: the mask) must be 64-bit."""
    z, b, m = _rand(3, 20, seed=1), _rand(3, 20, seed=2), _holes(3, 20, seed=3)
    kin = [huge(z, (1, BIG)), huge(m, (1, BIG)), huge(b, (1, BIG))]
    _check(fk.softmax_mask_bias, ref.softmax_mask_bias, kin, [z, m, b], 10, 1e-6)


def test_layer_norm_channel_first_view():
    """Triangle multiplication's ``layer_norm_out(x.movedim(-3, -1))``: LayerNorm reads the
    channel-first product ``[c, I, J]`` through its strides, so channel k sits ``k * I * J``
    elements from channel 0. With c = 128 that passes 2**31 once ``I * J >= 2**31 / 127``,
    i.e. from N = 4113 when the product is not chunked: issue 23's failure at 4608 residues
    (4096 was fine). Here the channel stride is 2**27 (forward, and the backward's x and dx,
    which keeps x's layout)."""
    x, w, b = _rand(24, 2, 3, seed=4), _rand(24, seed=5), _rand(24, seed=6)
    kx = huge(x, (BIG, 3, 1)).movedim(0, -1)  # [I, J, c], channel stride 2**27
    _check(fk.layer_norm, ref.layer_norm, [kx, w.clone(), b.clone()], [x.movedim(0, -1), w, b],
           11, 1e-5)


def test_column_sum_column_stride():
    """column_sum (the bias gradient of linear, LN+linear, SwiGLU) of a transposed-like view."""
    x = _rand(7, 20, seed=7)
    got = column_sum(huge(x, (1, BIG)), torch.float32)
    assert rel_err(got, x.double().sum(0)) < 1e-6


def _attention_packed(proj, bias, mask, gate_bias):
    return fk.evo_attention_packed(proj, 1, bias, mask, gate_bias=gate_bias)


def _attention_packed_ref(proj, bias, mask, gate_bias):
    return ref.attention_packed(proj, 1, bias, mask, 16**-0.5, gate_bias)


def test_evo_attention_packed_key_stride():
    """A packed projection ``[R=1, N=20, 4*H*D]`` whose keys are 2**27 elements apart: the
    kernels' in-tile ``offs_n * stride`` is int32, so the op must hand them a layout in which it
    fits (forward and every backward kernel read q, k, v, gate through it)."""
    proj, bias = _rand(1, 20, 64, seed=8), _rand(1, 20, 20, seed=9)
    mask, gate_bias = _holes(1, 20, seed=10), _rand(16, seed=11)
    kin = [huge(proj, (20 * BIG, BIG, 1)), bias.clone(), mask, gate_bias.clone()]
    _check(_attention_packed, _attention_packed_ref, kin, [proj, bias, mask, gate_bias], 12,
           1e-5)


@pytest.mark.parametrize("dbias", ["atomic", "pass"])
@pytest.mark.parametrize("operand", ["bias", "mask"])
def test_evo_attention_batch_stride(operand, dbias, monkeypatch):
    """Three batch entries of the pair bias (or the key mask) 2**30 elements apart: entry 2
    starts past 2**31, so ``b * stride`` must be 64-bit in every kernel that reads them (the
    bias tile in the forward, dK/dV with atomic dbias, dQ and the dbias pass)."""
    monkeypatch.setenv("FOLD_EVO_DBIAS", dbias)
    b, n, d = 3, 20, 16
    q, k, v, gate = (_rand(b, 1, 1, n, d, seed=s) for s in (13, 14, 15, 16))
    bias, mask = _rand(b, 1, n, n, seed=17), _holes(b, 1, n, seed=18)
    kbias = huge(bias, (BATCH, n * n, n, 1)) if operand == "bias" else bias.clone()
    kmask = huge(mask, (BATCH, n, 1)) if operand == "mask" else mask

    def run(q, k, v, bias, mask, gate):
        return fk.evo_attention(q, k, v, bias, mask, gate=gate)

    def run_ref(q, k, v, bias, mask, gate):
        return ref.attention(q, k, v, bias, mask, d**-0.5, gate)

    kin = [q.clone(), k.clone(), v.clone(), kbias, kmask, gate.clone()]
    _check(run, run_ref, kin, [q, k, v, bias, mask, gate], 19, 1e-5)


# Already 64-bit before issue 23 (their offsets were cast); these keep them so.


def test_gating_column_strides():
    """bias_sigmoid_gate and bias_dropout_residual with operands read 2**27 elements apart."""
    x, g, bias = _rand(3, 20, seed=20), _rand(3, 20, seed=21), _rand(20, seed=22)
    kin = [huge(x, (1, BIG)), huge(g, (1, BIG)), bias.clone()]
    _check(fk.bias_sigmoid_gate, ref.bias_sigmoid_gate, kin, [x, g, bias], 23, 1e-6)
    res, keep = _rand(3, 20, seed=24), (_holes(1, 20, seed=25).float() / 0.7)
    kin = [huge(x, (1, BIG)), huge(res, (1, BIG)), bias.clone(), huge(keep, (1, BIG))]
    _check(fk.bias_dropout_residual, ref.bias_dropout_residual, kin, [x, res, bias, keep], 26,
           1e-6, no_grad=(3,))  # the dropout mask has no gradient


def test_triangle_projection_gate_channel_stride():
    """proj ``[4c=8, I, J]`` with its channels 2**29 elements apart (channel 7 at 3.8e9)."""
    proj, bias, mask = _rand(8, 4, 5, seed=27), _rand(8, seed=28), _holes(4, 5, seed=29)
    kin = [huge(proj, (2**29, 5, 1)), bias.clone(), mask]
    _check(fk.triangle_projection_gate, ref.triangle_projection_gate, kin, [proj, bias, mask],
           30, 1e-6, n_out=2)


# What cannot be indexed in 32 bits is refused before anything is allocated or launched.


def test_refuses_rows_past_int32():
    rows = torch.zeros(1, 1).expand(WRAP, 1)  # 2**31 rows of 1: a view, nothing allocated
    w = torch.ones(1)
    with pytest.raises(ValueError, match="32-bit row index"):
        fk.layer_norm(rows, w, w)
    with pytest.raises(ValueError, match="32-bit row index"):
        fk.softmax_mask_bias(rows)
    with pytest.raises(ValueError, match="32-bit row index"):
        fk.bias_sigmoid_gate(rows, rows)
    with pytest.raises(ValueError, match="32-bit row index"):
        column_sum(rows)


def test_evo_attention_refuses_unindexable_shapes():
    q = torch.zeros(1, 1, 1, 46341, 16)
    bias = torch.zeros(1, 1, 1).expand(1, 46341, 46341)
    with pytest.raises(ValueError, match="N <= 46340"):
        fk.evo_attention(q, q, q, bias)
    rows = torch.zeros(1, 1, 1, 16).expand(65536, 1, 4, 16)  # R = 65536 rows
    with pytest.raises(ValueError, match="CUDA allows 65535"):
        fk.evo_attention(rows, rows, rows)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_evo_attention_packed_non_contiguous(layout):
    """A packed projection sliced along R with two batch entries, or a dense one with R and N
    swapped in memory: the kernels write the packed gradient through the projection's strides,
    so the op must hand them one whose strides the gradient buffer shares (before: a dense
    ``[B, R, N, P*H*D]`` buffer, into which the sliced layout wrote past the end and the
    transposed one wrote rows to the wrong places)."""
    if layout == "sliced":
        parent = _rand(2, 5, 12, 64, seed=31)
        proj, kproj = parent[:, 1:3], parent.clone()[:, 1:3]  # batch stride 5 * 12 * 64
    else:
        parent = _rand(2, 12, 2, 64, seed=31)
        proj, kproj = parent.transpose(1, 2), parent.clone().transpose(1, 2)  # [B, R, N, 64]
    bias, mask = _rand(2, 1, 12, 12, seed=32), _holes(2, 2, 12, seed=33)
    gate_bias = _rand(16, seed=34)
    kin = [kproj, bias.clone(), mask, gate_bias.clone()]
    _check(_attention_packed, _attention_packed_ref, kin, [proj, bias, mask, gate_bias], 35,
           1e-5)
