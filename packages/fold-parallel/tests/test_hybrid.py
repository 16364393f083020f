"""Hybrid DP x DAP, DP x BP, BP x DAP and DAP-4 alone on 4 gloo ranks: the averaged gradients
equal the mean over the DP samples of the single-process gradients, and each sample's outputs are
its single-process outputs (float64, so the comparison is to rounding). DAP runs with both DAO
overlaps on (``DapComm``'s default) unless the case says ``dao=False``."""

from __future__ import annotations

import pytest
import torch
from _dist import ok, run_ranks
from _models import build, compare, fresh, inputs, run

pytestmark = pytest.mark.distributed

TOL = 1e-12


def _hybrid(rank: int, world: int, dp: int, bp: int, dap: int, dao: bool = True) -> dict:
    from fold_parallel import (
        Collectives,
        DapComm,
        ParallelConfig,
        build_groups,
        enable_bp,
        enable_dap,
        sync_gradients,
    )

    groups = build_groups(ParallelConfig(dp=dp, bp=bp, dap=dap))
    kind, order = "evoformer", "parallel" if bp > 1 else "af2"
    stack = build(kind, order)
    samples = [inputs(kind, stack, seed=1 + d) for d in range(dp)]
    refs = [run(*fresh(stack, a, torch.float64), kind) for a in samples]
    ref = refs[groups.dp_index]
    ref.param_grads = {
        n: sum(r.param_grads[n] for r in refs) / dp for n in refs[0].param_grads
    }
    s, a = fresh(stack, samples[groups.dp_index], torch.float64)
    if dap > 1:
        comm = DapComm(groups.dap_group, "fallback", overlap_forward=dao, overlap_backward=dao)
        assert comm.size == dap and comm.dao == dao
        enable_dap(s, comm)
    if bp > 1:
        enable_bp(s, Collectives(groups.bp_group, impl="fallback", name="BP group"))
    got = run(s, a, kind)
    sync_gradients(s, groups.world_group)
    got.param_grads = {n: p.grad for n, p in s.named_parameters()}
    errs = compare(got, ref)
    errs.pop("input_grads")  # per sample; averaged over the model group only (not tested here)
    return errs


@pytest.mark.slow
@pytest.mark.parametrize(
    "dp,bp,dap,dao",
    [
        (2, 1, 2, True),
        (2, 2, 1, True),
        (1, 2, 2, True),  # BP-2 x DAP-2 with DAO
        (1, 2, 2, False),  # BP-2 x DAP-2, synchronous DAP
        (1, 1, 4, True),  # DAP-4 alone with DAO (N_res 7 -> 8, N_seq 5 -> 8)
    ],
)
def test_hybrid_four_ranks(dp, bp, dap, dao):
    for errs in ok(run_ranks(_hybrid, 4, dp, bp, dap, dao, timeout_s=150)):
        for what in ("outputs", "param_grads"):
            assert errs[what] < TOL, (dp, bp, dap, dao, what, errs[what])


def _subset(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from fold_parallel import ParallelConfig, build_groups

    cfg = ParallelConfig(dp=1, bp=1, dap=2)
    try:
        build_groups(cfg)  # 2 ranks of a 3-rank world: only with subset=True
        refused = False
    except ValueError:
        refused = True
    groups = build_groups(cfg, subset=True)
    if groups is None:
        return {"refused": refused, "groups": None}
    ranks = {k: dist.get_process_group_ranks(getattr(groups, f"{k}_group"))
             for k in ("dap", "bp", "dp", "model", "world")}
    # the job's "world" group works among its ranks while rank 2 is elsewhere
    t = torch.ones(1)
    dist.all_reduce(t, group=groups.world_group)
    return {"refused": refused, "groups": ranks, "sum": float(t), "dap_index": groups.dap_index}


def test_subset_groups_on_the_first_ranks():
    """``build_groups(subset=True)`` with dp x bp x dap = 2 on 3 ranks: ranks 0 and 1 get the
    groups (DAP and model groups over both, BP and DP groups of one), rank 2 gets ``None``."""
    got = ok(run_ranks(_subset, 3, timeout_s=90))
    assert all(g["refused"] for g in got)
    assert got[2]["groups"] is None
    for rank in (0, 1):
        g = got[rank]
        assert g["dap_index"] == rank and g["sum"] == 2.0
        assert g["groups"] == {"dap": [0, 1], "bp": [rank], "dp": [rank], "model": [0, 1],
                               "world": [0, 1]}
