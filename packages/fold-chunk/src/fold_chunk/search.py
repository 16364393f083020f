"""FastFold's Algorithm 1: find chunk regions until the estimated peak fits the budget.

::

    C <- {}
    while the estimated peak exceeds the budget:
        peak_node  <- argmax EstimateMemory(G, C)
        max_range  <- FindMaxChunk(G, C, peak_node)       # the busy stretch around the peak
        candidates <- FindPossibleChunk(G, C, max_range)  # two-stage search (region.py)
        best       <- FindBestChunk(G, C, budget, candidates)
        C <- C + {best}

*FindMaxChunk* extends from the peak node in both directions, not crossing an existing region,
an in-place op or the graph inputs, up to the nearest point where the live memory falls to its
lowest level nearby (a "valley": between two sub-blocks of an Evoformer only the residual
streams are live), at most ``max_span`` nodes each way.

*FindPossibleChunk* enumerates the region ends ``e`` in that range and the dims of ``e``; one
backward flow per (``e``, dim) (stage 1: the end node and its dim fix everything) yields the legal
starts ``s`` (stage 2: every node in ``[s, e]`` obeys rules 2 and 3). Only regions in which the
peak node itself is chunked are kept.

*FindBestChunk* takes, for each candidate, the largest chunk size whose region peak fits the
budget (balanced: ``ceil(L / ceil(L / c_max))``) and picks the fitting candidate with the least
speed cost: ``n_chunks * (ops in the loop body + 1 per sliced input + 1 per output)``, view ops
counting a tenth, a strided (not outermost) chunk dim on an input costing one more op. When no
candidate fits, it picks the one with the lowest peak at ``min_chunk``; when the peak node then
stays the peak inside its region, the budget cannot be met and the search stops. Because greedy
choices for a loose budget can strand a later peak, a failed search falls back on the plan of
the smallest peak with its chunk sizes grown back to the budget (:func:`relax_chunk_sizes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch.fx as fx
import torch.nn as nn

from fold_chunk.dims import _ELEMENTWISE, FULL, _Full, op_name
from fold_chunk.memory import (
    MemoryEstimate,
    body_peak,
    estimate_plan,
    region_fixed_bytes,
)
from fold_chunk.region import ChunkRegion, Flow, GraphIndex, flow_from_end
from fold_chunk.trace import TensorMeta, is_inplace

__all__ = ["SearchResult", "autochunk_search", "smallest_peak_search", "VIEW_OPS"]

VIEW_OPS = {"permute", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis",
            "view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "expand",
            "expand_as", "view_as", "reshape_as", "getitem", "to", "contiguous", "type_as",
            "broadcast_to", "detach"}


@dataclass
class SearchResult:
    regions: list[ChunkRegion]
    estimate_before: MemoryEstimate
    estimate_after: MemoryEstimate
    met: bool

    def copy(self) -> SearchResult:
        """A copy whose regions can be edited (chunk sizes are grown or halved in place)."""
        return replace(self, regions=[replace(r) for r in self.regions])


@dataclass(frozen=True)
class _RegionParts:
    """What candidate region ``[s, e]`` along one dim costs, independent of the plan so far
    (so memoised on the graph): the nodes :func:`_hoist_views` moved out of the loop, the
    whole-size bytes it holds (hoisted nodes, output buffers) and its body's peak."""

    hoisted: frozenset[fx.Node]
    fixed: int
    body: int
    hoisted_temp: int


def _flow(g: GraphIndex, e: int, dim: int, lo: int, root: nn.Module) -> Flow:
    key = (e, dim, lo, id(root))
    flow = g.flow_cache.get(key)
    if flow is None:
        flow = g.flow_cache[key] = flow_from_end(g, e, dim, lo, root)
    return flow


def _region_assign(g: GraphIndex, flow: Flow, s: int, e: int,
                   hoisted: frozenset[fx.Node]) -> dict:
    """Chunk dim (or FULL) of every node of ``[s, e]``: the flow's (which for nodes at or after
    ``s`` does not depend on where the walk was told to stop), with the views hoisted."""
    assign = {g.nodes[i]: flow.assign[g.nodes[i]] for i in range(s, e + 1)}
    for x in hoisted:
        assign[x] = FULL
    return assign


def _region_parts(g: GraphIndex, flow: Flow, s: int, e: int, dim: int) -> _RegionParts:
    key = (s, e, dim)
    parts = g.region_cache.get(key)
    if parts is None:
        assign = _region_assign(g, flow, s, e, frozenset())
        _hoist_views(g, s, e, assign)
        hoisted = frozenset(x for x, d in assign.items()
                            if isinstance(d, _Full) and not isinstance(flow.assign[x], _Full))
        body, hoisted_temp = body_peak(g, s, e, assign)
        parts = _RegionParts(hoisted, region_fixed_bytes(g, s, e, assign), body, hoisted_temp)
        g.region_cache[key] = parts
    return parts  # type: ignore[return-value]


@dataclass
class _Candidate:
    region: ChunkRegion
    peak: int
    cost: float


def _is_barrier(x: fx.Node) -> bool:
    return x.op in ("placeholder", "output") or is_inplace(x)


def find_max_chunk(g: GraphIndex, est: MemoryEstimate, p: int, max_span: int
                   ) -> tuple[int, int, int]:
    """The busy stretch ``[lo, hi]`` around peak node ``p`` (see module doc), and where its
    folded residual/LayerNorm tail starts (``hi + 1`` when it has none)."""
    n = len(g.nodes)

    def blocked(i: int) -> bool:
        return i < 0 or i >= n or est.region_of[i] >= 0 or _is_barrier(g.nodes[i])

    left = p
    while p - left < max_span and not blocked(left - 1):
        left -= 1
    right = p
    while right - p < max_span and not blocked(right + 1):
        right += 1
    # valleys: live memory entering i (for starts) and leaving j (for ends)
    window = est.live_in[left: p + 1]
    floor = window.min()
    lo = max(i for i in range(left, p + 1) if est.live_in[i] <= floor * 1.02 + 1)
    after = [est.live_in[j + 1] if j + 1 < n else 0 for j in range(p, right + 1)]
    floor_r = min(after)
    hi = min(j for j, v in zip(range(p, right + 1), after) if v <= floor_r * 1.02 + 1)
    # a valley right at p leaves no room; fall back to the whole stretch on that side
    if lo == p:
        lo = left
    if hi == p:
        hi = right
    # A residual add and a LayerNorm after the valley keep the live level flat, so the valley
    # would end the region before them and leave both to be computed whole (two whole tensors
    # live: the region's output buffer and the sum). Fold them into the region instead.
    tail = hi + 1
    while hi < right and _folds_into_region(g, hi + 1) and \
            (est.live_in[hi + 2] if hi + 2 < n else 0) <= floor_r * 1.02 + 1:
        hi += 1
    return lo, hi, tail


# (fold_op: the contract's leaf ops, fold_chunk.leaf_dims: a LayerNorm, a residual add, a gate)
_NORMS = {"layer_norm", "rms_norm", "module:LayerNorm", "fold_op:layer_norm",
          "fold_op:layer_norm_fork", "fold_op:adaptive_layer_norm",
          "fold_op:bias_dropout_residual", "fold_op:bias_sigmoid_gate"}


def _folds_into_region(g: GraphIndex, i: int) -> bool:
    """Whether node ``i`` is a residual add, another elementwise op, a LayerNorm or a view: the
    tail that :func:`find_max_chunk` folds into a region past its valley."""
    x = g.nodes[i]
    if _is_barrier(x) or x not in g.info:
        return False
    name = op_name(x, g.gm)
    return name in _ELEMENTWISE or name in _NORMS or name in VIEW_OPS


def _hoist_views(g: GraphIndex, start: int, end: int, assign: dict) -> None:
    """Move layout-only ops of region inputs out of the loop (FastFold: transposes leave the
    chunk): a view of a hoisted or outside tensor is free to compute whole."""
    for i in range(start, end + 1):
        x = g.nodes[i]
        d = assign.get(x)
        if d is None or isinstance(d, _Full) or g.info[x].own:
            continue
        if op_name(x, g.gm) not in VIEW_OPS:
            continue
        if all(g.index[a] < start or isinstance(assign.get(a), _Full) for a in x.all_input_nodes):
            assign[x] = FULL


def _cost(g: GraphIndex, start: int, end: int, assign: dict, n_chunks: int) -> float:
    ops = 0.0
    sliced: set[tuple[fx.Node, int]] = set()
    for i in range(start, end + 1):
        x = g.nodes[i]
        d = assign.get(x)
        if d is None or isinstance(d, _Full):
            continue
        ops += 0.1 if op_name(x, g.gm) in VIEW_OPS else 1.0
        if g.last_use[i] > end:
            ops += 1.0
    for i in range(start, end + 1):
        x = g.nodes[i]
        if isinstance(assign.get(x), _Full) or x not in assign:
            continue
        for a in x.all_input_nodes:
            if g.index[a] < start or isinstance(assign.get(a), _Full):
                meta = g.info[a].meta
                if isinstance(meta, TensorMeta):
                    sliced.add((a, _outermost(meta)))
    ops += sum(1.0 + (0.0 if k == 0 else 1.0) for _, k in sliced)
    return n_chunks * ops


def _outermost(meta: TensorMeta) -> int:
    for k, s in enumerate(meta.shape):
        if s > 1:
            return k
    return 0


def find_best_chunk(g: GraphIndex, est: MemoryEstimate, p: int, lo: int, hi: int,
                    budget: int, min_chunk: int, root: nn.Module,
                    tail: int | None = None) -> _Candidate | None:
    """Enumerate the legal regions around ``p`` and pick the best (see module doc).

    ``tail``: the first node of the residual/LayerNorm tail :func:`find_max_chunk` folded into
    ``[lo, hi]``. A region ending before the tail's end leaves the rest of it whole, at its
    current peak (the region's output buffer replaces the tensor the tail reads, at the same
    size): that peak counts as the candidate's, so the region that folds the tail wins."""
    tail = hi + 1 if tail is None else tail
    best_fit: _Candidate | None = None
    best_any: _Candidate | None = None
    current = est.peak
    p_node = g.nodes[p]
    for e in range(p, hi + 1):
        meta = g.meta(e)
        if not isinstance(meta, TensorMeta) or g.last_use[e] <= e:
            continue
        for dim, extent in enumerate(meta.shape):
            if extent < 2 or extent <= min_chunk:
                continue
            flow = _flow(g, e, dim, lo, root)
            pd = flow.assign.get(p_node)
            if flow.min_start > p or pd is None or isinstance(pd, _Full):
                continue
            for s in range(p, flow.min_start - 1, -1):
                if isinstance(flow.assign.get(g.nodes[s]), _Full):
                    continue
                parts = _region_parts(g, flow, s, e, dim)
                if p_node in parts.hoisted:
                    continue
                fixed = int(est.live_in[s]) + parts.fixed
                body, hoisted_temp = parts.body, parts.hoisted_temp
                if body == 0:
                    continue

                def peak_at(c: int, fixed=fixed, body=body, hoisted_temp=hoisted_temp,
                            extent=extent) -> int:
                    return fixed + max(math.ceil(body * c / extent), hoisted_temp)

                room = budget - fixed
                c_max = int(room * extent // body) if room > 0 else 0
                c_max = min(c_max, extent - 1)
                if c_max >= max(min_chunk, 1):
                    n_chunks = -(-extent // c_max)
                    c = -(-extent // n_chunks)
                    fits = peak_at(c) <= budget
                else:
                    c, fits = max(min_chunk, 1), False
                # the part of the folded tail this region leaves whole keeps its peak
                left_whole = max(e + 1, tail)
                tail_peak = int(est.node_peak[left_whole: hi + 1].max()) if left_whole <= hi \
                    else 0
                if c_max >= max(min_chunk, 1) and tail_peak > budget:
                    fits = False
                peak = max(peak_at(c), tail_peak)
                if peak >= current:
                    continue
                # a non-fitting candidate matters only while none fits, and only if its peak
                # can beat (or tie, then on cost) the lowest so far: skip the cost otherwise
                if not fits and (best_fit is not None or
                                 (best_any is not None and peak > best_any.peak)):
                    continue
                outputs = [(x, d) for x, d in flow.out_dims.items() if g.index[x] >= s]
                assign = _region_assign(g, flow, s, e, parts.hoisted)
                region = ChunkRegion(s, e, assign, extent, c, outputs, p_node.name,
                                     body=(body, hoisted_temp))
                cand = _Candidate(region, peak, _cost(g, s, e, assign, region.n_chunks))
                if fits and (best_fit is None or (cand.cost, cand.peak) <
                             (best_fit.cost, best_fit.peak)):
                    best_fit = cand
                if best_any is None or (cand.peak, cand.cost) < (best_any.peak, best_any.cost):
                    best_any = cand
    return best_fit or best_any


def relax_chunk_sizes(g: GraphIndex, regions: list[ChunkRegion], budget: int,
                      min_chunk: int) -> list[ChunkRegion]:
    """Grow each region's chunk (fewer chunks, faster) as far as the whole plan still fits the
    budget; drop regions that then need a single chunk. Regions with the most chunks first."""
    regions = [r for r in regions]
    for r in sorted(regions, key=lambda r: -r.n_chunks):
        lo_n, hi_n = 1, r.n_chunks  # fewest chunks that fit: binary search in [lo_n, hi_n]
        while lo_n < hi_n:
            mid = (lo_n + hi_n) // 2
            r.chunk_size = max(-(-r.extent // mid), min_chunk)
            if estimate_plan(g, regions).peak <= budget:
                hi_n = mid
            else:
                lo_n = mid + 1
        r.chunk_size = max(-(-r.extent // hi_n), min_chunk)
    kept = [r for r in regions if r.n_chunks > 1]
    return kept if estimate_plan(g, kept).peak <= budget else regions


def smallest_peak_search(g: GraphIndex, *, min_chunk: int = 1,
                         max_span: int = 160) -> SearchResult:
    """Algorithm 1 with budget 0: every region at ``min_chunk``; its ``estimate_after.peak`` is
    the smallest peak the search reaches."""
    return _algorithm_1(g, 0, min_chunk, max_span)


def autochunk_search(g: GraphIndex, budget: int, *, min_chunk: int = 1, max_span: int = 160,
                     floor: Callable[[], SearchResult] | None = None) -> SearchResult:
    """Algorithm 1 over the traced graph ``g`` (see module doc).

    Greedy choices made for a loose budget can strand a later peak; when the budget is not met
    but the search for the smallest peak (budget 0, every region at ``min_chunk``) meets it,
    that plan is taken with its chunk sizes grown back until the budget is just met. ``floor``,
    when given, returns that search's result (a caller's cache of :func:`smallest_peak_search`
    with the same ``min_chunk`` and ``max_span``); the result it returns is not modified."""
    if floor is None:
        def floor() -> SearchResult:
            return smallest_peak_search(g, min_chunk=min_chunk, max_span=max_span)
    if budget <= 0:
        return floor().copy()
    result = _algorithm_1(g, budget, min_chunk, max_span)
    if result.met:
        return result
    smallest = floor()
    if smallest.estimate_after.peak > budget:
        return result
    regions = relax_chunk_sizes(g, smallest.copy().regions, budget, min_chunk)
    after = estimate_plan(g, regions)
    return SearchResult(regions, result.estimate_before, after, after.peak <= budget)


def _algorithm_1(g: GraphIndex, budget: int, min_chunk: int, max_span: int) -> SearchResult:
    regions: list[ChunkRegion] = []
    before = estimate_plan(g, regions)
    est = before
    while est.peak > budget:
        p = est.peak_index
        if est.region_of[p] >= 0 or _is_barrier(g.nodes[p]):
            break
        lo, hi, tail = find_max_chunk(g, est, p, max_span)
        best = find_best_chunk(g, est, p, lo, hi, budget, min_chunk, g.gm, tail)
        if best is None:
            break
        regions.append(best.region)
        regions.sort(key=lambda r: r.start)
        est = estimate_plan(g, regions)
    return SearchResult(regions, before, est, est.peak <= budget)
