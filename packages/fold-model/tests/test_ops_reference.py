"""The torch reference ops against float64 formulas, and the registry's selection rules."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from _trunk_helpers import holes, rel_err
from fold_model import ops
from fold_model.ops import registry
from fold_ops import reference


def _naive_attention(q, k, v, bias, mask, scale, gate):
    """Element-wise float64 attention: explicit exp/sum over keys, masked keys skipped."""
    q, k, v = q.double(), k.double(), v.double()
    logits = torch.einsum("...hqd,...hkd->...hqk", q, k) * scale
    if bias is not None:
        logits = logits + bias.double().unsqueeze(-4)
    w = torch.exp(logits - logits.amax(-1, keepdim=True))
    if mask is not None:
        keep = mask.double()[..., None, None, :]
        all_masked = keep.sum(-1, keepdim=True) == 0
        w = torch.where(all_masked, torch.ones_like(w), w * keep)
    w = w / w.sum(-1, keepdim=True)
    o = torch.einsum("...hqk,...hkd->...hqd", w, v)
    return o * torch.sigmoid(gate.double()) if gate is not None else o


def _inputs(seed=0, b=2, r=3, h=2, nq=5, nk=7, d=6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, r, h, nq, d, generator=g)
    k = torch.randn(b, r, h, nk, d, generator=g)
    v = torch.randn(b, r, h, nk, d, generator=g)
    gate = torch.randn(b, r, h, nq, d, generator=g)
    bias = torch.randn(b, h, nq, nk, generator=g)
    mask = holes((b, r, nk), seed=seed)
    return q, k, v, bias, mask, gate


def test_attention_matches_float64_formula_with_holes():
    q, k, v, bias, mask, gate = _inputs()
    mask[0, 1] = 0.0  # a row with every key masked: uniform weights -> mean of v
    out = ops.attention(q, k, v, bias, mask, 0.37, gate)
    ref = _naive_attention(q, k, v, bias, mask, 0.37, gate)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < 1e-5
    mean_v = v[0, 1].double().mean(-2, keepdim=True) * torch.sigmoid(gate[0, 1].double())
    assert torch.allclose(out[0, 1].double(), mean_v.expand_as(out[0, 1]), atol=1e-5)


def test_attention_bool_mask_default_scale_and_gradients():
    q, k, v, bias, mask, _ = _inputs(seed=1)
    leaves = [t.double().requires_grad_() for t in (q, k, v, bias)]
    out = ops.attention(*leaves, mask.bool())
    ref = _naive_attention(*[t.detach() for t in leaves], mask, q.shape[-1] ** -0.5, None)
    assert rel_err(out, ref) < 1e-12
    (out * torch.linspace(-1, 1, out.numel()).double().view_as(out)).sum().backward()
    g_ref = [t.detach().clone().requires_grad_() for t in leaves]
    ref = _naive_attention(*g_ref, mask, q.shape[-1] ** -0.5, None)
    (ref * torch.linspace(-1, 1, ref.numel()).double().view_as(ref)).sum().backward()
    for a, b in zip(leaves, g_ref):
        assert rel_err(a.grad, b.grad) < 1e-10


def test_attention_bf16_autocast_softmax_in_fp32():
    q, k, v, bias, mask, gate = _inputs(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias.bfloat16(), mask,
                            None, gate.bfloat16())
    ref = _naive_attention(q, k, v, bias, mask, q.shape[-1] ** -0.5, gate)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 2e-2


def test_layer_norm_fp32_and_bf16():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 17, generator=g) * 4 + 3
    w, b = torch.randn(17, generator=g), torch.randn(17, generator=g)
    ref = F.layer_norm(x.double(), (17,), w.double(), b.double(), 1e-5)
    assert rel_err(ops.layer_norm(x, w, b), ref) < 1e-6
    y = ops.layer_norm(x.bfloat16(), w, b)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, ref) < 1e-2


def test_layer_norm_linear_softmax_swiglu_gate_residual():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 7, 9, generator=g)
    lw, lb = torch.randn(9, generator=g), torch.randn(9, generator=g)
    w, b = torch.randn(11, 9, generator=g), torch.randn(11, generator=g)
    ref = F.linear(F.layer_norm(x.double(), (9,), lw.double(), lb.double()), w.double(), b.double())
    assert rel_err(ops.layer_norm_linear(x, lw, lb, w, b), ref) < 1e-6

    logits, bias = torch.randn(4, 7, 9, generator=g), torch.randn(7, 9, generator=g)
    mask = holes((4, 1, 9), seed=4)
    e = torch.exp((logits + bias).double()) * mask.double()
    assert rel_err(ops.softmax_mask_bias(logits, mask, bias), e / e.sum(-1, keepdim=True)) < 1e-6

    w2 = torch.randn(22, 9, generator=g)
    h = F.linear(x.double(), w2.double())
    ref = h[..., :11] * torch.sigmoid(h[..., :11]) * h[..., 11:]
    assert rel_err(ops.swiglu(x, w2), ref) < 1e-6

    gate = torch.randn(4, 7, 9, generator=g)
    ref = x.double() * torch.sigmoid(gate.double() + lb.double())
    assert rel_err(ops.bias_sigmoid_gate(x, gate, lb), ref) < 1e-6

    res, dm = torch.randn(4, 7, 9, generator=g), (torch.rand(1, 7, 9, generator=g) > 0.5) * 2.0
    ref = res.double() + (x.double() + lb.double()) * dm.double()
    assert rel_err(ops.bias_dropout_residual(x, res, lb, dm), ref) < 1e-7


def test_nan_is_not_hidden():
    q, k, v, bias, mask, gate = _inputs(seed=5)
    v[0, 0, 0, 0, 0] = float("nan")
    out = ops.attention(q, k, v, bias, mask, None, gate)
    assert not torch.isfinite(out).all()


@pytest.fixture
def fake_backend():
    calls = []

    def fake_attention(*args, **kwargs):
        calls.append(1)
        return reference.attention(*args, **kwargs)

    ops.register(
        "attention", "fake", fake_attention, supports=lambda *a, **k: True, priority=10_000
    )
    yield calls
    registry.unregister("attention", "fake")


def test_registry_selection(fake_backend, monkeypatch):
    q, k, v, bias, mask, gate = _inputs(seed=6)
    assert ops.backends("attention")[0] == "fake"
    ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 1  # auto picks the higher-priority backend
    with ops.use_backend("torch"):
        ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 1
    monkeypatch.setenv("FOLD_OPS_BACKEND", "attention=torch")
    ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 1
    # the env var is cached per value: a change takes effect on the next call, both ways
    monkeypatch.setenv("FOLD_OPS_BACKEND", "layer_norm=torch,fake")
    ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 2
    monkeypatch.setenv("FOLD_OPS_BACKEND", "attention=torch")
    ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 2
    monkeypatch.delenv("FOLD_OPS_BACKEND")
    ops.attention(q, k, v, bias, mask)
    assert len(fake_backend) == 3
    with pytest.raises(ops.BackendUnavailable, match="not registered"):
        ops.attention(q, k, v, backend="no-such-backend")


def test_fx_tracing_records_one_leaf_node_that_dispatches_when_run(fake_backend):
    """While torch.fx traces, an op is one call_function node of its leaf
    (``fold_model.ops.leaves``, with ``fold_op``), no backend runs and ``supports`` is not
    asked; running the graph dispatches, so the backend selected then serves the call."""
    from fold_model.ops import leaves

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return ops.attention(q, k, v, None, mask, 0.5, None)

    with ops.use_backend("fake"):
        gm = torch.fx.symbolic_trace(Attn())
    assert len(fake_backend) == 0
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [leaves.attention]
    assert leaves.attention.fold_op == "attention"
    assert not any(n.target in (torch.softmax, torch.matmul) for n in gm.graph.nodes)
    q, k, v, _, mask, _ = _inputs(seed=7)
    ref = _naive_attention(q, k, v, None, mask, 0.5, None)
    assert rel_err(gm(q, k, v, mask), ref) < 1e-5
    assert len(fake_backend) == 1  # auto at run time: the highest priority
    with ops.use_backend("torch"):
        assert rel_err(gm(q, k, v, mask), ref) < 1e-5
    assert len(fake_backend) == 1


def test_an_explicit_backend_argument_is_kept_in_the_traced_node(fake_backend):
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return ops.attention(q, k, v, backend="torch")

    gm = torch.fx.symbolic_trace(Attn())
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert node.kwargs == {"backend": "torch"}
    q, k, v, *_ = _inputs(seed=8)
    gm(q, k, v)
    assert len(fake_backend) == 0


def test_fake_tensors_run_the_chosen_backends_fake():
    """On FakeTensors the registry picks a backend as for real tensors and runs its ``fake``;
    a backend without one is passed over (auto) or refused (explicit)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    calls = []

    def spy(*args, **kwargs):
        calls.append("fn")
        return reference.attention(*args, **kwargs)

    def spy_fake(q, k, v, *args, **kwargs):
        calls.append("fake")
        return torch.empty_like(q)

    ops.register("attention", "spy", spy, supports=lambda *a, **k: True, priority=10_000,
                 fake=spy_fake)
    ops.register("attention", "nofake", spy, supports=lambda *a, **k: True, priority=20_000)
    try:
        q, k, v, bias, mask, _ = _inputs(seed=9)
        with FakeTensorMode() as mode:
            fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
            out = ops.attention(fq, fk, fv)
            assert out.shape == q.shape and calls == ["fake"]
            with pytest.raises(ops.BackendUnavailable, match="no shape-only fake"):
                ops.attention(fq, fk, fv, backend="nofake")
            with ops.use_backend("torch"):
                assert ops.attention(fq, fk, fv).shape == q.shape  # the reference on fakes
        assert calls == ["fake"]
        ops.attention(q, k, v)
        assert calls == ["fake", "fn"]  # real tensors: the highest priority
    finally:
        registry.unregister("attention", "spy")
        registry.unregister("attention", "nofake")


def test_linear_with_a_bias_goes_through_the_registry():
    """``Linear`` with a bias dispatches ``ops.linear`` (a kernel backend replaces its backward);
    without a bias it calls ``F.linear`` directly; the reference equals the float64 formula, and
    fx traces plain ``F.linear`` (what AutoChunk rewrites)."""
    from fold_model.layers import Linear

    calls = []

    def fake_linear(*args, **kwargs):
        calls.append(1)
        return reference.linear(*args, **kwargs)

    ops.register("linear", "fake", fake_linear, supports=lambda *a, **k: True, priority=10_000)
    try:
        torch.manual_seed(0)
        with_bias, no_bias = Linear(7, 5, init="relu"), Linear(7, 5, bias=False, init="relu")
        with torch.no_grad():
            with_bias.bias.normal_()
        x = torch.randn(2, 3, 7, dtype=torch.float64)
        out = with_bias.double()(x)
        assert len(calls) == 1
        ref = x @ with_bias.weight.double().T + with_bias.bias.double()
        assert rel_err(out, ref) < 1e-12
        no_bias.double()(x)
        assert len(calls) == 1  # no dispatch without a bias
        from fold_model.ops import leaves

        gm = torch.fx.symbolic_trace(with_bias)
        assert len(calls) == 1
        assert any(n.target is leaves.linear for n in gm.graph.nodes)
        assert rel_err(gm(x), ref) < 1e-12 and len(calls) == 2
    finally:
        registry.unregister("linear", "fake")


def test_triangle_attention_is_one_registration():
    """Triangle attention (both nodes) dispatches the ``triangle_attention`` op: one backend
    registered for it serves every triangle attention and nothing else; its reference hands the
    call to ``attention_packed`` (whichever backend serves attention)."""
    from fold_model.layers import (
        Attention,
        TriangleAttentionEndingNode,
        TriangleAttentionStartingNode,
    )

    calls = {"triangle_attention": 0, "attention_packed": 0}

    def counting(name):
        def fn(*args, **kwargs):
            calls[name] += 1
            return reference.attention_packed(*args, **kwargs)  # a kernel of its own
        return fn

    for name in calls:
        ops.register(name, "fake", counting(name), supports=lambda *a, **k: True, priority=10_000)
    try:
        torch.manual_seed(0)
        z = torch.randn(1, 5, 5, 8, dtype=torch.float64)
        mask = holes((1, 5, 5), seed=3).double()
        start = TriangleAttentionStartingNode(8, 4, 2).double()
        end = TriangleAttentionEndingNode(8, 4, 2).double()
        for p in (*start.parameters(), *end.parameters()):
            torch.nn.init.normal_(p, std=0.3)
        with ops.use_backend({"triangle_attention": "torch", "attention_packed": "torch"}):
            ref = start(z, mask), end(z, mask)
        got = start(z, mask), end(z, mask)
        # auto: the fake triangle backend serves both nodes, attention_packed is not reached
        assert calls == {"triangle_attention": 2, "attention_packed": 0}
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        with ops.use_backend({"triangle_attention": "torch"}):
            start(z, mask)
        assert calls == {"triangle_attention": 2, "attention_packed": 1}  # the fallback
        x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
        Attention(8, 8, 4, 2).double()(x, x)
        assert calls == {"triangle_attention": 2, "attention_packed": 2}  # other attention
    finally:
        for name in calls:
            registry.unregister(name, "fake")


def test_unregister_removes_a_backend_and_keeps_the_reference():
    registry.register("linear", "extra", lambda x, w, b=None: x, priority=5)
    assert "extra" in registry.backends("linear")
    registry.unregister("linear", "extra")
    assert "extra" not in registry.backends("linear")
    with pytest.raises(ValueError, match="not registered"):
        registry.unregister("linear", "extra")
    with pytest.raises(ValueError, match="cannot be unregistered"):
        registry.unregister("linear", "torch")


def test_lowered_ops_reach_every_backend_in_the_autocast_dtype():
    """Under autocast the dispatcher casts a lowered op's floating inputs (fold_ops.autocast):
    the backend chosen, and the one a memory estimate asks about, see bf16 and decide on it;
    outside autocast and for other ops nothing is cast. The reference computes what autocast's
    GEMM computes either way."""
    seen = []

    def spy(x, weight):
        seen.append((x.dtype, weight.dtype))
        return reference.linear_channel_first(x, weight)

    def bf16_only(x, weight):
        return x.dtype == weight.dtype == torch.bfloat16

    ops.register("linear_channel_first", "spy", spy, supports=bf16_only, priority=10_000)
    try:
        x, w = torch.randn(2, 3, 4, 8), torch.randn(5, 8)
        ops.linear_channel_first(x, w)
        assert seen == []  # fp32 outside autocast: not the spy's call
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ops.linear_channel_first(x, w)
            assert registry.selected_backend("linear_channel_first", x, w) == "spy"
            with ops.use_backend("torch"):
                y_ref = ops.linear_channel_first(x, w)
            n = ops.layer_norm(x, torch.ones(8), torch.zeros(8))
        assert seen == [(torch.bfloat16, torch.bfloat16)]
        assert y.dtype == y_ref.dtype == torch.bfloat16 and torch.equal(y, y_ref)
        assert n.dtype == torch.float32  # not lowered: PyTorch's LayerNorm rule
    finally:
        registry.unregister("linear_channel_first", "spy")
