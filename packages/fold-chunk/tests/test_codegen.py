"""Code generation: a region run as a chunk loop computes what the graph computes; layout-only
ops at the region's start are hoisted and at its end sunk past the loop."""

from __future__ import annotations

import torch
import torch.nn as nn
from fold_chunk.codegen import generate
from fold_chunk.dims import _Full
from fold_chunk.region import ChunkRegion, GraphIndex, flow_from_end
from fold_chunk.search import _hoist_views
from fold_chunk.trace import trace_module


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = x.transpose(0, 1)  # [B, A, 6] -> layout-only, hoisted
        p = torch.softmax(self.w(h) @ self.w(y).transpose(-1, -2), dim=-1)  # [A, B, B]
        q = (p @ y).transpose(0, 1)  # [B, A, 6]: layout-only end, sunk past the loop
        return q * 2.0


def _region(g: GraphIndex, first: str, last: str, dim: int) -> ChunkRegion:
    names = [n.name for n in g.nodes]
    s, e = names.index(first), names.index(last)
    flow = flow_from_end(g, e, dim, s, g.gm)
    assert flow.min_start <= s
    assign = {g.nodes[i]: flow.assign[g.nodes[i]] for i in range(s, e + 1)}
    _hoist_views(g, s, e, assign)
    return ChunkRegion(s, e, assign, flow.extent, 3, [], g.nodes[e].name)


def test_region_loop_equals_graph_and_moves_views() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(7, 5, 6, generator=gen), torch.randn(5, 11, 6, generator=gen)
    block = _Block()
    traced = trace_module(block, (x, y))
    g = GraphIndex(traced.gm, traced.info)
    # chunk along B (dim 0 of the transposed result): the region spans transpose .. transpose_2
    region = _region(g, "transpose", "transpose_2", 0)
    by_name = {n.name: d for n, d in region.assign.items()}
    assert isinstance(by_name["transpose"], _Full)  # hoisted: a view of a region input
    gm = generate(g, [region])
    code = gm.code
    assert code.index("x.transpose(0, 1)") < code.index("chunk_loop_0(")
    assert code.index("chunk_loop_0(") < code.index(".transpose(0, 1)", code.index("chunk_loop_0("))
    body = gm.chunk_loop_0.body.code
    assert "transpose(0, 1)" not in body  # both layout ops are outside the loop
    with torch.no_grad():
        out, ref = gm(x, y), block(x, y)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_tracer_finds_parameters_by_identity_like_fx():
    """fold_chunk's tracer (parameters looked up in one dict, not by scanning the module on
    every read) writes the graph torch.fx.symbolic_trace writes: the same get_attr targets
    (a shared parameter under its first name, a buffer, a plain tensor attribute left as a
    constant) and the same code."""
    import torch.fx as fx
    from fold_chunk.trace import _Tracer

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight  # shared: one parameter, two names
            self.register_buffer("scale", torch.full((4,), 2.0))
            self.plain = torch.ones(4)  # neither parameter nor buffer

        def forward(self, x):
            return self.b(self.a(x)) * self.scale + self.plain + self.a.weight.sum()

    m = Shared()
    ours = _Tracer()
    graph = ours.trace(m)
    reference = fx.symbolic_trace(m)
    targets = [n.target for n in graph.nodes if n.op == "get_attr"]
    assert targets == [n.target for n in reference.graph.nodes if n.op == "get_attr"]
    gm = fx.GraphModule(ours.root, graph)
    assert gm.code == reference.code
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), m(x), rtol=0, atol=0)
