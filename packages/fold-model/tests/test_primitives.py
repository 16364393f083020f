"""Linear inits, LayerNorm, gated and global attention (Alg. 19), shared dropout, chunking."""

from __future__ import annotations

import copy

import pytest
import torch
from _trunk_helpers import holes, randomize_, rel_err
from fold_model.layers import (
    Attention,
    GlobalAttention,
    LayerNorm,
    Linear,
    chunked_rows,
    fork_pair_bias,
    pair_bias,
    shared_dropout_mask,
)


def test_linear_inits():
    torch.manual_seed(0)
    fan_in = 400
    for init, var in (("default", 1.0 / fan_in), ("relu", 2.0 / fan_in)):
        lin = Linear(fan_in, 500, init=init)
        assert abs(lin.weight.var().item() / var - 1) < 0.05, init
        assert lin.weight.abs().max() <= 2.0 * (var**0.5) / 0.8796 + 1e-6  # truncated at 2 std
        assert torch.all(lin.bias == 0)
    glorot = Linear(fan_in, 500, init="glorot")
    assert glorot.weight.abs().max() <= (6 / (fan_in + 500)) ** 0.5
    gating = Linear(7, 5, init="gating")
    assert torch.all(gating.weight == 0) and torch.all(gating.bias == 1)
    final = Linear(7, 5, init="final")
    assert torch.all(final.weight == 0) and torch.all(final.bias == 0)
    with pytest.raises(ValueError, match="unknown init"):
        Linear(3, 3, init="nope")  # type: ignore[arg-type]


def test_layer_norm_module():
    ln = randomize_(LayerNorm(13))
    x = torch.randn(3, 13) * 5
    ref = torch.nn.functional.layer_norm(x.double(), (13,), ln.weight.double(), ln.bias.double())
    assert rel_err(ln(x), ref) < 1e-6


def _attention_ref(mod: Attention, q_x, kv_x, mask, bias):
    """Alg. 7-style gated attention written out per head in float64."""
    H, D = mod.no_heads, mod.c_hidden
    q = (q_x @ mod.linear_q.weight.T).unflatten(-1, (H, D))  # [*, R, Nq, H, D]
    k = (kv_x @ mod.linear_k.weight.T).unflatten(-1, (H, D))
    v = (kv_x @ mod.linear_v.weight.T).unflatten(-1, (H, D))
    g = torch.sigmoid(mod.linear_g(q_x)).unflatten(-1, (H, D))
    logits = torch.einsum("...qhd,...khd->...hqk", q, k) / D**0.5
    if bias is not None:
        logits = logits + bias.unsqueeze(-4)
    logits = logits + (mask[..., None, None, :] - 1) * 1e9
    o = torch.einsum("...hqk,...khd->...qhd", torch.softmax(logits, -1), v) * g
    return mod.linear_o(o.flatten(-2))


def _float64_copy(mod: Attention) -> Attention:
    return copy.deepcopy(mod).double()


def _assert_grads_match(out, ref, leaves, leaves64, mod, mod64) -> None:
    """Backward of the same random projection of ``out`` and its float64 reference; every input
    and parameter gradient within fp32 tolerance."""
    w = torch.randn(out.shape, dtype=torch.float64)
    (out * w.float()).sum().backward()
    (ref * w).sum().backward()
    for a, b in zip(leaves, leaves64):
        assert rel_err(a.grad, b.grad) < 1e-5
    for (n, p), p64 in zip(mod.named_parameters(), mod64.parameters()):
        assert rel_err(p.grad, p64.grad) < 1e-5, n


@pytest.mark.parametrize("chunk_size", [None, 2, 5])
def test_attention_module_against_float64(chunk_size):
    torch.manual_seed(1)
    mod = randomize_(Attention(11, 9, 4, 3))
    q_x, kv_x = torch.randn(2, 5, 6, 11), torch.randn(2, 5, 7, 9)
    mask, bias = holes((2, 5, 7), seed=1), torch.randn(2, 3, 6, 7)
    leaves = [t.clone().requires_grad_() for t in (q_x, kv_x, bias)]
    out = mod(leaves[0], leaves[1], mask, leaves[2], chunk_size=chunk_size)
    mod64 = _float64_copy(mod)
    leaves64 = [t.double().requires_grad_() for t in (q_x, kv_x, bias)]
    ref = _attention_ref(mod64, leaves64[0], leaves64[1], mask.double(), leaves64[2])
    assert out.shape == (2, 5, 6, 11)
    assert rel_err(out, ref) < 1e-5
    _assert_grads_match(out, ref, leaves, leaves64, mod, mod64)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_self_attention_packed_path_against_float64(chunk_size):
    """q_x is kv_x: the four projections run as one GEMM through ops.attention_packed; the
    output and every gradient (input, bias, each projection's weight, the gate bias) match the
    float64 reference of separate projections."""
    torch.manual_seed(2)
    mod = randomize_(Attention(10, 10, 4, 3))
    x, bias = torch.randn(2, 5, 7, 10), torch.randn(2, 3, 7, 7)
    mask = holes((2, 5, 7), seed=3)
    leaves = [t.clone().requires_grad_() for t in (x, bias)]
    out = mod(leaves[0], leaves[0], mask, leaves[1], chunk_size=chunk_size)
    mod64 = _float64_copy(mod)
    leaves64 = [t.double().requires_grad_() for t in (x, bias)]
    ref = _attention_ref(mod64, leaves64[0], leaves64[0], mask.double(), leaves64[1])
    assert rel_err(out, ref) < 1e-5
    _assert_grads_match(out, ref, leaves, leaves64, mod, mod64)


def test_self_attention_dispatches_packed_cross_attention_does_not():
    from fold_model import ops

    calls = {"attention": 0, "attention_packed": 0}

    def counting(name):
        from fold_ops import reference

        def fn(*args, **kwargs):
            calls[name] += 1
            return getattr(reference, name)(*args, **kwargs)
        return fn

    for name in calls:
        ops.register(name, "prim_counting", counting(name), priority=-1)
    mod = randomize_(Attention(6, 6, 4, 2))
    x, y = torch.randn(1, 3, 5, 6), torch.randn(1, 3, 5, 6)
    with ops.use_backend({name: "prim_counting" for name in calls}):
        mod(x, x)
        assert calls == {"attention": 0, "attention_packed": 1}
        mod(x, y)
        assert calls == {"attention": 1, "attention_packed": 1}


def test_global_attention_alg19():
    torch.manual_seed(2)
    mod = randomize_(GlobalAttention(10, 4, 3)).double()
    x = torch.randn(2, 5, 7, 10, dtype=torch.float64)  # [*, R = N_res, N = N_seq, C]
    mask = holes((2, 5, 7), seed=2).double()
    out = mod(x, mask)
    # Alg. 19 written out: one mean query per row, a single key/value head.
    q = mod.linear_q((x * mask[..., None]).sum(-2) / (mask.sum(-1, keepdim=True) + 1e-10))
    q = q.unflatten(-1, (3, 4)) / 2.0  # [*, R, H, D] * 1/sqrt(4)
    k, v = mod.linear_k(x), mod.linear_v(x)  # [*, R, N, D]
    logits = torch.einsum("...hd,...nd->...hn", q, k) + (mask[..., None, :] - 1) * 1e9
    o = torch.einsum("...hn,...nd->...hd", torch.softmax(logits, -1), v).flatten(-2)
    g = torch.sigmoid(mod.linear_g(x))  # [*, R, N, H * D]
    ref = mod.linear_o(g * o[..., None, :])
    assert rel_err(out, ref) < 1e-12
    assert rel_err(mod(x, mask, chunk_size=2), ref) < 1e-12


def test_shared_dropout_mask():
    x = torch.randn(4, 6, 5, 3)
    assert shared_dropout_mask(x, 0.25, -3, training=False) is None
    torch.manual_seed(3)
    a = shared_dropout_mask(x, 0.25, -3, training=True)
    torch.manual_seed(3)
    b = shared_dropout_mask(x, 0.25, -3, training=True)
    assert a.shape == (4, 1, 5, 3) and torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    col = shared_dropout_mask(x, 0.25, -2, training=True)
    assert col.shape == (4, 6, 1, 3)
    # the rate: a quarter dropped (200k draws: standard error 0.001), kept entries scaled
    big = shared_dropout_mask(torch.empty(1, 8, 200_000, dtype=torch.bfloat16), 0.25, -2, True)
    assert big.dtype == torch.bfloat16 and big.shape == (1, 1, 200_000)
    big = shared_dropout_mask(torch.empty(200_000, 3, 1), 0.25, -2, True)
    assert abs((big == 0).float().mean().item() - 0.25) < 0.006
    assert torch.allclose(big.mean(), torch.tensor(1.0), atol=0.01)


def test_chunked_rows_matches_whole():
    x, y = torch.randn(3, 7, 4), torch.randn(3, 4, 7)

    def fn(a, b, scale):
        return torch.tanh(a * scale + b.transpose(-1, -2))  # rows of a pair with columns of b

    whole = chunked_rows(fn, None, ((x, -2), (y, -1)), (2.0,), out_dim=-2)
    for c in (1, 3, 7, 10):
        assert torch.equal(chunked_rows(fn, c, ((x, -2), (y, -1)), (2.0,), out_dim=-2), whole)


def test_skip_weight_init_then_strict_load_equals_normal_build():
    """Built under skip_weight_init, a model's Linear weights are left undrawn; a strict load of
    a normally built model's state makes it identical; outside the context a seeded build
    still draws the same weights."""
    from fold_model.af2 import AlphaFold2, config
    from fold_model.layers import skip_weight_init

    torch.manual_seed(0)
    ref = AlphaFold2(config("tiny"))
    with skip_weight_init():
        model = AlphaFold2(config("tiny"))
    model.load_state_dict(ref.state_dict())  # strict: every parameter and buffer
    for (name, a), (_, b) in zip(ref.state_dict().items(), model.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    torch.manual_seed(0)
    again = AlphaFold2(config("tiny"))
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(),
                                                 again.state_dict().values(), strict=True))


@pytest.mark.parametrize("branches", [0, 1])
def test_fork_pair_bias_one_op_equals_fork_and_projection(branches):
    """``fork_pair_bias`` with autograd (one ``ops.layer_norm_pair_bias``) gives the outputs and
    every gradient of ``LayerNorm.fork`` then ``pair_bias`` (float64), and without autograd the
    same outputs; a projection with a bias is refused."""
    g = torch.Generator().manual_seed(3)
    ln = randomize_(LayerNorm(11)).double()
    lin = randomize_(Linear(11, 3, bias=False)).double()
    z = torch.randn(2, 5, 7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    params = [z, ln.weight, ln.bias, lin.weight]
    seeds = None
    results = []
    for fused in (True, False):
        if fused:
            outs = fork_pair_bias(ln, z, lin, branches=branches)
        else:
            z_res, *ys = ln.fork(z, branches + 1)
            outs = (z_res, *ys[:-1], pair_bias(ys[-1], lin))
        assert len(outs) == branches + 2 and outs[-1].shape == (2, 3, 5, 7)
        if seeds is None:
            seeds = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
        grads = torch.autograd.grad(outs, params, seeds)
        results.append((outs, grads))
    (o1, g1), (o2, g2) = results
    for a, b in zip(o1 + g1, o2 + g2, strict=True):
        assert rel_err(a, b) < 1e-12
    with torch.no_grad():
        for a, b in zip(fork_pair_bias(ln, z, lin, branches=branches), o1, strict=True):
            assert rel_err(a, b) < 1e-12
    with pytest.raises(ValueError, match="no bias"):
        fork_pair_bias(ln, z, Linear(11, 3).double())


def test_stack_as_made_equals_stack():
    from fold_model.layers import stack_as_made

    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(2, 3, 5, generator=g, dtype=torch.float64) for _ in range(4)]
    made = []
    out = stack_as_made([lambda p=p: made.append(1) or p for p in parts])
    assert len(made) == 4 and torch.equal(out, torch.stack(parts))
