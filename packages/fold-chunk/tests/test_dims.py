"""The chunk-dimension rules (FastFold 5.3): which input dim carries an output dim through each
kind of op, and which dims are not free (rule 3)."""

from __future__ import annotations

import torch
import torch.nn as nn
from fold_chunk.dims import FULL, Illegal, input_dims
from fold_chunk.region import GraphIndex, flow_from_end
from fold_chunk.trace import trace_module


class _Fn(nn.Module):
    def __init__(self, fn, arity: int = 1, mods: tuple[nn.Module, ...] = ()) -> None:
        super().__init__()
        self.fn, self.arity = fn, arity
        self.mods = nn.ModuleList(mods)  # modules fn calls must be members to be traced

    def forward(self, x, y=None):
        return self.fn(x) if self.arity == 1 else self.fn(x, y)


def _node(fn, *args, target: str | None = None, mods: tuple[nn.Module, ...] = ()):
    """Trace ``fn`` and return (node computing the output, info, placeholders, root)."""
    traced = trace_module(_Fn(fn, len(args), mods), args)
    nodes = list(traced.gm.graph.nodes)
    out = nodes[-1].args[0]
    if target is not None:
        out = next(n for n in nodes if n.name == target)
    places = [n for n in nodes if n.op == "placeholder"]
    return out, traced.info, places, traced.gm


def _dims(fn, *args, d: int, mods: tuple[nn.Module, ...] = ()):
    node, info, places, root = _node(fn, *args, mods=mods)
    r = input_dims(node, d, info, root)
    if isinstance(r, dict):
        return {places.index(k) if k in places else k.name: v for k, v in r.items()}
    return r


def test_elementwise_broadcast() -> None:
    a, b = torch.randn(5, 3, 4), torch.randn(3, 1)
    assert _dims(lambda x, y: x * y, a, b, d=0) == {0: 0, 1: None}  # y lacks dim 0
    assert _dims(lambda x, y: x * y, a, b, d=1) == {0: 1, 1: 0}
    assert _dims(lambda x, y: x * y, a, b, d=2) == {0: 2, 1: None}  # y has size 1 there


def test_softmax_and_layer_norm_dims_are_not_free() -> None:
    x = torch.randn(5, 3, 4)
    assert isinstance(_dims(lambda t: torch.softmax(t, dim=-1), x, d=2), Illegal)
    assert _dims(lambda t: torch.softmax(t, dim=-1), x, d=0) == {0: 0}
    ln = nn.LayerNorm(4)
    assert isinstance(_dims(ln, x, d=2, mods=(ln,)), Illegal)
    assert _dims(ln, x, d=1, mods=(ln,)) == {0: 1}


def test_matmul_and_einsum_contractions() -> None:
    a, b = torch.randn(2, 5, 3), torch.randn(2, 3, 7)
    assert _dims(torch.matmul, a, b, d=1) == {0: 1, 1: None}
    assert _dims(torch.matmul, a, b, d=2) == {0: None, 1: 2}
    assert _dims(torch.matmul, a, b, d=0) == {0: 0, 1: 0}
    x, y = torch.randn(6, 4, 3), torch.randn(5, 4, 3)
    tri = lambda p, q: torch.einsum("ikc,jkc->ijc", p, q)  # noqa: E731
    assert _dims(tri, x, y, d=0) == {0: 0, 1: None}
    assert _dims(tri, x, y, d=1) == {0: None, 1: 0}
    assert _dims(tri, x, y, d=2) == {0: 2, 1: 2}


def test_layout_ops() -> None:
    x = torch.randn(5, 3, 4)
    assert _dims(lambda t: t.permute(2, 0, 1), x, d=0) == {0: 2}
    assert _dims(lambda t: t.transpose(0, 2), x, d=2) == {0: 0}
    assert _dims(lambda t: t.unsqueeze(1), x, d=2) == {0: 1}
    assert isinstance(_dims(lambda t: t.unsqueeze(1), x, d=1), Illegal)
    assert _dims(lambda t: t.reshape(5, 12), x, d=0) == {0: 0}
    assert isinstance(_dims(lambda t: t.reshape(5, 12), x, d=1), Illegal)  # merges dims 1, 2
    assert _dims(lambda t: t.unflatten(-1, (2, 2)), x, d=1) == {0: 1}
    assert _dims(lambda t: t.movedim(-1, 0), x, d=1) == {0: 0}
    assert _dims(lambda t: t[:, 1:, None], x, d=0) == {0: 0}
    assert isinstance(_dims(lambda t: t[:, 1:, None], x, d=1), Illegal)  # partial slice


def test_reductions() -> None:
    x = torch.randn(5, 3, 4)
    assert _dims(lambda t: t.sum(dim=1), x, d=1) == {0: 2}
    assert _dims(lambda t: t.mean(dim=-1, keepdim=True), x, d=0) == {0: 0}


def test_creation_op_is_hoisted() -> None:
    x = torch.randn(5, 3)
    node, info, _, _ = _node(lambda t: t + t.new_zeros((5, 3)), x, target="new_zeros")
    assert input_dims(node, 0, info) is FULL


def test_flow_hoists_the_operand_a_contraction_needs_whole() -> None:
    """Triangle-style einsum chunked along i: the left operand is chunked, the right one (from
    the same LayerNorm) is needed whole, so the LayerNorm is hoisted (rule 2 conflict)."""
    ln = nn.LayerNorm(3)
    wa, wb = nn.Linear(3, 4), nn.Linear(3, 4)

    def f(z):
        x = ln(z)
        return torch.einsum("ikc,jkc->ijc", wa(x), wb(x))

    traced = trace_module(_Fn(f, 1, (ln, wa, wb)), (torch.randn(6, 6, 3),))
    g = GraphIndex(traced.gm, traced.info)
    end = len(g.nodes) - 2
    flow = flow_from_end(g, end, 0, 0, g.gm)
    by_name = {n.name: d for n, d in flow.assign.items()}
    assert by_name["einsum"] == 0
    assert by_name["mods_0"] is FULL  # read along i by one operand and whole by the other
    assert by_name["mods_2"] is FULL and by_name["mods_1"] == 0
