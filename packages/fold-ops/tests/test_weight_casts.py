"""fold_ops.weight_casts: a parameter's autocast cast made once and handed out while a cache is
active, with the same values as the per-call cast; never where autograd, an activation, fp64 or
a changed weight would make it differ."""

from __future__ import annotations

import pytest
import torch
from fold_ops.autocast import lower
from fold_ops.weight_casts import (
    WeightCasts,
    cast_stacked,
    cast_weight,
    concatenated,
    weight_casts,
)
from torch import nn

BF16 = torch.bfloat16


def _param(*shape: int, seed: int = 0, dtype=torch.float32) -> nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    return nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype))


def _autocast():
    return torch.autocast("cpu", dtype=BF16)


def test_cast_once_same_values_same_tensor():
    w = _param(7, 5)
    cache = WeightCasts()
    with torch.no_grad(), _autocast(), weight_casts(cache):
        first = cast_weight(w)
        second = cast_weight(w)
    assert first.dtype == BF16 and torch.equal(first, w.to(BF16))
    assert second is first and len(cache) == 1 and cache.nbytes == 7 * 5 * 2


def test_served_only_where_it_cannot_change_a_result():
    w = _param(3, 4)
    cache = WeightCasts()
    assert cast_weight(w) is w  # no cache active
    with weight_casts(cache):
        with torch.no_grad():
            assert cast_weight(w) is w  # no autocast
        with _autocast():
            assert cast_weight(w) is w  # autograd through w: the cast must be recorded
            w.requires_grad_(False)
            assert cast_weight(w).dtype == BF16  # a frozen parameter may be served
            w.requires_grad_(True)
            with torch.no_grad():
                x = torch.randn(3, 4)
                assert cast_weight(x) is x  # an activation: new every call
                w64 = _param(3, 4, dtype=torch.float64)
                assert cast_weight(w64) is w64  # fp64 stays (autocast leaves it too)
                wb = _param(3, 4, dtype=BF16)
                assert cast_weight(wb) is wb  # already the autocast dtype
    assert len(cache) == 1  # only the frozen parameter's entry


def test_changed_weight_cast_again_in_place():
    w = _param(6, 3)
    cache = WeightCasts()
    with torch.no_grad(), _autocast(), weight_casts(cache):
        cached = cast_weight(w)
        ptr = cached.data_ptr()
        w.add_(1.0)  # an optimizer step: the version counter moves
        again = cast_weight(w)
    assert torch.equal(again, w.to(BF16)) and again.data_ptr() == ptr  # a graph reads it there
    with torch.no_grad():
        w.mul_(-2.0)
    assert cache.refresh() == 1 and cache.refresh() == 0  # CUDA graphs: recast before replays
    assert torch.equal(cached, w.detach().to(BF16))
    with torch.no_grad():  # a new storage (``p.data = ...``) is seen too
        w.data = torch.ones(6, 3)
    assert cache.refresh() == 1 and torch.equal(cached, torch.ones(6, 3, dtype=BF16))


def test_made_in_inference_mode_usable_with_autograd():
    w = _param(4, 4).requires_grad_(False)  # a frozen weight, then a step with autograd on
    cache = WeightCasts()
    with torch.inference_mode(), _autocast(), weight_casts(cache):
        cached = cast_weight(w)
    assert not cached.is_inference()
    x = torch.randn(2, 4, requires_grad=True)
    with _autocast(), weight_casts(cache):
        y = torch.nn.functional.linear(x, cast_weight(w))
    y.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_stacked_parameters():
    ws = [_param(2, 5, seed=i) for i in range(3)]
    cache = WeightCasts()
    with torch.no_grad():
        plain = cast_stacked(ws, "cat", concatenated)  # no cache: made now, in fp32
        assert plain.dtype == torch.float32 and torch.equal(plain, torch.cat(ws))
        with _autocast(), weight_casts(cache):
            stacked = cast_stacked(ws, "cat", concatenated)
            assert cast_stacked(ws, "cat", concatenated) is stacked
            padded = cast_stacked(ws[:1], "pad 4", lambda b: torch.cat([b, b.new_zeros(2, 5)]))
            ws[1].add_(3.0)
            assert torch.equal(cast_stacked(ws, "cat", concatenated), torch.cat(ws).to(BF16))
    assert torch.equal(stacked, torch.cat(ws).to(BF16))  # recast in place
    assert padded.shape == (4, 5) and not padded[2:].any() and len(cache) == 2


def test_lower_reads_the_cache_for_parameters():
    w, b = _param(5, 3), _param(5, seed=1)
    x = torch.randn(2, 3)
    cache = WeightCasts()
    with torch.no_grad(), _autocast(), weight_casts(cache):
        (x_l, w_l, b_l), _ = lower((x, w, b), {})
        (_, w_again), kw = lower((x, w), {"bias": b})
    assert x_l.dtype == w_l.dtype == b_l.dtype == BF16
    assert w_again is w_l and kw["bias"] is b_l  # one cast each, not one per call
    assert torch.equal(w_l, w.to(BF16)) and len(cache) == 2
    with torch.no_grad(), _autocast():  # no cache: cast per call, the same values
        (_, w_plain, _), _ = lower((x, w, b), {})
    assert w_plain is not w_l and torch.equal(w_plain, w_l)


def test_fx_tracing_is_left_alone():
    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = _param(3, 3)

        def forward(self, x):
            return torch.nn.functional.linear(x, cast_weight(self.weight))

    cache = WeightCasts()
    with weight_casts(cache):
        traced = torch.fx.symbolic_trace(Lin())
    assert len(cache) == 0 and any(n.op == "get_attr" for n in traced.graph.nodes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_no_entry_made_during_capture():
    w = _param(8, 8).cuda()
    w = nn.Parameter(w.detach())
    cache = WeightCasts()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.autocast("cuda", dtype=BF16), weight_casts(cache):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side), torch.cuda.graph(graph):
            out = cast_weight(w)
    assert out is w and len(cache) == 0


# --- training: one grouped cast per block forward (grouped_casts) ---------------------------

import collections  # noqa: E402

from fold_ops.weight_casts import grouped, grouped_casts  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class _Casts(TorchDispatchMode):
    """Counts dtype casts (``aten._to_copy``) and concatenations, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


class _Block(nn.Module):
    """Projections read through cast_weight / cast_stacked as fold-model's layers read them, a
    weight read twice, an unread one, a frozen one, an fp64 one and a LayerNorm read in fp32."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = nn.Parameter(torch.randn(6, 5, generator=g))
        self.b = nn.Parameter(torch.randn(6, 5, generator=g))
        self.bias = nn.Parameter(torch.randn(12, generator=g))
        self.twice = nn.Parameter(torch.randn(6, 6, generator=g))
        self.unread = nn.Parameter(torch.randn(4, generator=g))
        self.frozen = nn.Parameter(torch.randn(6, 6, generator=g), requires_grad=False)
        self.w64 = nn.Parameter(torch.randn(6, 6, generator=g, dtype=torch.float64))
        self.norm = nn.LayerNorm(6)

    @grouped
    def forward(self, x):  # x [R, 5] -> [R, 6]
        packed = cast_stacked((self.a, self.b), "cat", concatenated)  # [12, 5]
        (bias,), _ = lower((self.bias,), {})
        h = torch.nn.functional.linear(x, packed, bias)[:, :6]
        h = torch.nn.functional.linear(h, cast_weight(self.twice))
        h = torch.nn.functional.linear(h, cast_weight(self.twice))
        h = torch.nn.functional.linear(h, cast_weight(self.frozen))
        h = self.norm(h.float()) + (h.double() @ self.w64).float()
        return h


def _step(block, x):
    """``(output, {name: grad})`` of one training step under bf16 autocast."""
    with _autocast():
        out = block(x)
    out.float().square().sum().backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.fixture
def per_call(monkeypatch):
    """Runs a function with grouped casts off (each parameter cast per call), then on."""
    def run(fn):
        monkeypatch.setenv("FOLD_GROUPED_CASTS", "0")
        before = fn()
        monkeypatch.setenv("FOLD_GROUPED_CASTS", "1")
        return before, fn()
    return run


def test_grouped_casts_equal_the_per_call_casts(per_call):
    """Outputs and every gradient bit for bit: the same casts of the same values. (The weight
    read twice has its two gradients added in bf16 before the cast back, as autocast's own cast
    cache does on the per-call path.)"""
    block = _Block()
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))
    (out0, g0), (out1, g1) = per_call(lambda: _step(block, x))
    assert torch.equal(out0, out1)
    assert g1["unread"] is None and g1["frozen"] is None  # no gradient made up
    for name, g in g0.items():
        assert (g is None) == (g1[name] is None), name
        assert g is None or torch.equal(g, g1[name]), name
    assert all(torch.isfinite(g).all() for g in g1.values() if g is not None)


def test_grouped_casts_fewer_launches(per_call):
    block = _Block()
    x = torch.randn(7, 5)
    _step(block, x)  # the plan: which parameters the forward asks for

    def counted():
        with _Casts() as mode:
            _step(block, x)
        return mode.count
    before, after = per_call(counted)
    # per call, forward: the packed (a, b) projection, the bias, twice (once: autocast's cache)
    # and frozen; backward: the three trainable ones. Grouped: one cast each way, and frozen's
    # (not trainable, not grouped). The activations' casts come on top in both.
    assert before["_to_copy"] - after["_to_copy"] == (4 + 3) - (2 + 1)
    assert after["cat"] == before["cat"] + 2  # the flat copies, forward and backward


def test_grouped_casts_only_where_they_are_the_cast():
    block = _Block()
    x = torch.randn(3, 5)
    with torch.no_grad(), _autocast():  # no autograd: prediction's cache, not a group
        with grouped_casts(block):
            assert cast_weight(block.a) is block.a
    with grouped_casts(block):  # no autocast: nothing to cast
        assert cast_weight(block.a) is block.a
    with _autocast(), grouped_casts(block):
        served = cast_weight(block.a)
        assert served.dtype == BF16 and torch.equal(served, block.a.detach().to(BF16))
        assert cast_weight(block.a, torch.float16) is block.a  # another dtype: not this cast
        assert cast_weight(block.w64) is block.w64 and cast_weight(block.frozen) is block.frozen
        with torch.autocast("cpu", enabled=False):
            assert cast_weight(block.a) is block.a  # fp32 region inside the block
        other = _param(6, 5)
        assert cast_weight(other) is other  # another module's parameter
    assert cast_weight(block.a) is block.a  # the group ends with the block
    block(x)  # grouped forward without autocast runs as before


def test_grouped_casts_switch_and_tracing(monkeypatch):
    block = _Block()
    monkeypatch.setenv("FOLD_GROUPED_CASTS", "0")
    with _autocast(), grouped_casts(block):
        assert cast_weight(block.a) is block.a
    monkeypatch.setenv("FOLD_GROUPED_CASTS", "1")
    import fold_ops.weight_casts as wc

    monkeypatch.setattr(wc, "fx_tracing", lambda: True)
    with _autocast(), grouped_casts(block):
        assert cast_weight(block.a) is block.a


def test_grouped_casts_learn_what_the_forward_asks_for():
    """The first group casts every candidate; later ones what was asked (not the LayerNorm's
    parameters nor the unread one); a parameter asked for later joins the next group."""
    import fold_ops.weight_casts as wc

    block = _Block()
    x = torch.randn(3, 5)
    _step(block, x)
    asked = {id(p) for p in wc._PLANS[block].asked}
    assert asked == {id(block.a), id(block.b), id(block.bias), id(block.twice)}
    with _autocast(), grouped_casts(block):
        assert cast_weight(block.unread) is block.unread  # not in the group: per call
    assert id(block.unread) in {id(p) for p in wc._PLANS[block].asked}
    with _autocast(), grouped_casts(block):
        assert cast_weight(block.unread).dtype == BF16
    block.extra = nn.Parameter(torch.ones(2))  # a registration: the plan is made again
    assert wc._PLANS.get(block) is None or wc._PLANS[block].generation != wc._GENERATION[0]


def test_grouped_casts_under_checkpoint(per_call):
    """A grouped forward recomputed by activation checkpointing: same gradients."""
    block = _Block()
    x = torch.randn(5, 5, requires_grad=True)

    def run():
        with _autocast():
            out = checkpoint(block, x, use_reentrant=False)
        out.float().sum().backward()
        grads = [x.grad] + [p.grad for p in block.parameters()]
        block.zero_grad(set_to_none=True)
        x.grad = None
        return grads
    run()
    before, after = per_call(run)
    for a, b in zip(before, after, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-2)
            assert torch.isfinite(b).all()
