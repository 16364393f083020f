"""Pairformer (AF3 Alg. 17) and its layers: hand-written float64 references of the AF3-specific
layers, fp32 == fp64, padding invariance under masks, chunked == unchunked, per-sub-layer
checkpointing == plain (outputs and gradients), torch.fx tracing."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _af3_helpers import grads, holes, randomize_, rel_err
from fold_model.af3.conditioning import AdaLN, AttentionPairBias, ConditionedTransitionBlock
from fold_model.af3.config import config
from fold_model.af3.pairformer import PairformerBlock, PairformerStack
from fold_model.layers import SwiGLUTransition

CFG = config("tiny")
C_S, C_Z = CFG.c_s, CFG.c_z


def _inputs(n: int = 7, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n, C_S, generator=g, dtype=dtype)
    z = torch.randn(2, n, n, C_Z, generator=g, dtype=dtype)
    mask = holes((2, n), seed=seed).to(dtype)
    return s, z, mask, mask[:, :, None] * mask[:, None, :]


def test_swiglu_transition_matches_formula():
    t = randomize_(SwiGLUTransition(C_Z, 3)).double()
    x = torch.randn(2, 5, 3, C_Z, dtype=torch.float64)
    h = torch.nn.functional.layer_norm(x, (C_Z,), t.layer_norm.weight, t.layer_norm.bias)
    a, b = (h @ t.linear_ab.weight.T).chunk(2, -1)
    ref = (a * torch.sigmoid(a) * b) @ t.linear_out.weight.T
    assert rel_err(t(x), ref) < 1e-12
    assert rel_err(t(x, chunk_size=2), ref) < 1e-12


def _ref_attention_pair_bias(mod: AttentionPairBias, a, z, mask, s=None):
    """Alg. 24 written out: per-head softmax(q k / sqrt(c) + b) v, gated, projected."""
    H = mod.mha.no_heads
    c = mod.mha.c_hidden
    if s is None:
        x = torch.nn.functional.layer_norm(
            a, (a.shape[-1],), mod.layer_norm_a.weight, mod.layer_norm_a.bias
        )
    else:
        ada = mod.ada_ln
        x = torch.nn.functional.layer_norm(a, (a.shape[-1],))
        sn = torch.nn.functional.layer_norm(s, (s.shape[-1],), ada.s_weight)
        gate, shift = _gate_shift(ada, sn)
        x = torch.sigmoid(gate) * x + shift
    zn = torch.nn.functional.layer_norm(z, (z.shape[-1],), mod.layer_norm_z.weight,
                                        mod.layer_norm_z.bias)
    b = torch.einsum("bijc,hc->bhij", zn, mod.linear_z.weight)
    q = mod.mha.linear_q(x).unflatten(-1, (H, c))  # [B, R, N, H, c]
    k = mod.mha.linear_k(x).unflatten(-1, (H, c))
    v = mod.mha.linear_v(x).unflatten(-1, (H, c))
    g = torch.sigmoid(mod.mha.linear_g(x)).unflatten(-1, (H, c))
    logits = torch.einsum("brihc,brjhc->brhij", q, k) / c**0.5 + b[:, None]
    logits = logits.masked_fill(mask[:, :, None, None, :] == 0, -1e9)
    o = torch.einsum("brhij,brjhc->brihc", torch.softmax(logits, -1), v) * g
    out = mod.mha.linear_o(o.flatten(-2))
    if s is not None:
        out = torch.sigmoid(mod.linear_s_gate(s)) * out
    return out


def _gate_shift(ada: AdaLN, sn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 26's ``Linear(LN(s))`` and ``LinearNoBias(LN(s))``: the rows of the stacked weight."""
    w_gate, w_shift = ada.linear_gate_shift.weight.chunk(2, 0)
    return F.linear(sn, w_gate, ada.gate_bias), F.linear(sn, w_shift)


def test_ada_ln_loads_state_dicts_with_separate_gate_and_shift():
    """An AdaLN saved with a ``Linear`` gate and a ``LinearNoBias`` shift (fold before the
    stacked projection) loads into the stacked form and computes the same output."""
    ada = randomize_(AdaLN(8, 6)).double()
    w_gate, w_shift = ada.linear_gate_shift.weight.detach().chunk(2, 0)
    old = {"s_weight": ada.s_weight.detach().clone(), "linear_gate.weight": w_gate.clone(),
           "linear_gate.bias": ada.gate_bias.detach().clone(),
           "linear_shift.weight": w_shift.clone()}
    loaded = AdaLN(8, 6).double()
    loaded.load_state_dict(old)  # strict: every key converted, none missing
    a = torch.randn(3, 5, 8, dtype=torch.float64)
    s = torch.randn(3, 5, 6, dtype=torch.float64)
    assert torch.equal(loaded(a, s), ada(a, s))
    assert set(loaded.state_dict()) == {"s_weight", "linear_gate_shift.weight", "gate_bias"}


@pytest.mark.parametrize("conditioned", [False, True])
def test_attention_pair_bias_matches_reference(conditioned):
    c_a, c_s, H = 12, 10, 3
    mod = randomize_(AttentionPairBias(c_a, C_Z, H, c_s=c_s if conditioned else None)).double()
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 4, 7, c_a, generator=g, dtype=torch.float64)  # R = 4 rows share the bias
    s = torch.randn(2, 4, 7, c_s, generator=g, dtype=torch.float64) if conditioned else None
    z = torch.randn(2, 7, 7, C_Z, generator=g, dtype=torch.float64)
    mask = holes((2, 4, 7), seed=2).double()
    got = mod(a, mod.bias_from_pair(z), mask, s)
    assert rel_err(got, _ref_attention_pair_bias(mod, a, z, mask, s)) < 1e-12


def test_ada_ln_and_conditioned_transition_formula():
    ada = randomize_(AdaLN(8, 6)).double()
    a = torch.randn(3, 5, 8, dtype=torch.float64)
    s = torch.randn(3, 5, 6, dtype=torch.float64)
    sn = torch.nn.functional.layer_norm(s, (6,), ada.s_weight)
    gate, shift = _gate_shift(ada, sn)
    ref = torch.sigmoid(gate) * torch.nn.functional.layer_norm(a, (8,))
    assert rel_err(ada(a, s), ref + shift) < 1e-12
    ctb = randomize_(ConditionedTransitionBlock(8, 6, 2)).double()
    x = ctb.ada_ln(a, s)
    u, v = (x @ ctb.linear_ab.weight.T).chunk(2, -1)
    ref = torch.sigmoid(ctb.linear_s_gate(s)) * ctb.linear_out(torch.nn.functional.silu(u) * v)
    assert rel_err(ctb(a, s), ref) < 1e-12


def _stack(dropout: float = 0.0, **kw) -> PairformerStack:
    cfg = copy.deepcopy(CFG.pairformer)
    cfg.dropout = dropout
    return randomize_(PairformerStack(cfg, C_S, C_Z, **kw), scale=0.5).double()


def test_stack_shapes_fp32_matches_fp64():
    stack = _stack()
    s, z, m, pm = _inputs(n=9)
    s64, z64 = stack(s, z, m, pm)
    assert s64.shape == s.shape and z64.shape == z.shape
    s32, z32 = copy.deepcopy(stack).float()(s.float(), z.float(), m.float(), pm.float())
    assert rel_err(s32, s64) < 1e-5 and rel_err(z32, z64) < 1e-5


def test_padding_does_not_change_real_outputs():
    """Masked tokens (any values) leave the real tokens' outputs unchanged."""
    stack = _stack()
    s, z, m, pm = _inputs(n=7, seed=4)
    s_out, z_out = stack(s, z, m, pm)
    pad = 3
    g = torch.Generator().manual_seed(9)
    s_p = torch.cat([s, 5 * torch.randn(2, pad, C_S, generator=g, dtype=s.dtype)], 1)
    z_p = 5 * torch.randn(2, 7 + pad, 7 + pad, C_Z, generator=g, dtype=s.dtype)
    z_p[:, :7, :7] = z
    m_p = torch.cat([m, torch.zeros(2, pad, dtype=m.dtype)], 1)
    pm_p = m_p[:, :, None] * m_p[:, None, :]
    s_o, z_o = stack(s_p, z_p, m_p, pm_p)
    real = m.bool()
    assert rel_err(s_o[:, :7][real], s_out[real]) < 1e-12
    rp = pm.bool()
    assert rel_err(z_o[:, :7, :7][rp], z_out[rp]) < 1e-12


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_chunked_equals_unchunked(chunk):
    stack = _stack()
    s, z, m, pm = _inputs(n=7, seed=1)
    ref = stack(s, z, m, pm)
    stack.set_chunk_size(chunk)
    got = stack(s, z, m, pm)
    assert rel_err(got[0], ref[0]) < 1e-12 and rel_err(got[1], ref[1]) < 1e-12


@pytest.mark.parametrize("whole_blocks", [False, True], ids=["sublayers", "blocks"])
def test_checkpointing_same_outputs_and_grads(whole_blocks):
    plain = _stack(dropout=0.25)
    ckpt = copy.deepcopy(plain)
    for b in ckpt.blocks:
        b.use_checkpoint, b.checkpoint_blocks = True, whole_blocks
    outs = {}
    for name, stack in (("plain", plain), ("ckpt", ckpt)):
        stack.train()
        s, z, m, pm = _inputs(n=7, seed=2)
        s.requires_grad_(True)
        torch.manual_seed(0)  # same dropout masks; checkpoint replays the RNG state
        so, zo = stack(s, z, m, pm)
        w = torch.randn(so.shape, generator=torch.Generator().manual_seed(1), dtype=so.dtype)
        ((so * w).sum() + zo.square().mean()).backward()
        outs[name] = (so.detach(), grads(stack), s.grad)
    assert rel_err(outs["ckpt"][0], outs["plain"][0]) < 1e-12
    assert rel_err(outs["ckpt"][2], outs["plain"][2]) < 1e-12
    for n, g in outs["plain"][1].items():
        assert rel_err(outs["ckpt"][1][n], g) < 1e-10 or g.abs().max() == 0, n


@pytest.mark.parametrize("whole_blocks", [False, True], ids=["sublayers", "blocks"])
def test_checkpointing_saves_pairs_per_block(whole_blocks):
    """Between forward and backward a checkpointed stack keeps 5 pair-sized tensors per block
    per sub-layer (the inputs of the 4 later pair sub-layers and the pair the single attention
    reads, which is the next block's input), only each block's input with whole blocks."""
    stack = _stack(dropout=0.25).train()
    for b in stack.blocks:
        b.use_checkpoint, b.checkpoint_blocks = True, whole_blocks
    s, z, m, pm = _inputs(n=7, seed=2)
    s.requires_grad_(True)
    z.requires_grad_(True)
    pair_saved = []

    def pack(t):
        if t.shape[-3:] == z.shape[-3:] and t.untyped_storage().data_ptr() != z.data_ptr():
            pair_saved.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        so, zo = stack(s, z, m, pm)
    n = len(stack.blocks)  # the stack's input z, kept out above, is saved too
    assert len(set(pair_saved)) == (n - 1 if whole_blocks else 5 * n)
    (so.sum() + zo.sum()).backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def test_block_traces_with_fx():
    block = randomize_(
        PairformerBlock(C_S, C_Z, 9, 4, 2, 3, 2, dropout=0.0), scale=0.5
    ).double().eval()
    gm = torch.fx.symbolic_trace(block)
    s, z, m, pm = _inputs(n=6, seed=5)
    ref = block(s, z, m, pm)
    got = gm(s, z, m, pm)
    assert rel_err(got[0], ref[0]) < 1e-12 and rel_err(got[1], ref[1]) < 1e-12


def test_attention_and_transitions_go_through_the_op_registry():
    """Every attention with pair bias (triangle, single, diffusion transformer, atom windows) and
    every SwiGLU transition dispatches through fold_model.ops, so fold-kernels serves them."""
    from fold_model import ops
    from fold_model.af3.diffusion import DiffusionTransformerBlock
    from fold_ops import reference

    calls = {"attention": 0, "attention_packed": 0, "swiglu": 0}

    def counting(name):
        def fn(*args, **kwargs):
            calls[name] += 1
            return getattr(reference, name)(*args, **kwargs)
        return fn

    for name in calls:  # priority -1: never chosen by "auto", only when asked for
        ops.register(name, "af3_counting", counting(name), priority=-1)
    stack = _stack()
    s, z, m, pm = _inputs(n=5, seed=7)
    dtb = randomize_(DiffusionTransformerBlock(12, C_S, C_Z, 3, 2)).double()
    a = torch.randn(1, 2, 5, 12, dtype=torch.float64)
    s2 = torch.randn(1, 2, 5, C_S, dtype=torch.float64)
    ref = stack(s, z, m, pm), dtb(a, s2, z[:1], m[:1])
    with ops.use_backend({name: "af3_counting" for name in calls}):
        got = stack(s, z, m, pm), dtb(a, s2, z[:1], m[:1])
    n_blocks = CFG.pairformer.no_blocks
    # tri start, tri end, single; one DT block: all self-attention, so packed projections
    assert calls["attention_packed"] == 3 * n_blocks + 1
    assert calls["attention"] == 0
    assert calls["swiglu"] == 2 * n_blocks + 1  # pair and single transitions; DT transition
    assert rel_err(got[0][0], ref[0][0]) == 0 and rel_err(got[1], ref[1]) == 0


def test_diffusion_transformer_block_traces_with_fx():
    from fold_model.af3.diffusion import DiffusionTransformerBlock

    block = randomize_(DiffusionTransformerBlock(12, C_S, C_Z, 3, 2)).double().eval()
    gm = torch.fx.symbolic_trace(block)
    a = torch.randn(1, 2, 6, 12, dtype=torch.float64)
    s = torch.randn(1, 2, 6, C_S, dtype=torch.float64)
    _, z, m, _ = _inputs(n=6, seed=8)
    assert rel_err(gm(a, s, z[:1], m[:1]), block(a, s, z[:1], m[:1])) < 1e-12
