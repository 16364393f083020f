"""Estimated peak activation memory of a graph with chunk regions (live-tensor accounting).

Per node the fake run (:mod:`fold_chunk.trace`) gives the storages it allocates and holds, the
storages its output references (views) and its transient bytes. A storage is live from the step
that allocates it to the last step that reads a tensor referencing it. Outside regions a step
is a node; peak at node ``i`` = bytes live at ``i`` + its transient bytes.

A chunk region runs as: hoisted (whole) nodes and preallocated whole output buffers first, then
a loop whose body holds one chunk of every chunked node. For accounting the region is one step
that reads all its inputs and allocates its buffers and hoisted nodes at its start; its peak is
the bytes live across the region plus ``chunk / extent`` times the peak of the body (the body's
live bytes simulated node by node on whole-size numbers, then scaled: every chunked tensor has
the chunk dim, so its size is proportional to the chunk size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fold_chunk.dims import _Full
from fold_chunk.region import ChunkRegion, GraphIndex
from fold_chunk.trace import TensorMeta

__all__ = ["MemoryEstimate", "estimate_plan", "body_peak", "tensor_bytes"]


def tensor_bytes(meta: object) -> int:
    if isinstance(meta, TensorMeta):
        return math.prod(meta.shape) * meta.dtype.itemsize
    if isinstance(meta, (tuple, list)):
        return sum(tensor_bytes(m) for m in meta)
    return 0


@dataclass
class MemoryEstimate:
    """``node_peak[i]``: estimated bytes live while node ``i`` runs (for a node in a region, the
    region's peak); ``live_in[i]``: bytes live entering node ``i``."""

    node_peak: np.ndarray
    live_in: np.ndarray
    region_of: list[int]  # region number of each node, -1 outside regions

    @property
    def peak(self) -> int:
        return int(self.node_peak.max(initial=0))

    @property
    def peak_index(self) -> int:
        return int(self.node_peak.argmax())


def preloop_only(g: GraphIndex, start: int, end: int, assign: dict, sid: int) -> bool:
    """Whether a storage is read only by hoisted nodes of the region (e.g. the LayerNorm
    feeding a hoisted bias projection): it is freed before the loop starts."""
    for j in g.sid_refs.get(sid, ()):
        for u in g.nodes[j].users:
            k = g.index[u]
            if k < start or k > end or not isinstance(assign.get(u), _Full):
                return False
    return True


def body_peak(g: GraphIndex, region_start: int, end: int, assign: dict) -> tuple[int, int]:
    """Peak of one chunk loop body at whole size (scale it by chunk/extent), and a bound on
    the extra bytes while the hoisted nodes run (their largest transient plus the storages only
    they read). Chunked region outputs stay live to the body's end (they are copied into their
    buffers there)."""
    n_steps = end - region_start + 1
    diff = np.zeros(n_steps + 1, dtype=np.int64)
    temps = np.zeros(n_steps, dtype=np.int64)
    hoisted_temp = 0
    preloop = 0
    for i in range(region_start, end + 1):
        x = g.nodes[i]
        d = assign.get(x)
        info = g.info.get(x)
        if info is None or d is None:
            continue
        if isinstance(d, _Full):
            hoisted_temp = max(hoisted_temp, info.temp)
            preloop += sum(b for sid, b in info.own.items()
                           if preloop_only(g, region_start, end, assign, sid))
            continue
        temps[i - region_start] = info.temp
        for sid, nbytes in info.own.items():
            last = i
            for j in g.sid_refs.get(sid, ()):
                if j <= end:
                    last = max(last, min(g.last_use[j], end))
            diff[i - region_start] += nbytes
            diff[last - region_start + 1] -= nbytes
    live = np.cumsum(diff[:-1])
    return int((live + temps).max(initial=0)), hoisted_temp + preloop


def region_fixed_bytes(g: GraphIndex, start: int, end: int, assign: dict) -> int:
    """Whole-size bytes a region holds during its loop: hoisted nodes and output buffers."""
    total = 0
    for i in range(start, end + 1):
        x = g.nodes[i]
        d = assign.get(x)
        info = g.info.get(x)
        if info is None or d is None:
            continue
        if isinstance(d, _Full):
            total += sum(b for sid, b in info.own.items()
                         if not preloop_only(g, start, end, assign, sid))
        elif g.last_use[i] > end:
            total += tensor_bytes(info.meta)
    return total


def estimate_plan(g: GraphIndex, regions: list[ChunkRegion]) -> MemoryEstimate:
    """Estimated per-node peak of the graph with ``regions`` chunked (see module doc)."""
    n = len(g.nodes)
    region_of = [-1] * n
    for r_id, r in enumerate(regions):
        for i in range(r.start, r.end + 1):
            region_of[i] = r_id

    # where a read at node j happens: the end of j's region, or j itself (n: the output)
    use_pos = np.arange(n + 1, dtype=np.int64)
    for r in regions:
        use_pos[r.start: r.end + 1] = r.end
    # last read of each node; users come after a node, so a node without users keeps its own
    lup = use_pos[:n].copy()
    np.maximum.at(lup, g.user_src, use_pos[g.user_dst])
    last_use_pos: list[int] = lup.tolist()

    diff = np.zeros(n + 2, dtype=np.int64)
    alloc_at = np.zeros(n + 1, dtype=np.int64)

    def add(alloc: int, free: int, nbytes: int) -> None:
        diff[alloc] += nbytes
        diff[free + 1] -= nbytes
        alloc_at[alloc] += nbytes

    for i, x in enumerate(g.nodes):
        info = g.info.get(x)
        if info is None:
            continue
        r_id = region_of[i]
        if r_id >= 0:
            r = regions[r_id]
            d = r.assign.get(x)
            if d is None:
                continue
            if not isinstance(d, _Full):
                if g.last_use[i] > r.end:  # a whole output buffer, allocated before the loop
                    free = max([last_use_pos[i]] + [
                        last_use_pos[j] for sid in info.refs for j in g.sid_refs.get(sid, ())
                        if j > r.end])
                    add(r.start, free, tensor_bytes(info.meta))
                continue
            alloc = r.start
            if isinstance(d, _Full):  # storages read only before the loop: in the region peak
                info_own = {sid: b for sid, b in info.own.items()
                            if not preloop_only(g, r.start, r.end, r.assign, sid)}
                for sid, nbytes in info_own.items():
                    add(alloc, max([last_use_pos[i]] + [last_use_pos[j]
                                                        for j in g.sid_refs.get(sid, ())]), nbytes)
                continue
        else:
            alloc = i
        for sid, nbytes in info.own.items():
            free = max([last_use_pos[i]] + [last_use_pos[j] for j in g.sid_refs.get(sid, ())
                                            if region_of[j] < 0 or isinstance(
                                                regions[region_of[j]].assign.get(g.nodes[j]),
                                                _Full)])
            add(alloc, free, nbytes)
    live = np.cumsum(diff[: n + 1])[:n]
    node_peak = live + g.temps
    for r in regions:
        if r.body is None:
            r.body = body_peak(g, r.start, r.end, r.assign)
        body, hoisted_temp = r.body
        across = int(live[r.start: r.end + 1].max())
        peak = across + max(math.ceil(body * r.chunk_size / r.extent), hoisted_temp)
        node_peak[r.start: r.end + 1] = peak
    live_in = live - alloc_at[:n]
    return MemoryEstimate(node_peak, live_in, region_of)


