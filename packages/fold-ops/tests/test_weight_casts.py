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
