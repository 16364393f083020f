"""AutoChunk on our own small modules: chunked == unchunked, budgets met, memory estimate vs the
measured peak on CPU, clear errors."""

from __future__ import annotations

import fold_chunk as fc
import pytest
import torch
import torch.fx as fx
from fold_chunk.api import simulated_peak
from toy_modules import ToyAttentionPairBias, ToyStack, ToyTransition, ToyTriangleMultiplication


def _mask(*shape: int, gen: torch.Generator) -> torch.Tensor:
    mask = (torch.rand(*shape, generator=gen) > 0.25).float()  # holes
    mask[..., 0] = 1.0  # keep one key per row so no row is all-masked
    return mask


def _cases():
    gen = torch.Generator().manual_seed(0)
    s, n = 7, 19
    m = torch.randn(s, n, 12, generator=gen)
    z = torch.randn(n, n, 6, generator=gen)
    yield "attention", ToyAttentionPairBias(), (m, z, _mask(s, n, gen=gen))
    yield "triangle", ToyTriangleMultiplication(), (z, _mask(n, n, gen=gen))
    yield "stack", ToyStack(), (m, z, _mask(s, n, gen=gen), _mask(n, n, gen=gen))


CASES = {name: (mod, args) for name, mod, args in _cases()}


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("fraction", [0.6, 0.25, 0.0])
def test_chunked_equals_unchunked(name: str, fraction: float) -> None:
    """Budgets between the unchunked peak and the smallest reachable one (fraction 0)."""
    torch.manual_seed(1)
    module, args = CASES[name]
    module.eval()
    peak = fc.estimate_peak_memory(module, args)
    smallest = fc.smallest_reachable_peak(module, args)
    assert smallest < 0.6 * peak
    budget = int(smallest + fraction * (peak - smallest))
    chunked = fc.autochunk(module, args, budget)
    report = chunked.report
    assert report.regions, "a budget below the peak must create chunk regions"
    assert report.estimated_peak_after <= budget
    assert report.simulated_peak_after <= budget
    with torch.no_grad():
        out = _flat(chunked(*args))
        ref = _flat(module(*args))
        ref64 = _flat(module.double()(*[a.double() for a in args]))
    module.float()
    for o, r, r64 in zip(out, ref, ref64):
        assert torch.isfinite(o).all()
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        # fp32 vs the float64 reference: relative norm error ~ 1e-6 for these sizes
        err = (o.double() - r64).norm() / r64.norm()
        assert err < 1e-5, err


@pytest.mark.parametrize("name", list(CASES))
def test_estimate_matches_measured_peak(name: str) -> None:
    """Estimate (FakeTensor run, live-tensor accounting) vs the measured peak of the real CPU
    run of the same generated code, both chunked and unchunked: within 15%."""
    module, args = CASES[name]
    module.eval()
    est = fc.estimate_peak_memory(module, args)
    with torch.no_grad():
        measured = fc.measure_peak_memory(fx.symbolic_trace(module), *args)
    assert abs(est - measured) <= 0.15 * measured, (est, measured)
    chunked = fc.autochunk(module, args, fc.smallest_reachable_peak(module, args))
    gm = chunked.graph_module(args)
    with torch.no_grad():
        measured_chunked = fc.measure_peak_memory(gm, *args)
    for estimate in (chunked.report.estimated_peak_after, fc.estimate_peak_memory(chunked, args)):
        assert abs(estimate - measured_chunked) <= 0.15 * measured_chunked, (
            estimate, measured_chunked)
    assert measured_chunked < 0.6 * measured


def test_budget_that_cannot_be_met_names_smallest_peak() -> None:
    module, args = CASES["attention"]
    smallest = fc.smallest_reachable_peak(module, args)
    assert 0 < smallest < fc.estimate_peak_memory(module, args)
    with pytest.raises(fc.MemoryBudgetError, match="smallest reachable estimated peak") as info:
        fc.autochunk(module, args, smallest // 2)
    assert info.value.smallest == smallest
    assert str(smallest) in str(info.value)
    # and the smallest reachable peak itself is a budget that can be met
    fc.autochunk(module, args, smallest)


def test_no_chunking_when_budget_fits() -> None:
    module, args = CASES["triangle"]
    peak = fc.estimate_peak_memory(module, args)
    chunked = fc.autochunk(module, args, peak)
    assert chunked.report.regions == []
    with torch.no_grad():
        torch.testing.assert_close(chunked(*args), module(*args), rtol=0, atol=0)


def test_attention_hoists_pair_bias_and_chunks_rows() -> None:
    """The pair bias does not depend on the MSA row: it is computed once, outside the loop; the
    logits are chunked along N_seq or a query dim, never the softmax (key) dim."""
    module, args = CASES["attention"]
    peak = fc.estimate_peak_memory(module, args)
    report = fc.autochunk(module, args, int(peak * 0.35)).report
    (region,) = report.regions
    assert region.n_hoisted_nodes > 0
    assert region.n_chunks >= 2 and region.chunk_size * region.n_chunks >= region.extent


def test_new_shapes_are_planned_again() -> None:
    module = ToyTransition().eval()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(13, 11, 6, generator=gen)
    peak = fc.estimate_peak_memory(module, (x,))
    chunked = fc.autochunk(module, (x,), int(peak * 0.3))
    y = torch.randn(9, 17, 6, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(chunked(y), module(y), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(chunked(x), module(x), rtol=1e-5, atol=1e-6)


def test_bad_arguments() -> None:
    module, args = CASES["triangle"]
    with pytest.raises(ValueError, match="memory_budget"):
        fc.autochunk(module, args, -1)
    with pytest.raises(ValueError, match="min_chunk"):
        fc.autochunk(module, args, 10, min_chunk=0)

    class Untraceable(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x
            return -x

    with pytest.raises(TypeError, match="could not trace"):
        fc.autochunk(Untraceable(), (torch.randn(3),), 10)


def test_simulated_peak_of_unchunked_graph_equals_estimate() -> None:
    module, args = CASES["stack"]
    gm = fx.symbolic_trace(module)
    assert simulated_peak(gm, args) == fc.estimate_peak_memory(module, args)
