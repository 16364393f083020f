"""AutoChunk with the ops of fold-ops' contract as leaf nodes (skipped without fold_model):

* a traced fold-model block holds one node per op (``fold_model.ops.leaves``), no softmax or
  logit matmul of an attention;
* every leaf op chunked along every output dim its rule calls free equals the unchunked op
  (float64, odd sizes, masks with holes and fully masked rows); the other dims are refused;
* autochunked AF2 Evoformer / extra MSA and AF3 Pairformer blocks equal the unchunked ones
  (float64) under a budget that forces chunking, and their chunk loops call the leaves;
* a backend registered in fold-model's registry (a spy running the reference, with a
  shape-only fake) is what the chunk loops call, with chunk-sized inputs, and the planning
  run counts its fake, not the reference's logits.
"""

from __future__ import annotations

import fold_chunk as fc
import pytest
import torch
from fold_chunk.dims import Illegal, input_dims
from fold_chunk.leaf_dims import LEAF_OPS, fold_op
from fold_chunk.runtime import ChunkLoop
from fold_chunk.trace import trace_module
from torch import nn

ops = pytest.importorskip("fold_model.ops")
evoformer = pytest.importorskip("fold_model.af2.evoformer")
pairformer = pytest.importorskip("fold_model.af3.pairformer")
contract = pytest.importorskip("fold_ops.contract")
reference = pytest.importorskip("fold_ops.reference")
attention_spy = pytest.importorskip("fold_model.ops.testing").attention_spy

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(*shape: int, seed: int = 0) -> torch.Tensor:
    """0/1 with holes, the first key of every row kept, and one fully masked row."""
    m = (torch.rand(*shape, generator=_gen(seed)) > 0.3).to(F64)
    m[..., 0] = 1.0
    m.view(-1, shape[-1])[1] = 0.0  # a row whose keys are all masked
    return m


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=F64)


B, R, H, N, D, C, O = 2, 3, 2, 5, 3, 7, 4

# op -> (the call, its tensor arguments, the output dims that are free)
CASES = {
    "attention": (lambda q, k, v, bias, mask, gate: ops.attention(q, k, v, bias, mask, None,
                                                                  gate),
                  [_randn(B, R, H, N, D, seed=1), _randn(B, R, H, N, D, seed=2),
                   _randn(B, R, H, N, D, seed=3), _randn(B, H, N, N, seed=4),
                   _mask(B, R, N, seed=5), _randn(B, R, H, N, D, seed=6)], {0, 1, 2, 3}),
    "attention_packed": (lambda proj, bias, mask, gb: ops.attention_packed(proj, H, bias, mask,
                                                                           None, gb),
                         [_randn(B, R, N, 4 * H * D, seed=7), _randn(B, H, N, N, seed=8),
                          _mask(B, R, N, seed=9), _randn(H * D, seed=10)], {0, 1}),
    "triangle_attention": (lambda proj, bias, mask: ops.triangle_attention(
                               proj, H, bias, mask, 0.3, None, False),
                           [_randn(B, R, N, 3 * H * D, seed=11), _randn(B, H, N, N, seed=12),
                            _mask(B, R, N, seed=13)], {0, 1}),
    "linear": (ops.linear, [_randn(B, N, C, seed=14), _randn(O, C, seed=15),
                            _randn(O, seed=16)], {0, 1, 2}),
    "layer_norm": (lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
                   [_randn(B, N, C, seed=17), _randn(C, seed=18), _randn(C, seed=19)], {0, 1}),
    "layer_norm_fork": (lambda x, w, b: ops.layer_norm_fork(x, w, b, 1e-5, 2),
                        [_randn(B, N, C, seed=43), _randn(C, seed=44), _randn(C, seed=45)],
                        {0, 1}),
    # outputs channel-last and heads-first: only the batch dim is followed through
    "layer_norm_pair_bias": (lambda x, w, b, wh: ops.layer_norm_pair_bias(x, w, b, wh, 1e-5, 1),
                             [_randn(B, N, N, C, seed=54), _randn(C, seed=55),
                              _randn(C, seed=56), _randn(O, C, seed=57)], {0}),
    "layer_norm_linear": (ops.layer_norm_linear,
                          [_randn(B, N, C, seed=20), _randn(C, seed=21), _randn(C, seed=22),
                           _randn(O, C, seed=23), _randn(O, seed=24)], {0, 1, 2}),
    "adaptive_layer_norm": (lambda a, cond, gb: ops.adaptive_layer_norm(a, cond, gb, 1e-5),
                            [_randn(B, N, C, seed=46), _randn(B, N, 2 * C, seed=47),
                             _randn(C, seed=48)], {0, 1}),
    "softmax_mask_bias": (ops.softmax_mask_bias,
                          [_randn(B, R, N, N, seed=25), _mask(B, 1, 1, N, seed=26),
                           _randn(R, N, N, seed=27)], {0, 1, 2}),
    "swiglu": (ops.swiglu, [_randn(B, N, C, seed=28), _randn(2 * O, C, seed=29),
                            _randn(2 * O, seed=30)], {0, 1}),
    "bias_sigmoid_gate": (ops.bias_sigmoid_gate,
                          [_randn(B, N, C, seed=31), _randn(B, N, C, seed=32),
                           _randn(C, seed=33)], {0, 1, 2}),
    "bias_dropout_residual": (ops.bias_dropout_residual,
                              [_randn(B, N, C, seed=34), _randn(B, N, C, seed=35),
                               _randn(C, seed=36), _mask(B, 1, C, seed=37) * 1.25], {0, 1, 2}),
    "triangle_projection_gate": (ops.triangle_projection_gate,
                                 [_randn(B, 4 * R, N, N, seed=38), _randn(4 * R, seed=39),
                                  _mask(B, N, N, seed=40)], {0, 2, 3}),
    "triangle_projection": (ops.triangle_projection,
                            [_randn(B, N, N, C, seed=49), _randn(4 * R, C, seed=50),
                             _randn(4 * R, seed=51), _mask(B, N, N, seed=52)], {0, 2, 3}),
    "linear_channel_first": (ops.linear_channel_first,
                             [_randn(B, N, N, C, seed=41), _randn(O, C, seed=42)],
                             {0, 1, 2, 3}),
    # the whole update: only the batch dim is followed through
    "triangle_multiplication": (
        lambda z, m, lw, lb, pw, pb, gw, gb, ow_ln, ob_ln, ow, ob: ops.triangle_multiplication(
            z, m, lw, lb, pw, pb, gw, gb, ow_ln, ob_ln, ow, ob, True, 1e-5),
        [_randn(B, N, N, C, seed=58), _mask(B, N, N, seed=59), _randn(C, seed=60),
         _randn(C, seed=61), _randn(4 * R, C, seed=62), _randn(4 * R, seed=63),
         _randn(C, C, seed=64), _randn(C, seed=65), _randn(R, seed=66), _randn(R, seed=67),
         _randn(C, R, seed=68), _randn(C, seed=69)], {0}),
}


def _call(fn, n: int) -> nn.Module:
    """A module whose forward takes ``n`` tensors (named: fx traces no ``*args``) and returns
    ``fn`` of them."""
    names = ", ".join(f"t{i}" for i in range(n))
    scope: dict = {}
    exec(f"def forward(self, {names}):\n    return self.fn({names})", scope)  # noqa: S102
    module = type("Call", (nn.Module,), {"forward": scope["forward"]})()
    module.fn = fn
    return module


def test_every_op_of_the_contract_has_a_case_and_a_rule():
    assert set(CASES) == set(contract.OPS) == set(LEAF_OPS)
    for name, op in contract.OPS.items():  # fold-chunk's parameter lists are the contract's
        assert LEAF_OPS[name].params == tuple(op.signature.parameters), name


def _leaf(traced) -> torch.fx.Node:
    (node,) = [n for n in traced.gm.graph.nodes if fold_op(n) is not None]
    return node


def _cat(parts: list, d: int):
    if isinstance(parts[0], tuple):
        return tuple(torch.cat([p[i] for p in parts], d) for i in range(len(parts[0])))
    return torch.cat(parts, d)


@pytest.mark.parametrize("name", sorted(CASES))
def test_leaf_op_chunked_along_each_free_dim_equals_the_op(name):
    fn, args, free = CASES[name]
    traced = trace_module(_call(fn, len(args)), args)
    node = _leaf(traced)
    assert fold_op(node) == name
    placeholders = [n for n in traced.gm.graph.nodes if n.op == "placeholder"]
    with torch.no_grad():
        whole = fn(*args)
    first = whole[0] if isinstance(whole, tuple) else whole
    assert torch.isfinite(first).all()
    legal = set()
    for d in range(first.dim()):
        dims = input_dims(node, d, traced.info)
        if isinstance(dims, Illegal):
            assert name in dims.reason
            continue
        legal.add(d)
        extent, parts = first.shape[d], []
        for start in range(0, extent, 2):  # chunks of 2 of an odd extent: a short last one
            n = min(2, extent - start)
            sliced = [a if dims.get(p) is None else a.narrow(dims[p], start, n)
                      for p, a in zip(placeholders, args)]
            with torch.no_grad():
                parts.append(fn(*sliced))
        chunked = _cat(parts, d)
        for c, w in zip(chunked if isinstance(chunked, tuple) else (chunked,),
                        whole if isinstance(whole, tuple) else (whole,)):
            torch.testing.assert_close(c, w, rtol=1e-12, atol=1e-12)
    assert legal == free


def _af2(cls):
    torch.manual_seed(0)
    block = cls(c_m=16, c_z=8, c_hidden_msa_att=4, no_heads_msa=2, c_hidden_opm=4,
                c_hidden_mul=8, c_hidden_pair_att=4, no_heads_pair=2, transition_n=2,
                msa_dropout=0.15, pair_dropout=0.25)
    n_seq, n_res = 7, 13
    args = (_randn(n_seq, n_res, 16, seed=50), _randn(n_res, n_res, 8, seed=51),
            _mask(n_seq, n_res, seed=52), _mask(n_res, n_res, seed=53))
    return block, args


def _pairformer():
    torch.manual_seed(0)
    block = pairformer.PairformerBlock(12, 8, 9, 4, 2, 3, 2, dropout=0.0)
    n = 11
    seq = _mask(2, n, seed=54)[:1]  # holes, no fully masked row (a padded-out residue: below)
    seq[0, -1] = 0.0
    return block, (_randn(1, n, 12, seed=55), _randn(1, n, n, 8, seed=56), seq,
                   seq[:, :, None] * seq[:, None, :])


BLOCKS = {"evoformer_block": lambda: _af2(evoformer.EvoformerBlock),
          "extra_msa_block": lambda: _af2(evoformer.ExtraMsaBlock),
          "pairformer_block": _pairformer}
ATTENTION_OPS = {"attention", "attention_packed", "triangle_attention"}


def _block(name: str):
    block, args = BLOCKS[name]()
    for p in block.parameters():  # trained-like weights: no zero-initialised output layers
        nn.init.normal_(p, std=0.3)
    return block.double().eval(), args


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_traced_block_holds_the_leaf_ops_and_no_attention_logits(name):
    block, args = _block(name)
    traced = trace_module(block, args)
    leaves = [fold_op(n) for n in traced.gm.graph.nodes if fold_op(n)]
    attention = [x for x in leaves if x in ATTENTION_OPS]
    # AF2: MSA row, MSA column (global in the extra MSA block), two triangle attentions;
    # AF3: two triangle attentions and the single representation's attention with pair bias
    assert len(attention) == (3 if name == "pairformer_block" else 4), leaves
    assert leaves.count("triangle_attention") == 2
    assert "layer_norm" in leaves and "triangle_projection" in leaves
    targets = [getattr(n.target, "__name__", str(n.target)) for n in traced.gm.graph.nodes
               if n.op in ("call_function", "call_method")]
    assert not any("softmax" in t for t in targets), targets
    # the two triangle multiplications' products; the reference attention would add two
    # matmuls (q k^T and p v) per attention
    assert sum(t in ("matmul", "bmm", "baddbmm") for t in targets) == 2, targets


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_autochunked_block_equals_the_block_in_float64(name):
    block, args = _block(name)
    peak = fc.estimate_peak_memory(block, args)
    smallest = fc.smallest_reachable_peak(block, args)
    assert smallest < 0.6 * peak
    budget = int(smallest + 0.25 * (peak - smallest))
    chunked = fc.autochunk(block, args, budget)
    assert chunked.report.regions and chunked.report.simulated_peak_after <= budget
    gm = chunked.graph_module(args)
    in_loops = {fold_op(n) for loop in gm.modules() if isinstance(loop, ChunkLoop)
                for n in loop.body.graph.nodes if fold_op(n)}
    assert in_loops & ATTENTION_OPS, in_loops  # attention runs chunked, through dispatch
    with torch.no_grad():
        out, ref = chunked(*args), block(*args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-12, atol=1e-12)


@pytest.fixture
def spy():
    """A backend of the three attention ops that records the shapes it is called with and runs
    the reference; its fake returns the output only (a kernel's accounting)."""
    with attention_spy() as calls:
        yield calls


def test_a_registered_backend_serves_the_chunk_loops_and_its_fake_is_counted(spy):
    block, args = _block("extra_msa_block")
    with ops.use_backend("torch"):  # the reference everywhere: its logits are counted
        ref_peak = fc.estimate_peak_memory(block, args)
        ref_trace = trace_module(block, args)
    spy_trace = trace_module(block, args)
    assert not spy  # planning runs the fake
    n_res = args[0].shape[1]
    ref_temp = [i.temp for n, i in ref_trace.info.items() if fold_op(n) in ATTENTION_OPS]
    spy_temp = [i.temp for n, i in spy_trace.info.items() if fold_op(n) in ATTENTION_OPS]
    # the reference's transients hold [rows, H, N, N] logits (the two triangle attentions'
    # alone: 2 x [N, 2, N, N] float64); the fake's: nothing beyond its output
    assert len(ref_temp) == len(spy_temp) == 4
    assert sum(ref_temp) >= 2 * n_res * 2 * n_res * n_res * 8 and spy_temp == [0] * 4
    spy_peak = fc.estimate_peak_memory(block, args)
    assert spy_peak < ref_peak
    smallest = fc.smallest_reachable_peak(block, args)
    chunked = fc.autochunk(block, args, int(smallest + 0.1 * (spy_peak - smallest)))
    with torch.no_grad():
        out = chunked(*args)
        whole_calls = len(spy)
        ref = block(*args)
    assert whole_calls > 4  # the chunk loops called the spy
    sizes = {}
    for name, shape in spy[:whole_calls]:
        sizes.setdefault(name, set()).add(shape)
    full = {name: {s for n, s in spy[whole_calls:] if n == name} for name in sizes}
    assert any(sizes[name] - full[name] for name in sizes), (sizes, full)  # chunk-sized
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-12, atol=1e-12)
