"""Public entry points: :func:`autochunk`, :func:`estimate_peak_memory`,
:func:`smallest_reachable_peak`, and :class:`ChunkPlanner` behind them (one trace of a module
at one input signature, plans for any number of budgets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from fold_chunk.codegen import generate
from fold_chunk.dims import _Full, input_dims
from fold_chunk.memory import estimate_plan
from fold_chunk.region import ChunkRegion, GraphIndex
from fold_chunk.report import ChunkReport, RegionReport
from fold_chunk.runtime import first_and_last_chunk_only
from fold_chunk.search import SearchResult, autochunk_search, smallest_peak_search
from fold_chunk.trace import fake_run, trace_module

__all__ = ["MemoryBudgetError", "AutoChunked", "ChunkPlanner", "autochunk",
           "estimate_peak_memory", "smallest_reachable_peak"]


class MemoryBudgetError(ValueError):
    """The memory budget is below the smallest peak AutoChunk can reach."""

    def __init__(self, budget: int, smallest: int, node: str) -> None:
        self.budget = budget
        self.smallest = smallest
        self.node = node
        super().__init__(
            f"fold_chunk.autochunk: memory budget {budget} bytes ({budget / 2**20:.2f} MiB) "
            f"cannot be met; the smallest reachable estimated peak is {smallest} bytes "
            f"({smallest / 2**20:.2f} MiB), at node {node!r}. Raise the budget or lower "
            "min_chunk."
        )


def _signature(inputs: Sequence[Any]) -> tuple:
    return tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else
                 ("const", repr(x)) for x in inputs)


def simulated_peak(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """Peak activation bytes of running ``gm`` on FakeTensors (chunk loops run their first
    and last chunk only; the others need the same memory)."""
    with first_and_last_chunk_only():
        _, peak = fake_run(gm, example_inputs)
    return peak


def _region_report(k: int, g: GraphIndex, r: ChunkRegion) -> RegionReport:
    ins: dict[str, int | None] = {}
    for x, d in r.assign.items():
        if isinstance(d, _Full):
            continue
        dims = input_dims(x, d, g.info, g.gm)
        if isinstance(dims, dict):
            for a, ad in dims.items():
                if g.index[a] < r.start or isinstance(r.assign.get(a), _Full):
                    ins[a.name] = ad
    return RegionReport(
        name=f"chunk_loop_{k}", first_node=g.nodes[r.start].name, last_node=g.nodes[r.end].name,
        peak_node=r.peak_node, extent=r.extent, chunk_size=r.chunk_size, n_chunks=r.n_chunks,
        n_chunked_nodes=len(r.chunked()),
        n_hoisted_nodes=sum(isinstance(d, _Full) for d in r.assign.values()),
        output_dims={x.name: d for x, d in r.outputs if not isinstance(d, _Full)},
        input_dims=ins,
    )


class ChunkPlanner:
    """AutoChunk planning for ``module`` at the shapes, dtypes and devices of ``example_inputs``.

    The module is traced and run on FakeTensors once, here; the smallest-peak search (Algorithm
    1 at budget 0) runs once per ``min_chunk`` and is reused by every plan that falls back on it
    and by the error of an unmeetable budget. Plans for several budgets therefore cost one trace
    and one smallest-peak search between them, and give the same results as separate calls of
    :func:`autochunk` / :func:`smallest_reachable_peak` / :func:`estimate_peak_memory`.

    The trace is a snapshot: a module whose traced code changes later (``set_chunk_size``,
    other Python attributes read in ``forward``) needs a new planner."""

    def __init__(self, module: nn.Module, example_inputs: Sequence[Any]) -> None:
        self.module = module
        self.example_inputs = tuple(example_inputs)
        self.signature = _signature(self.example_inputs)
        traced = trace_module(module, self.example_inputs)
        self.graph = GraphIndex(traced.gm, traced.info)
        self._floors: dict[int, SearchResult] = {}
        self._peak: int | None = None

    def estimate_peak(self) -> int:
        """Estimated peak activation bytes without chunking (see :func:`estimate_peak_memory`)."""
        if self._peak is None:
            self._peak = estimate_plan(self.graph, []).peak
        return self._peak

    def _floor(self, min_chunk: int) -> SearchResult:
        if min_chunk not in self._floors:
            self._floors[min_chunk] = smallest_peak_search(self.graph, min_chunk=min_chunk)
        return self._floors[min_chunk]

    def smallest_reachable_peak(self, *, min_chunk: int = 1) -> int:
        """The lowest estimated peak the search reaches (every region at ``min_chunk``)."""
        return self._floor(min_chunk).estimate_after.peak

    def plan(self, memory_budget: int, *, min_chunk: int = 1,
             ) -> tuple[fx.GraphModule, ChunkReport]:
        """The generated GraphModule and its report for ``memory_budget`` bytes; raises
        :class:`MemoryBudgetError` when it cannot be met."""
        g, budget = self.graph, int(memory_budget)
        result = autochunk_search(g, budget, min_chunk=min_chunk,
                                  floor=lambda: self._floor(min_chunk))
        if not result.met:
            after = self._floor(min_chunk).estimate_after
            raise MemoryBudgetError(budget, after.peak, g.nodes[after.peak_index].name)
        regions = result.regions
        gm = generate(g, regions)
        simulated = simulated_peak(gm, self.example_inputs)
        # The analytic model scales transients by the chunk fraction; a transient that does not
        # scale (a whole operand copied per chunk) shows in the fake run. Halve the chunk of the
        # loops until the generated code itself fits.
        for _ in range(8):
            if simulated <= budget or not regions:
                break
            shrinkable = [r for r in regions if r.chunk_size // 2 >= max(min_chunk, 1)]
            if not shrinkable:
                break
            for r in shrinkable:
                r.chunk_size //= 2
            gm = generate(g, regions)
            simulated = simulated_peak(gm, self.example_inputs)
        if simulated > budget:
            raise MemoryBudgetError(budget, simulated, "generated code (fake run)")
        after = estimate_plan(g, regions)
        report = ChunkReport(
            memory_budget=budget,
            estimated_peak_before=result.estimate_before.peak,
            estimated_peak_after=after.peak,
            simulated_peak_after=simulated,
            peak_node_before=g.nodes[result.estimate_before.peak_index].name,
            regions=[_region_report(k, g, r) for k, r in enumerate(regions)],
        )
        return gm, report

    def autochunk(self, memory_budget: int, *, min_chunk: int = 1,
                  report: bool = False) -> AutoChunked:
        """:func:`autochunk` of this planner's module, planned for its example inputs here."""
        _check_args(memory_budget, min_chunk)
        wrapped = AutoChunked(self.module, self.example_inputs, memory_budget, min_chunk,
                              planner=self)
        if report:
            print(wrapped.report)
        return wrapped


class AutoChunked(nn.Module):
    """The module :func:`autochunk` returns. Generated code is specialised to input shapes,
    dtypes and devices; a call with new ones plans again for them (cached per signature).
    ``report`` describes the plan for the example inputs; ``graph_module(inputs)`` gives the
    generated GraphModule."""

    def __init__(self, module: nn.Module, example_inputs: Sequence[Any], memory_budget: int,
                 min_chunk: int, *, planner: ChunkPlanner | None = None) -> None:
        super().__init__()
        self.module = module
        self.memory_budget = int(memory_budget)
        self.min_chunk = min_chunk
        self._plans: dict[tuple, tuple[fx.GraphModule, ChunkReport]] = {}
        if planner is not None:
            if planner.module is not module:
                raise ValueError("fold_chunk.AutoChunked: the planner was made for another "
                                 "module")
            self._plans[planner.signature] = planner.plan(self.memory_budget,
                                                          min_chunk=min_chunk)
        self.report = self._get(tuple(example_inputs))[1]

    def _get(self, inputs: tuple) -> tuple[fx.GraphModule, ChunkReport]:
        key = _signature(inputs)
        if key not in self._plans:
            self._plans[key] = ChunkPlanner(self.module, inputs).plan(
                self.memory_budget, min_chunk=self.min_chunk)
        return self._plans[key]

    def graph_module(self, inputs: Sequence[Any]) -> fx.GraphModule:
        return self._get(tuple(inputs))[0]

    def forward(self, *inputs: Any) -> Any:
        return self._get(inputs)[0](*inputs)


def _check_args(memory_budget: int, min_chunk: int) -> None:
    if memory_budget < 0:
        raise ValueError(f"fold_chunk.autochunk: memory_budget must be >= 0, got {memory_budget}")
    if min_chunk < 1:
        raise ValueError(f"fold_chunk.autochunk: min_chunk must be >= 1, got {min_chunk}")


def autochunk(module: nn.Module, example_inputs: Sequence[Any], memory_budget: int, *,
              min_chunk: int = 1, report: bool = False) -> nn.Module:
    """Chunk ``module`` so that its estimated peak activation memory fits ``memory_budget``
    bytes (FastFold AutoChunk). For inference (no autograd graph is kept).

    ``module`` must trace with ``torch.fx.symbolic_trace``; ``example_inputs`` are the
    positional arguments of its forward (real tensors; only their shapes/dtypes/devices are
    used). ``min_chunk`` bounds chunk sizes from below (small chunks are slow). With
    ``report=True`` the plan is printed. Raises :class:`MemoryBudgetError` naming the smallest
    reachable peak when the budget cannot be met."""
    _check_args(memory_budget, min_chunk)
    wrapped = AutoChunked(module, example_inputs, memory_budget, min_chunk)
    if report:
        print(wrapped.report)
    return wrapped


def estimate_peak_memory(module: nn.Module, example_inputs: Sequence[Any]) -> int:
    """Estimated peak activation bytes of ``module(*example_inputs)`` run as fx-generated code
    (values freed after their last use); inputs and parameters are not counted. For an
    :class:`AutoChunked` module, the fake-run peak of its generated code."""
    if isinstance(module, AutoChunked):
        return simulated_peak(module.graph_module(example_inputs), example_inputs)
    return ChunkPlanner(module, example_inputs).estimate_peak()


def smallest_reachable_peak(module: nn.Module, example_inputs: Sequence[Any], *,
                            min_chunk: int = 1) -> int:
    """The lowest estimated peak AutoChunk's search reaches (every region at ``min_chunk``)."""
    return ChunkPlanner(module, example_inputs).smallest_reachable_peak(min_chunk=min_chunk)
