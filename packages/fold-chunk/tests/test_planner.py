"""ChunkPlanner: one trace, plans for many budgets, the same results as the one-shot functions;
its cached smallest-peak search is never edited by the plans made from it."""

from __future__ import annotations

import fold_chunk as fc
import pytest
import torch
from fold_chunk.region import GraphIndex
from fold_chunk.search import autochunk_search, smallest_peak_search
from toy_modules import ToyStack


def _case():
    gen = torch.Generator().manual_seed(3)
    s, n = 5, 23
    m = torch.randn(s, n, 12, generator=gen)
    z = torch.randn(n, n, 6, generator=gen)
    msa_mask = (torch.rand(s, n, generator=gen) > 0.25).float()
    pair_mask = (torch.rand(n, n, generator=gen) > 0.25).float()
    msa_mask[..., 0] = 1.0
    pair_mask[..., 0] = 1.0
    torch.manual_seed(0)
    return ToyStack().eval(), (m, z, msa_mask, pair_mask)


def test_planner_matches_one_shot_functions() -> None:
    module, args = _case()
    planner = fc.ChunkPlanner(module, args)
    peak = fc.estimate_peak_memory(module, args)
    smallest = fc.smallest_reachable_peak(module, args, min_chunk=2)
    assert planner.estimate_peak() == peak
    assert planner.smallest_reachable_peak(min_chunk=2) == smallest
    assert smallest < peak
    # the floor (every region at min_chunk; on this stack the greedy search misses it and the
    # relaxed smallest-peak plan is taken) and a budget the greedy search meets
    one_shot = {}
    for budget in (smallest, (smallest + peak) // 2):
        via_planner = planner.autochunk(budget, min_chunk=2)
        one_shot[budget] = str(fc.autochunk(module, args, budget, min_chunk=2).report)
        assert str(via_planner.report) == one_shot[budget]
        assert via_planner.report.simulated_peak_after <= budget
        with torch.no_grad():
            out = via_planner(*args)
            ref = module(*args)
        for o, r in zip(out, ref):
            assert torch.isfinite(o).all()
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)  # fp32, same math per chunk
    # the cached floor is unchanged by the plans above (they grow/halve chunk sizes in place)
    assert planner.smallest_reachable_peak(min_chunk=2) == smallest
    assert str(planner.autochunk(smallest, min_chunk=2).report) == one_shot[smallest]


def test_planner_impossible_budget_and_wrong_module() -> None:
    module, args = _case()
    planner = fc.ChunkPlanner(module, args)
    smallest = planner.smallest_reachable_peak(min_chunk=2)
    with pytest.raises(fc.MemoryBudgetError, match=f"smallest reachable estimated peak is "
                                                   f"{smallest} bytes"):
        planner.autochunk(smallest - 1, min_chunk=2)
    with pytest.raises(ValueError, match="min_chunk"):
        planner.autochunk(smallest, min_chunk=0)
    with pytest.raises(ValueError, match="another module"):
        fc.AutoChunked(ToyStack().eval(), args, smallest, 2, planner=planner)


def test_search_with_memo_and_cached_floor_equals_without() -> None:
    module, args = _case()
    planner = fc.ChunkPlanner(module, args)
    g = planner.graph
    floor = smallest_peak_search(g, min_chunk=2)
    sizes = [r.chunk_size for r in floor.regions]
    peak = planner.estimate_peak()
    for budget in range(floor.estimate_after.peak, peak, max(1, (peak - floor.estimate_after.peak)
                                                          // 7)):
        # a: a fresh graph index (no memo of flows and candidate regions); b: the memo warmed
        # by every earlier budget, and the cached floor
        a = autochunk_search(GraphIndex(g.gm, g.info), budget, min_chunk=2)
        b = autochunk_search(g, budget, min_chunk=2, floor=lambda: floor)
        assert a.met == b.met
        assert [(r.start, r.end, r.chunk_size) for r in a.regions] == \
            [(r.start, r.end, r.chunk_size) for r in b.regions]
        assert [r.assign for r in a.regions] == [r.assign for r in b.regions]
        assert a.estimate_after.peak == b.estimate_after.peak
    assert [r.chunk_size for r in floor.regions] == sizes


class _ShapeMismatch(torch.nn.Module):
    """Traces, then fails in the fake run (the weight does not fit the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.register_buffer("scale", torch.rand(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _real(module: torch.nn.Module) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return all(not isinstance(t, FakeTensor) for t in (*module.parameters(), *module.buffers()))


def test_fake_run_restores_real_parameters() -> None:
    module, args = _case()
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    fc.ChunkPlanner(module, args).autochunk(fc.smallest_reachable_peak(module, args, min_chunk=2),
                                            min_chunk=2)
    assert _real(module)
    assert all(isinstance(p, torch.nn.Parameter) for p in module.parameters())
    for k, v in module.state_dict().items():
        torch.testing.assert_close(v, weights[k], rtol=0, atol=0)
    bad = _ShapeMismatch().eval()
    with pytest.raises(Exception):  # noqa: B017 - whatever the fake kernel raises
        fc.ChunkPlanner(bad, (torch.randn(4, 7),))
    assert _real(bad) and isinstance(bad.lin.weight, torch.nn.Parameter)
