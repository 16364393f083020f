"""Chunked inference equals unchunked at odd sizes (chunk sizes that do not divide N)."""

from __future__ import annotations

import pytest
import torch
from _trunk_helpers import holes, make_batch, randomize_, rel_err
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.evoformer import make_block
from fold_model.af2.template import TemplatePairBlock, TemplatePointwiseAttention
from fold_model.layers import (
    OuterProductMean,
    TriangleAttentionEndingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
)

CHUNKS = [1, 3, 4, 100]


def _pair(seed=0, n=7, c=12):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(2, n, n, c, generator=g)
    seq = holes((2, n), seed=seed)
    return z, seq[:, :, None] * seq[:, None, :]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_pair_layers_chunked(chunk):
    z, pm = _pair()
    for cls in (TriangleMultiplicationOutgoing, TriangleMultiplicationIncoming):
        mod = randomize_(cls(12, 10))
        assert rel_err(mod(z, pm, chunk_size=chunk), mod(z, pm)) < 1e-6
    att = randomize_(TriangleAttentionEndingNode(12, 4, 3))
    assert rel_err(att(z, pm, chunk_size=chunk), att(z, pm)) < 1e-6


@pytest.mark.parametrize("chunk", CHUNKS)
def test_outer_product_mean_chunked(chunk):
    g = torch.Generator().manual_seed(1)
    m = torch.randn(2, 5, 7, 16, generator=g)
    mask = holes((2, 5, 7), seed=1)
    opm = randomize_(OuterProductMean(16, 12, 6))
    for layout in ("col", "row"):
        assert rel_err(opm(m, mask, chunk_size=chunk, layout=layout), opm(m, mask)) < 1e-6


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
def test_blocks_chunked(order):
    g = torch.Generator().manual_seed(2)
    m, z = torch.randn(2, 5, 7, 16, generator=g), torch.randn(2, 7, 7, 12, generator=g)
    msa_mask, (_, pm) = holes((2, 5, 7), seed=2), _pair(2)
    for extra in (False, True):
        block = randomize_(make_block(config("tiny").evoformer, 16, 12, order, extra)).eval()
        ref = block(m, z, msa_mask, pm)
        block.set_chunk_size(3)
        out = block(m, z, msa_mask, pm)
        assert rel_err(out[0], ref[0]) < 1e-6 and rel_err(out[1], ref[1]) < 1e-6


def test_template_layers_chunked():
    g = torch.Generator().manual_seed(3)
    t = torch.randn(2, 3, 7, 7, 10, generator=g)
    z, pm = _pair(3)
    block = randomize_(TemplatePairBlock(10, 4, 2, 6, 2, 0.25)).eval()
    ref = block(t, pm)
    block.set_chunk_size(2)
    assert rel_err(block(t, pm), ref) < 1e-6
    pw = randomize_(TemplatePointwiseAttention(10, 12, 4, 2))
    tmask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    assert rel_err(pw(t, z, tmask, chunk_size=3), pw(t, z, tmask)) < 1e-6


def test_model_chunked():
    torch.manual_seed(0)
    model = randomize_(AlphaFold2(config("tiny"))).eval()
    batch = make_batch(r=2, n_res=9)
    with torch.no_grad():
        ref = model(batch)
        model.set_chunk_size(4)
        out = model(batch)
    for key in ("msa", "pair", "single", "final_atom_positions"):
        assert rel_err(out[key], ref[key]) < 1e-5, key


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
def test_blocks_chunked_inference_in_place(order):
    """Chunked inference (no autograd) adds the residual updates in place: the same numbers in
    float64 as the unchunked out-of-place block, with the input pair's buffer reused."""
    g = torch.Generator().manual_seed(4)
    m = torch.randn(2, 5, 7, 16, generator=g, dtype=torch.float64)
    z = torch.randn(2, 7, 7, 12, generator=g, dtype=torch.float64)
    msa_mask, (_, pm) = holes((2, 5, 7), seed=4).double(), _pair(4)
    pm = pm.double()
    for extra in (False, True):
        block = randomize_(make_block(config("tiny").evoformer, 16, 12, order, extra))
        block = block.double().eval()
        with torch.no_grad():
            ref = block(m, z, msa_mask, pm)
            block.set_chunk_size(3)
            z_in = z.clone()
            out = block(m.clone(), z_in, msa_mask, pm)
        assert rel_err(out[0], ref[0]) < 1e-12 and rel_err(out[1], ref[1]) < 1e-12
        if order != "parallel":  # (the parallel order's join adds the two branches anew)
            assert out[1].data_ptr() == z_in.data_ptr()  # updated in place: one pair buffer


def test_chunked_inference_memory():
    """The long-input path's memory: an Evoformer block (AF2 order) chunked at inference peaks
    at least one pair tensor lower with in-place residuals than with out-of-place ones, and a
    chunked triangle multiplication never holds the four projections [4c, N, N] at once."""
    import importlib

    from fold_chunk import measure_peak_memory

    pair_stack_module = importlib.import_module("fold_model.layers.pair_stack")

    n, c_z = 40, 12
    g = torch.Generator().manual_seed(5)
    m, z = torch.randn(1, 5, n, 16, generator=g), torch.randn(1, n, n, c_z, generator=g)
    msa_mask, pm = torch.ones(1, 5, n), torch.ones(1, n, n)
    block = randomize_(make_block(config("tiny").evoformer, 16, c_z, "af2", False)).eval()
    block.set_chunk_size(4)
    pair_bytes = n * n * c_z * 4

    def peak() -> int:
        with torch.no_grad():
            return measure_peak_memory(block, m.clone(), z.clone(), msa_mask, pm)

    in_place = peak()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pair_stack_module, "in_place_residuals", lambda *a: False)
        out_of_place = peak()
    assert in_place <= out_of_place - pair_bytes, (in_place, out_of_place, pair_bytes)

    c = 16
    tri = randomize_(TriangleMultiplicationOutgoing(c_z, c)).eval()
    with torch.no_grad():
        whole = measure_peak_memory(tri, z, pm)
        chunked = measure_peak_memory(tri, z, pm, chunk_size=4)
    projections = 4 * c * n * n * 4
    assert chunked <= whole - projections // 2, (chunked, whole, projections)
