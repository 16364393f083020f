"""Autograd collectives and DAO pairs on 2 gloo ranks against single-process math.

For each collective, rank r's output must equal what a single process computes for rank r, and
the gradient of ``sum_r sum(out_r * W_r)`` with respect to the replicated input (each rank's grad
summed over ranks) must equal the single-process gradient. Both backends are checked: native
(gloo's all_to_all_single / reduce_scatter_tensor) and the fallback (p2p all-to-all, list
all-gather, all-reduce + slice), in float64 so the comparison is exact up to rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _dist import ok, rel_err, run_ranks

pytestmark = pytest.mark.distributed

P = 2
SHAPE = (3, 6, 4, 5)  # [B, A, B', C] with A, B' divisible by P; odd other dims


def _weights(shape, rank, dtype):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(shape, generator=g, dtype=dtype)


def _whole(dtype, stacked=False):
    g = torch.Generator().manual_seed(7)
    shape = (P, *SHAPE) if stacked else SHAPE
    return torch.randn(shape, generator=g, dtype=dtype)


def _cases():
    """name -> (stacked input?, dist op(x_local, coll), local op(X, r)) where x_local is rank r's
    input derived from the leaf X."""
    from fold_parallel import comm as C

    ch = lambda x, d, r: x.chunk(P, d)[r]
    return {
        "gather_-3": (False, lambda X, c: C.all_gather(C.scatter(X, -3, c), -3, c),
                      lambda X, r: X),
        "gather_-2": (False, lambda X, c: C.all_gather(C.scatter(X, -2, c), -2, c),
                      lambda X, r: X),
        "reduce_scatter_-3": (True, lambda X, c: C.reduce_scatter(X[c.rank], -3, c),
                              lambda X, r: ch(X.sum(0), -3, r)),
        "row_to_col": (False, lambda X, c: C.all_to_all(C.scatter(X, -3, c), -2, -3, c),
                       lambda X, r: ch(X, -2, r)),
        "col_to_row": (False, lambda X, c: C.all_to_all(C.scatter(X, -2, c), -3, -2, c),
                       lambda X, r: ch(X, -3, r)),
        "all_reduce": (True, lambda X, c: C.all_reduce(X[c.rank], c), lambda X, r: X.sum(0)),
        "broadcast_1": (True, lambda X, c: C.broadcast(X[c.rank], 1, c), lambda X, r: X[1]),
        "dao_row_to_col": (False, _dao_row_to_col, lambda X, r: ch(X, -2, r) * 2.0),
        "dao_gather": (False, _dao_gather, lambda X, r: X + 1.0),
    }


def _dao_row_to_col(X, c):
    from fold_parallel import dao
    from fold_parallel.comm import scatter

    h = dao.start_all_to_all(scatter(X, -3, c), -2, -3, c)
    _independent = (X * 3.0).sum()  # work between start and wait
    return dao.wait(h) * 2.0 + 0.0 * _independent


def _dao_gather(X, c):
    from fold_parallel import dao
    from fold_parallel.comm import scatter

    h = dao.start_all_gather(scatter(X, -2, c), -2, c, overlap_backward=False)
    return dao.wait(h) + 1.0


def _check_collectives(rank: int, world: int, impl: str) -> dict[str, tuple[float, float]]:
    from fold_parallel.comm import Collectives

    coll = Collectives(None, impl=impl)
    errs = {}
    for name, (stacked, op, local) in _cases().items():
        X = _whole(torch.float64, stacked).requires_grad_(True)
        out = op(X, coll)
        w = _weights(out.shape, rank, torch.float64)
        (out * w).sum().backward()
        grad = X.grad.clone()
        dist.all_reduce(grad)
        # Single process: the sum over ranks of each rank's loss.
        Xs = _whole(torch.float64, stacked).requires_grad_(True)
        total = sum((local(Xs, r) * _weights(out.shape, r, torch.float64)).sum() for r in range(P))
        total.backward()
        errs[name] = (rel_err(out, local(Xs.detach(), rank)), rel_err(grad, Xs.grad))
    return errs


@pytest.mark.parametrize("impl", ["native", "fallback"])
def test_collectives_forward_and_backward(impl):
    for errs in ok(run_ranks(_check_collectives, P, impl)):
        for name, (e_out, e_grad) in errs.items():
            assert e_out < 1e-14, (impl, name, e_out)
            assert e_grad < 1e-14, (impl, name, e_grad)


def _check_bf16(rank: int, world: int) -> tuple[float, float, str]:
    from fold_parallel import comm as C

    coll = C.Collectives(None, impl="fallback", comm_dtype=torch.bfloat16)
    X = _whole(torch.float32).requires_grad_(True)
    out = C.all_to_all(C.scatter(X, -3, coll), -2, -3, coll)
    (out * _weights(out.shape, rank, torch.float32)).sum().backward()
    return rel_err(out, X.detach().chunk(P, -2)[rank]), float(out.ne(out).sum()), str(out.dtype)


def test_bf16_communication():
    for e_out, n_nan, dtype in ok(run_ranks(_check_bf16, P)):
        assert dtype == "torch.float32"  # cast back after the wire
        assert n_nan == 0
        assert 1e-5 < e_out < 1e-2  # really sent in bf16 (8-bit mantissa), no worse


def _check_errors(rank: int, world: int) -> list[str]:
    from fold_parallel import comm as C

    coll = C.Collectives(None, impl="fallback")
    msgs = []
    try:
        C.all_to_all(torch.randn(3, 5, 4), -2, -3, coll)  # 5 not divisible by 2
    except Exception as err:  # noqa: BLE001
        msgs.append(str(err))
    try:
        C.Collectives(None, impl="mpi")
    except ValueError as err:
        msgs.append(str(err))
    return msgs


def test_bad_arguments_give_clear_errors():
    for msgs in ok(run_ranks(_check_errors, P)):
        assert "not divisible by the group size 2" in msgs[0]
        assert "impl must be" in msgs[1]
