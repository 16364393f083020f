"""``column_sum`` (the bias gradient's reduction), the tiled ``sum_partials`` and the ``linear``
op whose backward uses them, against float64 references: odd sizes, strided inputs, every
gradient, determinism, NaN."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fold_kernels import linear
from fold_kernels.broadcast import reduce_to
from fold_kernels.reduce import column_sum, column_sum_fits, sum_partials

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 sums of fp32 values: ~1e-6 relative; bf16/fp16 outputs: one rounding of the fp32 sum
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any(), "NaN in the result"
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,c", [(1, 1), (5, 3), (67, 37), (301, 130)])
def test_column_sum_matches_float64(dtype, m, c):
    g = torch.Generator().manual_seed(m * 1000 + c)
    x64 = torch.randn(m, c, generator=g, dtype=torch.float64)
    x = x64.to(dtype)
    out = column_sum(x.to(DEVICE))
    assert out.dtype == dtype and out.shape == (c,)
    assert _rel(out, x.double().sum(0)) < TOL[dtype]
    assert torch.equal(out, column_sum(x.to(DEVICE)))  # deterministic: the same bits


def test_column_sum_reads_strides_and_writes_the_requested_dtype():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(41, 2 * 19, generator=g)
    strided = base.to(DEVICE)[:, ::2]  # column stride 2
    transposed = torch.randn(23, 53, generator=g).to(DEVICE).t()  # [53, 23], row stride 1
    for x in (strided, transposed):
        out = column_sum(x, torch.float32)
        assert _rel(out, x.double().sum(0)) < 1e-5
    out = column_sum(strided.to(torch.bfloat16), torch.float32)
    assert out.dtype == torch.float32
    assert _rel(out, strided.to(torch.bfloat16).double().sum(0)) < 1e-5  # fp32 accumulation


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("full,shape,transpose,kernel", [
    ((3, 5, 33), (33,), None, True),          # a [C] bias: the column-sum kernel
    ((2, 3, 7, 20), (1, 7, 20), None, True),  # a mask shared by dim 1's rows, leading dim summed
    # grad with its row dims transposed (a dense permutation): its storage's rows, the kernel
    ((3, 5, 33), (33,), (0, 1), True),
    ((2, 3, 7, 20), (7, 20), (0, 1), True),
    ((2, 3, 7, 20), (7, 20), (1, 2), False),  # a summed dim inside the [7, 20] block: torch
    ((3, 5, 33), (33,), (1, 2), False),       # the columns strided: no [M, C] view, torch
    ((2, 3, 1, 9), (2, 1, 1, 9), None, False),  # a middle dim summed: torch's sum
    ((4, 6), (4, 6), None, False),            # nothing to sum: a cast
])
def test_reduce_to_sums_broadcast_dims_like_float64(dtype, full, shape, transpose, kernel,
                                                    monkeypatch):
    import fold_kernels.broadcast as bc

    calls = []
    monkeypatch.setattr(bc, "column_sum", lambda x, dt: calls.append(x.shape) or column_sum(x, dt))
    g = torch.Generator().manual_seed(len(full) * 100 + full[-1])
    base = torch.randn(*full, generator=g, dtype=torch.float64)
    grad = base.to(dtype).to(DEVICE)
    if transpose:  # same values, other strides
        grad = grad.transpose(*transpose).contiguous().transpose(*transpose)
        assert not grad.is_contiguous()
    out = reduce_to(grad, torch.Size(shape), torch.float32)
    expanded = [d for d in range(len(full)) if d < len(full) - len(shape)
                or shape[d - len(full) + len(shape)] == 1 and full[d] != 1]
    want = grad.double().cpu().sum(dim=expanded, keepdim=False).reshape(shape) \
        if expanded else grad.double().cpu()
    assert out.dtype == torch.float32 and tuple(out.shape) == shape
    assert bool(calls) == kernel, calls
    assert _rel(out, want) < 1e-5  # fp32 sums of the dtype's values
    assert torch.equal(out, reduce_to(grad, torch.Size(shape), torch.float32))  # deterministic


def test_column_sum_fits_bounds_the_grid():
    assert column_sum_fits(10, 128)
    assert not column_sum_fits(2, 10**9)  # column blocks past CUDA's 65535 grid y programs


def test_column_sum_empty_nan_and_bad_shape():
    assert torch.equal(column_sum(torch.empty(0, 4, device=DEVICE)).cpu(), torch.zeros(4))
    x = torch.randn(9, 5)
    x[4, 3] = float("nan")
    out = column_sum(x.to(DEVICE)).cpu()
    assert out[3].isnan() and not out[[0, 1, 2, 4]].isnan().any()
    with pytest.raises(ValueError, match=r"column_sum: x must be \[M, C\]"):
        column_sum(torch.randn(2, 3, 4, device=DEVICE))


def test_sum_partials_many_rows_in_tiles():
    """More partial rows than one tile holds (the LayerNorm's 4 x SMs rows): fixed order."""
    g = torch.Generator().manual_seed(5)
    p = torch.randn(70, 2, 45, generator=g, dtype=torch.float64)
    out = sum_partials(p.float().to(DEVICE), torch.float32)
    assert _rel(out, p.sum(0)) < 1e-6
    assert torch.equal(out, sum_partials(p.float().to(DEVICE), torch.float32))


def _linear_inputs(dtype, seed, shape=(2, 5, 7), k=19, n=13):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, k, generator=g, dtype=torch.float64)
    w = torch.randn(n, k, generator=g, dtype=torch.float64) / k**0.5
    b = torch.randn(n, generator=g, dtype=torch.float64)
    dy = torch.randn(*shape, n, generator=g, dtype=torch.float64)
    return x, w, b, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_output_and_every_gradient(dtype):
    x, w, b, dy = _linear_inputs(dtype, seed=1)
    ref_leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    F.linear(*ref_leaves).backward(dy)
    leaves = [t.to(DEVICE, dtype).requires_grad_() for t in (x, w, b)]
    y = linear(*leaves)
    y.backward(dy.to(DEVICE, dtype))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert y.dtype == dtype
    assert _rel(y, F.linear(x, w, b)) < tol
    for got, ref in zip(leaves, ref_leaves):
        assert got.grad.dtype == dtype
        assert _rel(got.grad, ref.grad) < tol


def test_linear_strided_input_and_partial_grads():
    """A transposed (non-contiguous) input is read as it is; only the bias and weight need
    gradients (x is a constant): dx is not computed."""
    x, w, b, dy = _linear_inputs(torch.float32, seed=2, shape=(3, 11), k=6, n=9)
    xt = x.transpose(0, 1).contiguous().to(DEVICE).float().transpose(0, 1)  # [3, 11, 6] strided
    assert not xt.is_contiguous()
    wl, bl = (t.to(DEVICE).float().requires_grad_() for t in (w, b))
    linear(xt, wl, bl).backward(dy.to(DEVICE).float())
    ref = [t.clone().requires_grad_() for t in (w, b)]
    F.linear(x, *ref).backward(dy)
    assert _rel(wl.grad, ref[0].grad) < 1e-5 and _rel(bl.grad, ref[1].grad) < 1e-5


def test_linear_refuses_mixed_dtypes_and_wrong_bias():
    x = torch.randn(4, 6, device=DEVICE)
    w = torch.randn(5, 6, device=DEVICE)
    with pytest.raises(ValueError, match="share a dtype"):
        linear(x, w, torch.zeros(5, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"bias must be \[5\]"):
        linear(x, w, torch.zeros(4, device=DEVICE))
    assert torch.equal(linear(x, w), F.linear(x, w))  # no bias: F.linear itself
