"""The host-side helpers of the kernels' hot path: plain-Python broadcasting, the one-launch
second stage of the two-stage reductions, and the memoised architecture / configurations."""

from __future__ import annotations

import itertools

import pytest
import torch
from fold_kernels import tuning
from fold_kernels.broadcast import broadcast_shape
from fold_kernels.layer_norm import layer_norm
from fold_kernels.reduce import sum_partials

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_broadcast_shape_matches_torch():
    dims = [(), (1,), (3,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (4, 2, 1), (5, 3), (1, 1, 1)]
    for a, b, c in itertools.product(dims, repeat=3):
        try:
            want = tuple(torch.broadcast_shapes(a, b, c))
        except RuntimeError:
            want = None
        assert broadcast_shape(a, b, c) == want, (a, b, c)
    assert broadcast_shape() == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("s", [1, 3, 7, 20, 600])  # 20, 600: a tree of groups (8 / 256 rows)
def test_sum_partials_fixed_order_and_dtype(dtype, s):
    g = torch.Generator().manual_seed(s)
    p = torch.randn(s, 2, 37, generator=g, dtype=torch.float64)  # odd size, several blocks
    out = sum_partials(p.float().to(DEVICE), dtype)
    assert out.dtype == dtype and out.shape == (2, 37)
    ref = p.sum(0)  # fp64 reference
    # fp32 sum of s terms, then one rounding to the output dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol * s, rtol=tol)
    again = sum_partials(p.float().to(DEVICE), dtype)
    assert torch.equal(out, again)  # deterministic


def test_sum_partials_propagates_nan():
    p = torch.zeros(3, 5)
    p[1, 2] = float("nan")
    out = sum_partials(p.to(DEVICE), torch.float32).cpu()
    assert out[2].isnan() and not out[[0, 1, 3, 4]].isnan().any()


def test_layer_norm_grads_in_each_parameter_dtype():
    """fp32 LayerNorm parameters with a bf16 input: dweight/dbias come back in fp32, equal to an
    fp64 reference within bf16 rounding of x and dy (the statistics are fp32)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 40, generator=g).to(torch.bfloat16)
    w = torch.randn(40, generator=g)
    b = torch.randn(40, generator=g, dtype=torch.float64).to(torch.float16)  # a third dtype
    dy = torch.randn(3, 7, 40, generator=g).to(torch.bfloat16)
    xs, ws, bs = (t.to(DEVICE).clone().requires_grad_() for t in (x, w, b))
    layer_norm(xs, ws, bs).backward(dy.to(DEVICE))
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.layer_norm(xr, (40,), wr, br).backward(dy.double())
    assert ws.grad.dtype == torch.float32 and bs.grad.dtype == torch.float16
    torch.testing.assert_close(ws.grad.double().cpu(), wr.grad, atol=0.05, rtol=0.02)
    torch.testing.assert_close(bs.grad.double().cpu(), br.grad, atol=0.05, rtol=0.01)


def test_arch_and_configs_are_memoised():
    assert tuning.arch() == tuning.arch()
    a = tuning.attention_configs("fwd", "sm90", 32)
    a.pop()  # callers get their own list: the memo is not mutated
    assert len(tuning.attention_configs("fwd", "sm90", 32)) == len(a) + 1
    assert tuning.gemm_configs("sm90") == tuning.gemm_configs("sm90")


@pytest.mark.parametrize("layout", ["transposed", "sliced", "broadcast_dy"])
def test_layer_norm_reads_strided_inputs_in_place(layout):
    """x as a transposed view (MSA column attention, incoming triangle ops), a non-dense slice,
    or with a broadcast (stride 0) output gradient: y contiguous, dx in x's layout when x is
    dense, values equal to an fp64 reference (fp32: 1e-5 relative)."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(2, 7, 5, 24, generator=g)
    if layout == "sliced":
        x = torch.randn(2, 7, 5, 48, generator=g)[..., ::2]  # C stride 2: not dense
    else:
        x = base.transpose(-2, -3)  # [2, 5, 7, 24] view
    w, b = torch.randn(24, generator=g), torch.randn(24, generator=g)
    dy = torch.randn(x.shape, generator=g)
    if layout == "broadcast_dy":
        dy = torch.randn(24, generator=g).expand(x.shape)
    xs = x.detach().to(DEVICE).requires_grad_()
    ws, bs = (t.to(DEVICE).clone().requires_grad_() for t in (w, b))
    y = layer_norm(xs, ws, bs)
    assert y.is_contiguous() and y.shape == x.shape
    y.backward(dy.to(DEVICE))
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = torch.nn.functional.layer_norm(xr, (24,), wr, br)
    yr.backward(dy.double())
    for a, ref in ((y, yr), (xs.grad, xr.grad), (ws.grad, wr.grad), (bs.grad, br.grad)):
        a = a.detach().double().cpu()
        assert torch.isfinite(a).all()
        assert ((a - ref).norm() / ref.norm()).item() < 1e-5
    if layout == "transposed":
        assert xs.grad.stride() == xs.stride()  # dx in x's layout: the transpose back is free
