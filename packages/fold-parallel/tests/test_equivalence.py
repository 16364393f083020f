"""DAP, DAP+DAO and BP on 2 gloo ranks give the outputs and gradients (every input and every
parameter) of one process, for the Evoformer stack (three block orders), the extra MSA stack and
the template pair stack, at odd sizes (N_res = 7, N_seq = 5: padded to 8 and 6 under DAP-2) with
masks with holes. Outputs are compared where they are defined (unmasked entries: a fully masked
attention query averages all values, padding included) and the loss weights every such entry.

Reference: the same stack in float64 on one process. The distributed run in float64 must agree
to rounding (1e-12: the algebra is identical, only summation orders differ); in float32 to 1e-5
relative norm (fp32 rounding through two blocks; measured 2e-7..4e-6).
Gradients of the distributed run are averaged over the ranks (``sync_gradients``), input
gradients likewise (see fold_parallel.comm for the convention).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _dist import ok, run_ranks
from _models import build, compare, fresh, inputs, run

pytestmark = pytest.mark.distributed

P = 2
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _mean_input_grads(result) -> None:
    for g in result.input_grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()


def _dap_cases(rank: int, world: int, cases: list[tuple]) -> dict:
    from fold_parallel import DapComm, enable_dap, sync_gradients

    out = {}
    for kind, order, impl, overlap in cases:
        stack = build(kind, order)
        args = inputs(kind, stack)
        ref = run(*fresh(stack, args, torch.float64), kind)
        for dtype in (torch.float64, torch.float32):
            s, a = fresh(stack, args, dtype)
            comm = DapComm(None, impl, overlap_forward=overlap, overlap_backward=overlap)
            enable_dap(s, comm)
            got = run(s, a, kind)
            sync_gradients(s)
            got.param_grads = {n: p.grad for n, p in s.named_parameters()}
            _mean_input_grads(got)
            out[(kind, order, impl, overlap, str(dtype))] = compare(got, ref)
    return out


def _assert_all(results) -> None:
    for per_rank in ok(results):
        for key, errs in per_rank.items():
            tol = TOL[torch.float64 if "float64" in key[-1] else torch.float32]
            for what in ("outputs", "input_grads", "param_grads"):
                assert errs[what] < tol, (key, what, errs[what])


def test_dap_and_dao_evoformer_orders():
    cases = [
        ("evoformer", "af2", "fallback", False),  # synchronous DAP
        ("evoformer", "af2", "fallback", True),  # DAP + DAO
        ("evoformer", "multimer", "native", True),
        ("evoformer", "parallel", "fallback", True),
    ]
    _assert_all(run_ranks(_dap_cases, P, cases))


def test_dap_extra_msa_and_template_stacks():
    cases = [
        ("extra_msa", "af2", "fallback", True),
        ("extra_msa", "af2", "native", False),
        ("template", "af2", "fallback", True),
    ]
    _assert_all(run_ranks(_dap_cases, P, cases))


def _bp_cases(rank: int, world: int, kinds: list[str]) -> dict:
    from fold_parallel import Collectives, enable_bp, sync_gradients

    out = {}
    for kind in kinds:
        stack = build(kind, "parallel")
        args = inputs(kind, stack)
        ref = run(*fresh(stack, args, torch.float64), kind)
        for dtype in (torch.float64, torch.float32):
            s, a = fresh(stack, args, dtype)
            enable_bp(s, Collectives(None, impl="fallback", name="BP group"))
            got = run(s, a, kind)
            sync_gradients(s)
            got.param_grads = {n: p.grad for n, p in s.named_parameters()}
            _mean_input_grads(got)
            out[(kind, "parallel", "bp", rank, str(dtype))] = compare(got, ref)
    return out


def test_bp_evoformer_and_extra_msa():
    _assert_all(run_ranks(_bp_cases, P, ["evoformer", "extra_msa"]))


def _dropout_consistency(rank: int, world: int) -> dict:
    """Training mode with dropout under DAP and BP: RNG kept in step, so the gathered outputs are
    the same on both ranks and finite, and the dropout really acts (differs from eval)."""
    from fold_parallel import Collectives, DapComm, enable_bp, enable_dap

    res = {}
    for mode in ("dap", "bp"):
        stack = build("evoformer", "parallel")
        args = inputs("evoformer", stack)
        s, a = fresh(stack, args, torch.float32)
        if mode == "dap":
            enable_dap(s, DapComm(None, "fallback"))
        else:
            enable_bp(s, Collectives(None, impl="fallback"))
        torch.manual_seed(123)  # same seed on both ranks (fold_parallel.groups.seed_ranks)
        s.train()
        m, z, _ = s(*a)
        s.eval()
        m_eval, z_eval, _ = s(*a)
        both = [torch.empty_like(z) for _ in range(world)]
        dist.all_gather(both, z.detach().contiguous())
        res[mode] = (
            float((both[0] - both[1]).abs().max()),
            bool(torch.isfinite(z).all() and torch.isfinite(m).all()),
            float((z - z_eval).abs().max()),
        )
    return res


def test_dropout_keeps_ranks_in_step():
    for res in ok(run_ranks(_dropout_consistency, P)):
        for mode, (diff_ranks, finite, diff_eval) in res.items():
            assert finite, mode
            assert diff_ranks == 0.0, mode
            assert diff_eval > 1e-3, mode


@pytest.mark.parametrize("overlap", [False, True])
def test_dap_with_activation_checkpointing(overlap):
    _assert_all(run_ranks(_checkpointed, P, overlap))


def _checkpointed(rank: int, world: int, overlap: bool) -> dict:
    """Blocks under non-reentrant checkpointing (recompute in backward issues collectives
    again; every rank must do so in the same order)."""
    from fold_parallel import DapComm, enable_dap, sync_gradients

    kind = "evoformer"
    stack = build(kind, "af2")
    args = inputs(kind, stack)
    ref = run(*fresh(stack, args, torch.float64), kind)
    s, a = fresh(stack, args, torch.float64)
    s.checkpoint_blocks = True
    s.train()  # checkpointing is on in training only; tiny config dropout is switched off here
    for block in s.blocks:
        block.msa_dropout = block.pair_dropout = 0.0
    enable_dap(s, DapComm(None, "fallback", overlap_forward=overlap, overlap_backward=overlap))
    got = run(s, a, kind)
    sync_gradients(s)
    got.param_grads = {n: p.grad for n, p in s.named_parameters()}
    _mean_input_grads(got)
    return {("evoformer", "ckpt", overlap, "float64"): compare(got, ref)}
