"""One-pass reductions (fold_kernels.one_pass): the last programs of a grid add its partial rows.

Under the interpreter the groups have 2 programs, so grids of 3 and more take both levels (group
sums, then the top sum); on a GPU they have 32, and the tests that need many programs run there.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl
from fold_kernels import one_pass
from fold_kernels.layer_norm import ln_backward, ln_forward
from fold_kernels.one_pass import finish_sum
from fold_kernels.reduce import column_sum

reduce_mod = importlib.import_module("fold_kernels.reduce")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


@triton.jit
def _rows_then_finish(P, Out, Cnt, ld, n_cols, GROUP: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_M: tl.constexpr):
    """Program p stores the row ``(p + 1) * (j + 1)`` for columns j, then finishes the sum."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_M)
    val = (pid + 1).to(tl.float32) * (offs + 1).to(tl.float32)
    tl.store(P + pid * ld + offs, val, mask=offs < n_cols)
    finish_sum(P, Out, Cnt, pid, tl.num_programs(0), ld, 0, n_cols, GROUP, BLOCK_S, BLOCK_M)


@pytest.mark.parametrize("n_prog,group", [(1, 2), (2, 2), (3, 2), (7, 2), (7, 3), (9, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finish_sum_adds_every_row_once_and_resets_its_counters(n_prog, group, dtype):
    n_cols = 5
    n_groups = triton.cdiv(n_prog, group)
    p = torch.full((n_prog + n_groups, n_cols), float("nan"), device=DEV)  # unwritten: NaN
    out = torch.full((n_cols,), float("nan"), device=DEV, dtype=dtype)
    cnt = torch.zeros(1 + n_groups + 2, dtype=torch.int32, device=DEV)  # 2 guard slots
    _rows_then_finish[(n_prog,)](p, out, cnt, n_cols, n_cols, GROUP=group, BLOCK_S=2,
                                 BLOCK_M=8)
    # sum_p (p + 1) * (j + 1): integers, exact in fp32 and here in bf16 (at most 45 * 5)
    expect = torch.arange(1, n_cols + 1, dtype=torch.float64) * (n_prog * (n_prog + 1) / 2)
    assert torch.equal(out.double().cpu(), expect.to(dtype).double())
    assert torch.count_nonzero(cnt).item() == 0  # every counter it used is back at zero


@pytest.mark.parametrize("m,c", [(1, 7), (5, 3), (67, 37), (301, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_sum_one_pass_matches_two_pass_and_float64(monkeypatch, m, c, dtype):
    x = torch.randn(m, c, dtype=torch.float64).to(dtype).to(DEV)
    ref = x.double().sum(0)
    one = column_sum(x, torch.float32)
    monkeypatch.setenv("FOLD_KERNELS_ONE_PASS", "0")
    two = column_sum(x, torch.float32)
    # fp32 sums of <= 301 terms of |x| < 6 in different trees: ~1e-6 relative to the sum of |x|
    tol = 1e-5 * x.double().abs().sum(0).max().item()
    assert (one.double() - ref).abs().max().item() <= tol
    assert (one.double() - two.double()).abs().max().item() <= tol


def test_column_sum_transposed_input_several_column_blocks():
    # the interpreter's column blocks are 16 wide: 3 blocks, each its own counters
    x = torch.randn(37, 211, dtype=torch.float64).to(DEV).t()  # [211, 37], strides (1, 211)
    out = column_sum(x.float(), torch.float64)
    torch.testing.assert_close(out, x.sum(0), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("rows,c", [(3, 7), (41, 33), (150, 19)])
def test_ln_backward_one_pass_weight_and_bias_gradients(monkeypatch, rows, c):
    x = torch.randn(rows, c, dtype=torch.float64)
    w, b = torch.randn(c, dtype=torch.float64), torch.randn(c, dtype=torch.float64)
    dy = torch.randn(rows, c, dtype=torch.float64)
    xd = x.clone().requires_grad_()
    wd, bd = w.clone().requires_grad_(), b.clone().requires_grad_()
    rx, rw, rb = torch.autograd.grad(torch.nn.functional.layer_norm(xd, (c,), wd, bd), (xd, wd, bd),
                                     dy)
    xf, wf, bf, dyf = (t.float().to(DEV) for t in (x, w, b, dy))
    _, mean, rstd = ln_forward(xf, wf, bf, 1e-5)
    dx, dw, db = ln_backward(dyf, xf, wf, mean, rstd, torch.float32, torch.bfloat16)
    assert dw.dtype == torch.float32 and db.dtype == torch.bfloat16
    torch.testing.assert_close(dx.double().cpu(), rx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double().cpu(), rw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db.double().cpu(), rb, rtol=1e-2, atol=1e-2)  # bf16 output
    monkeypatch.setenv("FOLD_KERNELS_ONE_PASS", "0")
    dx2, dw2, db2 = ln_backward(dyf, xf, wf, mean, rstd, torch.float32, torch.bfloat16)
    assert torch.equal(dx, dx2)  # dx does not depend on how dw and db are added
    torch.testing.assert_close(dw, dw2, rtol=1e-5, atol=1e-5)


def test_counters_are_per_stream_and_fresh_under_the_interpreter():
    a, b = one_pass.counters(torch.device(DEV)), one_pass.counters(torch.device(DEV))
    assert a.shape == (one_pass.SLOTS,) and a.dtype == torch.int32
    assert torch.count_nonzero(a).item() == 0
    if not CUDA:
        assert a.data_ptr() != b.data_ptr()  # the interpreter: one buffer per call
        return
    assert a.data_ptr() == b.data_ptr()  # one buffer per (device, stream)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert one_pass.counters(torch.device("cuda")).data_ptr() != a.data_ptr()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="many programs per reduction need a GPU")
def test_one_pass_on_many_programs_same_bits_every_call_and_counters_zero():
    torch.manual_seed(0)
    x = torch.randn(65536, 128, device="cuda", dtype=torch.bfloat16)
    ref = x.double().sum(0)
    first = column_sum(x, torch.float32)
    assert (first.double() - ref).abs().max().item() <= 1e-5 * x.double().abs().sum(0).max()
    for _ in range(200):  # a race between the programs would show as different bits
        assert torch.equal(column_sum(x, torch.float32), first)
    xl = torch.randn(96, 97, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    _, mean, rstd = ln_forward(xl, w, torch.zeros_like(w), 1e-5)
    dy = torch.randn_like(xl)
    _, dw0, db0 = ln_backward(dy, xl, w, mean, rstd)
    for _ in range(100):
        _, dw, db = ln_backward(dy, xl, w, mean, rstd)
        assert torch.equal(dw, dw0) and torch.equal(db, db0)
    torch.testing.assert_close(db0.double(), dy.double().sum((0, 1)), rtol=1e-5, atol=1e-3)
    torch.cuda.synchronize()
    assert torch.count_nonzero(one_pass.counters(torch.device("cuda"))).item() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_one_pass_in_a_cuda_graph_replays_like_eager():
    x = torch.randn(65536, 128, device="cuda", dtype=torch.bfloat16)
    column_sum(x, torch.float32)  # warm-up: compile outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        column_sum(x, torch.float32)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = column_sum(x, torch.float32)
    for _ in range(20):
        x.normal_()
        g.replay()
        assert torch.equal(out, column_sum(x, torch.float32))  # same grid: same bits
