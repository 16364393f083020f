"""Per-block overheads of DAP / DAO that do not change results (README "Overheads"):

* under activation checkpointing, the recomputation of a block stops before the block's DAO
  ``wait``, so the MSA ``col_to_row`` must not be launched there (it would be sent for nothing);
  with it, a checkpointed Evoformer block issues 6 all-to-alls in forward and 4 + 6 in backward
  (recomputed pair/MSA transposes + the dual all-to-alls), not 5 + 6;
* synchronous collectives are issued with ``async_op=False`` (on NCCL: the current stream, no
  side stream and no tensor stashing); only DAO's overlapped collectives are asynchronous;
* :func:`fold_parallel.dao.in_backward` tells a backward pass (where checkpoint recomputes) from a
  forward pass.
Outputs and gradients of the same configurations are checked in ``test_equivalence.py``.
"""

from __future__ import annotations

import pytest
import torch
from _dist import ok, rel_err, run_ranks

pytestmark = pytest.mark.distributed

P = 2


def _checkpointed_counts(rank: int, world: int, overlap: bool) -> dict:
    import _models
    from fold_parallel import DapComm, enable_dap
    from fold_parallel.volume import CommRecorder

    _models.N_SEQ, _models.N_RES, _models.B = 6, 8, 1
    stack = _models.build("evoformer", "af2", n_blocks=1)
    args = _models.inputs("evoformer", stack)
    stack.checkpoint_blocks = True
    stack.train()
    for block in stack.blocks:
        block.msa_dropout = block.pair_dropout = 0.0
    enable_dap(stack, DapComm(None, "fallback", overlap_forward=overlap,
                              overlap_backward=overlap), check_shapes=False)
    with CommRecorder() as fwd:
        out = stack(*args)
    loss = sum((o * torch.randn_like(o)).sum() for o in out)
    with CommRecorder() as bwd:
        loss.backward()
    return {"fwd": fwd.counts(), "bwd": bwd.counts()}


@pytest.mark.parametrize("overlap", [False, True])
def test_recomputation_sends_no_unwaited_all_to_all(overlap):
    for res in ok(run_ranks(_checkpointed_counts, P, overlap)):
        assert res["fwd"]["all_to_all"] == 6, res
        # Recomputation: MSA row_to_col + the pair's row_to_col, col_to_row, row_to_col (the
        # pair's last col_to_row and the MSA's col_to_row come after the last saved tensor).
        assert res["bwd"]["all_to_all"] == 4 + 6, res


def _async_flags(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from fold_parallel import dao
    from fold_parallel.comm import Collectives, scatter

    seen: list[bool] = []
    native = dist.all_to_all_single

    def spy(*args, **kwargs):
        seen.append(bool(kwargs.get("async_op", False)))
        return native(*args, **kwargs)

    dist.all_to_all_single = spy
    try:
        coll = Collectives(None, impl="native")
        g = torch.Generator().manual_seed(3)
        X = torch.randn(3, 6, 4, 5, generator=g, dtype=torch.float64)
        sync = coll.all_to_all(scatter(X, -3, coll), -2, -3)
        n_sync_works = len(sync._works)
        sync_flags = list(seen)
        seen.clear()
        handle = dao.start_all_to_all(scatter(X, -3, coll), -2, -3, coll)
        out = dao.wait(handle)
        return {
            "sync_flags": sync_flags,
            "sync_works": n_sync_works,
            "dao_flags": list(seen),
            "err": rel_err(out, X.chunk(P, -2)[rank]),
        }
    finally:
        dist.all_to_all_single = native


def test_synchronous_collectives_are_not_async_ops():
    for res in ok(run_ranks(_async_flags, P)):
        assert res["sync_flags"] == [False] and res["sync_works"] == 0, res
        assert res["dao_flags"] == [True], res  # the forward overlap of DAO
        assert res["err"] < 1e-15, res


def test_in_backward_sees_the_backward_pass():
    from fold_parallel.dao import in_backward

    seen: list[bool] = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(in_backward())
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            seen.append(in_backward())
            return g * 2.0

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    Probe.apply(x).sum().backward()
    assert seen == [False, True]
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
