"""Failure behaviour on gloo: a dead rank, or ranks started with different configurations or
input shapes, give a clear error on every surviving rank within the timeout, never a hang."""

from __future__ import annotations

import os
import time

import pytest
import torch
from _dist import RankFailed, run_ranks

pytestmark = pytest.mark.distributed

P = 2
PG_TIMEOUT_S = 4.0


def _dead_rank(rank: int, world: int) -> float:
    from fold_parallel import DapComm

    comm = DapComm(None, "fallback", timeout_s=PG_TIMEOUT_S)
    x = torch.randn(3, 4, 6, 5)
    comm.row_to_col(x)  # both alive: fine
    if rank == 1:
        os._exit(3)  # dies without a word
    time.sleep(0.5)
    start = time.monotonic()
    try:
        comm.row_to_col(x)
        comm.gather(x, -3)
    finally:
        # Reported through the exception, with the time it took.
        elapsed = time.monotonic() - start
        print(f"elapsed {elapsed:.1f}")
    return elapsed


def test_dead_rank_gives_clear_error_on_survivor():
    t0 = time.monotonic()
    results = run_ranks(_dead_rank, P, timeout_s=60, pg_timeout_s=PG_TIMEOUT_S)
    assert time.monotonic() - t0 < 45
    survivor, dead = results
    assert isinstance(dead, RankFailed) and dead.error_type == "Died"
    assert isinstance(survivor, RankFailed), survivor
    assert survivor.error_type == "CollectiveError", survivor
    assert "all_to_all" in survivor.message or "all_gather" in survivor.message
    assert "DAP group" in survivor.message and "peer rank died" in survivor.message


def _mismatched_config(rank: int, world: int) -> str:
    from fold_parallel import ParallelConfig, build_groups

    # Rank 1 was launched with --dap 1 --dp 2 instead of --dap 2.
    cfg = ParallelConfig(dap=2) if rank == 0 else ParallelConfig(dp=2)
    build_groups(cfg)
    return "no error"


def test_different_configurations_fail_on_every_rank():
    results = run_ranks(_mismatched_config, P, timeout_s=60, pg_timeout_s=PG_TIMEOUT_S)
    for r in results:
        assert isinstance(r, RankFailed) and r.error_type == "ConsistencyError", r
        assert "parallel_config" in r.message and "rank 0" in r.message and "rank 1" in r.message


def _mismatched_shapes(rank: int, world: int) -> str:
    from _models import build, inputs
    from fold_parallel import DapComm, enable_dap

    stack = build("template")
    t, pair_mask = inputs("template", stack)
    if rank == 1:  # a different crop on rank 1
        t, pair_mask = t[:, :, :5, :5], pair_mask[:, :5, :5]
    enable_dap(stack, DapComm(None, "fallback", timeout_s=PG_TIMEOUT_S))
    stack(t, pair_mask)
    return "no error"


def test_different_input_shapes_fail_on_every_rank():
    results = run_ranks(_mismatched_shapes, P, timeout_s=60, pg_timeout_s=PG_TIMEOUT_S)
    for r in results:
        assert isinstance(r, RankFailed) and r.error_type == "ConsistencyError", r
        assert "(2, 2, 7, 7, 10)" in r.message and "(2, 2, 5, 5, 10)" in r.message


def _bad_setup(rank: int, world: int) -> list[str]:
    from _models import build
    from fold_parallel import Collectives, ParallelConfig, enable_bp, enable_dap

    msgs = []
    for fn in (
        lambda: ParallelConfig(bp=3),
        lambda: enable_bp(build("evoformer", "af2"), Collectives(None)),
        lambda: enable_dap(torch.nn.Linear(2, 2), None),
    ):
        try:
            fn()
            msgs.append("no error")
        except (ValueError, TypeError) as err:
            msgs.append(str(err))
    return msgs


def test_bad_setup_messages():
    for msgs in run_ranks(_bad_setup, P, timeout_s=60):
        assert "bp must be 1 or 2" in msgs[0]
        assert "Parallel Evoformer blocks" in msgs[1] and "EvoformerBlock" in msgs[1]
        assert "enable_dap supports" in msgs[2]


def test_enable_dap_sets_the_comm_of_af3_trunk_stacks():
    """AF3's MSA module, Pairformer and template embedder split themselves: enable_dap sets
    their comm without hooks, and the handle restores the single-device comm."""
    from fold_model.af3 import AlphaFold3, config
    from fold_model.seams import IDENTITY_COMM
    from fold_parallel import DapComm, enable_dap

    model = AlphaFold3(config("tiny"))
    comm = DapComm.__new__(DapComm)  # no process group needed: nothing is communicated
    stacks = [model.msa_module, model.pairformer, model.template_embedder]
    handles = [enable_dap(s, comm) for s in stacks]
    for s in stacks:
        assert s.comm is comm
        assert not s._forward_pre_hooks and not s._forward_hooks
    for h in handles:
        h.remove()
    assert all(s.comm is IDENTITY_COMM for s in stacks)
