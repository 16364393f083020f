"""Rewrite the traced graph: each chunk region becomes a call of a :class:`ChunkLoop`.

For a region ``[start, end]`` the new graph holds, in order:

* the region's hoisted (whole, loop-invariant) nodes, e.g. the pair bias of MSA row attention
  or the layout-only views of the region's inputs;
* one ``call_module`` of ``chunk_loop_<k>`` with every tensor the body reads from outside
  (region inputs and hoisted nodes), each with the dim it is sliced along (None: whole); an
  input read along two dims is passed twice;
* a ``getitem`` per region output (whole buffers the loop filled);
* layout-only ops at the end of the region (a final ``transpose``/``view`` of a chunked node
  read only after the region) sunk past the loop: the loop fills the buffer of the op's input
  and the view is taken once, on the whole buffer (FastFold: transposes leave the chunk).

The loop body is its own GraphModule: a ``chunk_len`` placeholder, the sliced inputs, copies of
the chunked nodes, and a tuple of the chunked outputs. Shapes the graph holds as constants
(``view``/``reshape``/``expand`` targets) get ``chunk_len`` at the chunk dim.
"""

from __future__ import annotations

import torch.fx as fx

from fold_chunk.dims import FULL, _Full, input_dims, op_name
from fold_chunk.region import ChunkRegion, GraphIndex
from fold_chunk.runtime import ChunkLoop
from fold_chunk.search import VIEW_OPS
from fold_chunk.trace import TensorMeta

__all__ = ["generate"]

_SHAPE_OPS = {"view", "reshape", "expand", "broadcast_to"}


def _sink_views(g: GraphIndex, r: ChunkRegion) -> tuple[list[fx.Node], list[fx.Node]]:
    """(loop outputs, view nodes moved after the loop), both in graph order."""
    outputs = [x for x, d in r.assign.items()
               if not isinstance(d, _Full) and g.last_use[g.index[x]] > r.end]
    sunk: set[fx.Node] = set()
    changed = True
    while changed:
        changed = False
        for x in list(outputs):
            ins = x.all_input_nodes
            if (op_name(x, g.gm) not in VIEW_OPS or g.info[x].own or len(ins) != 1
                    or isinstance(r.assign.get(ins[0], FULL), _Full)
                    or not isinstance(g.info[ins[0]].meta, TensorMeta)
                    or not all(u in sunk or g.index[u] > r.end for u in x.users)):
                continue
            outputs.remove(x)
            sunk.add(x)
            if ins[0] not in outputs:
                outputs.append(ins[0])
            changed = True
    return sorted(outputs, key=g.index.get), sorted(sunk, key=g.index.get)


def _body(g: GraphIndex, r: ChunkRegion, outputs: list[fx.Node], sunk: list[fx.Node],
          ) -> tuple[fx.GraphModule, list[tuple[fx.Node, int | None]]]:
    graph = fx.Graph()
    chunk_len = graph.placeholder("chunk_len")
    env: dict[fx.Node, fx.Node] = {}
    inputs: dict[tuple[fx.Node, int | None], fx.Node] = {}
    for i in range(r.start, r.end + 1):
        x = g.nodes[i]
        d = r.assign.get(x)
        if d is None or isinstance(d, _Full) or x in sunk:
            continue
        dims = input_dims(x, d, g.info, g.gm)
        assert isinstance(dims, dict), f"{x.name}: {dims}"
        local: dict[fx.Node, fx.Node] = {}
        for a in x.all_input_nodes:
            if a in env and not isinstance(r.assign.get(a), _Full) and g.index[a] >= r.start:
                local[a] = env[a]
                continue
            key = (a, dims.get(a))
            if key not in inputs:
                suffix = "" if key[1] is None else f"_d{key[1]}"
                inputs[key] = graph.placeholder(f"{a.name}{suffix}")
            local[a] = inputs[key]
        new = graph.node_copy(x, lambda a, local=local: local[a])
        meta = g.info[x].meta
        if op_name(x, g.gm) in _SHAPE_OPS and isinstance(meta, TensorMeta):
            shape: list = list(meta.shape)
            shape[d] = chunk_len  # [..., chunk_len, ...]
            new.args = (new.args[0], tuple(shape))
            new.kwargs = {}
        env[x] = new
    graph.output(tuple(env[x] for x in outputs))
    body = fx.GraphModule(g.gm, graph, class_name="ChunkBody")
    return body, list(inputs)


def generate(g: GraphIndex, regions: list[ChunkRegion]) -> fx.GraphModule:
    """A GraphModule computing the same as ``g.gm`` with ``regions`` run as chunk loops."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    loops: dict[str, ChunkLoop] = {}
    by_start = {r.start: r for r in regions}
    skip_until = -1
    for i, x in enumerate(g.nodes):
        if i <= skip_until:
            continue
        r = by_start.get(i)
        if r is None:
            env[x] = graph.node_copy(x, lambda a: env[a])
            continue
        skip_until = r.end
        for j in range(r.start, r.end + 1):  # hoisted nodes first
            y = g.nodes[j]
            if isinstance(r.assign.get(y), _Full) or y not in r.assign:
                env[y] = graph.node_copy(y, lambda a: env[a])
        outputs, sunk = _sink_views(g, r)
        body, inputs = _body(g, r, outputs, sunk)
        name = f"chunk_loop_{len(loops)}"
        out_dims = [r.assign[x] for x in outputs]
        loops[name] = ChunkLoop(body, [d for _, d in inputs], out_dims,  # type: ignore[misc]
                                r.extent, r.chunk_size)
        call = graph.call_module(name, tuple(env[a] for a, _ in inputs))
        for k, x in enumerate(outputs):
            env[x] = graph.call_function(_getitem, (call, k))
            env[x].name = x.name
        for x in sunk:  # layout-only ops on the whole buffers
            env[x] = graph.node_copy(x, lambda a: env[a])
    root: dict = {}
    for node in graph.nodes:
        target = str(node.target)
        if node.op == "call_module":
            root[target] = loops[target] if target in loops else g.gm.get_submodule(target)
        elif node.op == "get_attr":
            mod_path, _, attr = target.rpartition(".")
            root[target] = getattr(g.gm.get_submodule(mod_path), attr)
    gm = fx.GraphModule(root, graph, class_name="AutoChunkedGraph")
    gm.graph.lint()
    return gm


def _getitem(t: tuple, k: int):
    return t[k]
