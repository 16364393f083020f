"""Per-block activation checkpointing gives the same outputs and parameter gradients (dropout on:
checkpoint replays the RNG state)."""

from __future__ import annotations

import torch
from _trunk_helpers import grads, holes, randomize_, rel_err
from fold_model.af2 import config
from fold_model.af2.evoformer import EvoformerStack, ExtraMsaStack
from fold_model.af2.template import TemplatePairStack


def _inputs(seed=0, c_m=16):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(2, 5, 7, c_m, generator=g)
    z = torch.randn(2, 7, 7, 12, generator=g)
    seq = holes((2, 7), seed=seed)
    return m, z, holes((2, 5, 7), seed=seed + 1), seq[:, :, None] * seq[:, None, :]


def _run(stack, fn, seed=0):
    stack.zero_grad()
    torch.manual_seed(seed)  # the same dropout masks in both runs
    outs = fn()
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], grads(stack)


def _compare(stack, fn):
    stack.train()
    stack.checkpoint_blocks = False
    out_a, g_a = _run(stack, fn)
    stack.checkpoint_blocks = True
    out_b, g_b = _run(stack, fn)
    for a, b in zip(out_a, out_b):
        assert rel_err(b, a) < 1e-6
    for name in g_a:
        assert torch.isfinite(g_a[name]).all(), name
        assert rel_err(g_b[name], g_a[name]) < 1e-5, name


def test_evoformer_stack_checkpointed():
    for order in ("af2", "multimer", "parallel"):
        stack = randomize_(EvoformerStack(config("tiny").evoformer, order))
        m, z, mm, pm = _inputs()
        _compare(stack, lambda stack=stack, m=m, z=z, mm=mm, pm=pm: stack(m, z, mm, pm))


def test_extra_msa_stack_checkpointed():
    cfg = config("tiny", extra_msa__no_blocks=2).extra_msa
    stack = randomize_(ExtraMsaStack(cfg, 12))
    a, z, mm, pm = _inputs(1, c_m=cfg.c_e)
    _compare(stack, lambda: (stack(a, z, mm, pm),))


def test_template_pair_stack_checkpointed():
    cfg = config("tiny", template__no_blocks=2).template
    stack = randomize_(TemplatePairStack(cfg))
    t = torch.randn(2, 3, 7, 7, cfg.c_t)
    _, _, _, pm = _inputs(2)
    _compare(stack, lambda: (stack(t, pm),))


def test_evoformer_stack_partly_checkpointed():
    """The last blocks without recompute: same outputs and gradients as checkpointing none, and
    the saved activations lie between all-checkpointed and none-checkpointed."""
    cfg = config("tiny").evoformer
    stack = EvoformerStack(cfg, "af2").double()
    randomize_(stack)
    m, z, msa_mask, pair_mask = (t.double() for t in _inputs(c_m=cfg.c_m))
    fn = lambda: stack(m, z, msa_mask, pair_mask)  # noqa: E731
    stack.train()
    stack.checkpoint_blocks = False
    out_a, g_a = _run(stack, fn)
    saved = {}
    for plain in (0, 1, len(stack.blocks)):
        stack.checkpoint_blocks, stack.uncheckpointed_blocks = True, plain
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t, k=plain: saved.__setitem__(k, saved.get(k, 0) + t.numel()) or t,
                lambda t: t):
            outs = fn()
        del outs
        out_b, g_b = _run(stack, fn)
        for a, b in zip(out_a, out_b):
            assert rel_err(b, a) < 1e-12
        for name in g_a:
            assert rel_err(g_b[name], g_a[name]) < 1e-12, name
    assert saved[0] < saved[1] < saved[len(stack.blocks)]


def test_uncheckpointed_blocks_out_of_range_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="uncheckpointed_blocks must be in 0..48"):
        config("af2_initial", uncheckpointed_blocks=49)


def test_model_exempts_the_last_blocks_of_each_stack():
    import pytest
    from fold_model.af2 import AlphaFold2

    cfg = config("tiny", checkpoint_blocks=True, extra_msa__no_blocks=2, uncheckpointed_blocks=1,
                 uncheckpointed_extra_msa_blocks=2)
    model = AlphaFold2(cfg)
    assert model.checkpointed_stacks() == {"evoformer": 2, "extra_msa": 2}
    assert model.uncheckpointed_blocks() == {"evoformer": 1, "extra_msa": 2}
    assert model.extra_msa_stack.uncheckpointed_blocks == 2
    model.set_uncheckpointed_blocks(extra_msa=0)
    assert model.uncheckpointed_blocks() == {"evoformer": 1, "extra_msa": 0}
    assert AlphaFold2(config("tiny")).checkpointed_stacks() == {}  # tiny: no checkpointing
    with pytest.raises(ValueError, match="'evoformer' must be in 0..2, got 3"):
        model.set_uncheckpointed_blocks(evoformer=3)
    with pytest.raises(ValueError, match="unknown stack 'pairformer'"):
        model.set_uncheckpointed_blocks(pairformer=1)
    with pytest.raises(ValueError, match="uncheckpointed_extra_msa_blocks must be in 0..4"):
        config("af2_initial", uncheckpointed_extra_msa_blocks=5)
