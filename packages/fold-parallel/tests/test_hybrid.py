"""Hybrid DP x DAP, DP x BP and BP x DAP on 4 gloo ranks: the averaged gradients equal the mean
over the DP samples of the single-process gradients, and each sample's outputs are its
single-process outputs (float64, so the comparison is to rounding)."""

from __future__ import annotations

import pytest
import torch
from _dist import ok, run_ranks
from _models import build, compare, fresh, inputs, run

pytestmark = pytest.mark.distributed

TOL = 1e-12


def _hybrid(rank: int, world: int, dp: int, bp: int, dap: int) -> dict:
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
        enable_dap(s, DapComm(groups.dap_group, "fallback"))
    if bp > 1:
        enable_bp(s, Collectives(groups.bp_group, impl="fallback", name="BP group"))
    got = run(s, a, kind)
    sync_gradients(s, groups.world_group)
    got.param_grads = {n: p.grad for n, p in s.named_parameters()}
    errs = compare(got, ref)
    errs.pop("input_grads")  # per sample; averaged over the model group only (not tested here)
    return errs


@pytest.mark.slow
@pytest.mark.parametrize("dp,bp,dap", [(2, 1, 2), (2, 2, 1), (1, 2, 2)])
def test_hybrid_four_ranks(dp, bp, dap):
    for errs in ok(run_ranks(_hybrid, 4, dp, bp, dap, timeout_s=150)):
        for what in ("outputs", "param_grads"):
            assert errs[what] < TOL, (dp, bp, dap, what, errs[what])
