"""A chunk region and the flow of its chunk dimension (FastFold section 5.3, rules 1-3).

A region is a contiguous range ``[start, end]`` of graph nodes run as a loop over chunks of one
extent ``L``. Every node in it is either *chunked* along one dim of size ``L`` (computed per
chunk) or :data:`~fold_chunk.dims.FULL` (loop-invariant: hoisted before the loop and sliced by
its chunked consumers). The assignment comes from walking back from the region's outputs:

1. every output has a chunk dim (rule 1), given for the last node and chosen for the others;
2. a node reached with one dim is chunked along it and passes the dims of its inputs on (rule 2:
   the whole flow path is chunked); a node reached with two different dims, or needed whole by
   some consumer, is computed whole before the loop (possible because then all its in-region
   inputs are needed whole too);
3. an op that computes across the requested dim (softmax over it, a reshape merging it, ...) or
   an unknown/in-place op stops the flow: no region may contain it (rule 3).

Because a node's assignment depends only on its consumers, one backward walk from ``end`` gives
the assignment of every region ``[s, end]`` at once (the second stage of the two-stage search).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch.fx as fx
import torch.nn as nn

from fold_chunk.dims import FULL, Illegal, _Full, input_dims
from fold_chunk.trace import NodeInfo, TensorMeta, is_inplace

__all__ = ["ChunkRegion", "GraphIndex", "flow_from_end"]

Assignment = dict[fx.Node, "int | _Full"]


class GraphIndex:
    """Node order, last uses and storage users of a traced graph."""

    def __init__(self, gm: fx.GraphModule, info: dict[fx.Node, NodeInfo]) -> None:
        self.gm = gm
        self.info = info
        self.nodes: list[fx.Node] = list(gm.graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        n_nodes = len(self.nodes)
        # last_use[i]: index of the last node reading node i (n_nodes if the graph returns it)
        self.last_use = []
        for n in self.nodes:
            uses = [n_nodes if u.op == "output" else self.index[u] for u in n.users]
            self.last_use.append(max(uses, default=self.index[n]))
        self.sid_refs: dict[int, list[int]] = {}
        for n in self.nodes:
            for sid in info[n].refs if n in info else ():
                self.sid_refs.setdefault(sid, []).append(self.index[n])
        # every (node, user) edge as index arrays (a user that is the output: n_nodes), and
        # every node's transient bytes: memory.estimate_plan reads them on each search step
        edges = [(i, n_nodes if u.op == "output" else self.index[u])
                 for i, n in enumerate(self.nodes) for u in n.users]
        self.user_src = np.array([i for i, _ in edges], dtype=np.int64)
        self.user_dst = np.array([j for _, j in edges], dtype=np.int64)
        self.temps = np.array([info[n].temp if n in info else 0 for n in self.nodes],
                              dtype=np.int64)
        # search.find_best_chunk's memo of what does not depend on the plan so far: backward
        # flows by (end, dim, lo, root) and candidate regions' costs by (start, end, dim);
        # shared by every search step and every search (budget) over this graph
        self.flow_cache: dict[tuple[int, int, int, int], Flow] = {}
        self.region_cache: dict[tuple[int, int, int], object] = {}

    def meta(self, i: int) -> object:
        n = self.nodes[i]
        return self.info[n].meta if n in self.info else None


@dataclass
class ChunkRegion:
    """A chosen region: nodes ``[start, end]``, a chunk dim per node (or FULL), the chunk
    extent and size."""

    start: int
    end: int
    assign: Assignment
    extent: int
    chunk_size: int
    outputs: list[tuple[fx.Node, int | _Full]] = field(default_factory=list)
    peak_node: str = ""
    # memory.body_peak of (start, end, assign), which never change once a region is made
    body: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    @property
    def n_chunks(self) -> int:
        return -(-self.extent // self.chunk_size)

    def chunked(self) -> list[fx.Node]:
        return [n for n, d in self.assign.items() if not isinstance(d, _Full)]


@dataclass
class Flow:
    """Result of one backward walk from ``end``: the assignment of nodes ``[min_start, end]``
    and the region outputs' dims (for any start ``s >= min_start``)."""

    end: int
    extent: int
    assign: Assignment
    min_start: int
    out_dims: dict[fx.Node, int | _Full]


def _pick_output_dim(meta: TensorMeta, extent: int, like: int, like_ndim: int) -> int | _Full:
    """Chunk dim for an extra region output that no in-region op constrains."""
    from_end = like - like_ndim
    k = meta.ndim + from_end
    if 0 <= k < meta.ndim and meta.shape[k] == extent:
        return k
    for k, size in enumerate(meta.shape):
        if size == extent:
            return k
    return FULL


def flow_from_end(g: GraphIndex, end: int, dim: int, lo: int,
                  root: nn.Module | None = None) -> Flow:
    """Walk back from node ``end`` (chunked along ``dim``) to ``lo`` (see module doc)."""
    end_meta = g.meta(end)
    assert isinstance(end_meta, TensorMeta)
    extent = end_meta.shape[dim]
    req: dict[fx.Node, set] = {}
    assign: Assignment = {}
    out_dims: dict[fx.Node, int | _Full] = {}
    min_start = lo
    for i in range(end, lo - 1, -1):
        x = g.nodes[i]
        r = req.get(x, set())
        meta = g.meta(i)
        if g.last_use[i] > end:  # a region output (rule 1)
            if i == end:
                od: int | _Full = dim
            elif not isinstance(meta, TensorMeta):
                od = FULL
            else:
                ints = [k for k in r if not isinstance(k, _Full)]
                if len(ints) == 1 and FULL not in r:
                    od = ints[0]
                elif r:
                    od = FULL
                else:
                    od = _pick_output_dim(meta, extent, dim, end_meta.ndim)
            out_dims[x] = od
            r = r | {od}
        if x.op in ("get_attr", "placeholder"):
            assign[x] = FULL
            continue
        if x.op == "output" or is_inplace(x) or x not in g.info:
            min_start = i + 1
            break
        ints = {k for k in r if not isinstance(k, _Full)}
        if not r or FULL in r or len(ints) > 1:
            assign[x] = FULL
            for n in x.all_input_nodes:
                req.setdefault(n, set()).add(FULL)
            continue
        (k,) = ints
        elem = meta[0] if isinstance(meta, (tuple, list)) and meta else meta
        m = input_dims(x, k, g.info, root)
        if isinstance(m, Illegal) or not isinstance(elem, TensorMeta) or elem.shape[k] != extent:
            min_start = i + 1
            break
        if isinstance(m, _Full):
            assign[x] = FULL
            continue
        assign[x] = k
        for n in x.all_input_nodes:
            d = m.get(n)
            req.setdefault(n, set()).add(FULL if d is None else d)
    return Flow(end, extent, assign, min_start, out_dims)
