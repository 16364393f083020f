"""MSA module (AF3 Alg. 8-10) and template embedder (Alg. 16): float64 references of the new
layers, fp32 == fp64, padding invariance (tokens, MSA rows, templates), chunked == unchunked,
torch.fx tracing of a block, known template features."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from _af3_helpers import holes, random_features, randomize_, rel_err
from fold_model.af3.config import config
from fold_model.af3.msa_module import (
    MSAModule,
    MSAModuleBlock,
    MSAPairWeightedAveraging,
    msa_features,
)
from fold_model.af3.template import TemplateEmbedder, template_pair_features

CFG = config("tiny")
C_Z, C_SI = CFG.c_z, CFG.c_s_inputs


def test_pair_weighted_averaging_matches_loops():
    mod = randomize_(MSAPairWeightedAveraging(6, C_Z, 3, 2)).double()
    g = torch.Generator().manual_seed(0)
    S, N = 3, 5
    m = torch.randn(1, S, N, 6, generator=g, dtype=torch.float64)
    z = torch.randn(1, N, N, C_Z, generator=g, dtype=torch.float64)
    tm = holes((1, N), seed=1).double()
    got = mod(m, z, tm)
    mn = mod.layer_norm_m(m)[0]
    b = mod.linear_b(mod.layer_norm_z(z))[0]  # [N_i, N_j, H]
    v = mod.linear_v(mn).unflatten(-1, (2, 3))
    gate = torch.sigmoid(mod.linear_g(mn)).unflatten(-1, (2, 3))
    o = torch.zeros(S, N, 2, 3, dtype=torch.float64)
    for h in range(2):
        for i in range(N):
            logits = b[i, :, h].masked_fill(tm[0] == 0, -math.inf)
            w = torch.softmax(logits, -1)
            for s in range(S):
                o[s, i, h] = gate[s, i, h] * (w[:, None] * v[s, :, h]).sum(0)
    assert rel_err(got[0], mod.linear_o(o.flatten(-2))) < 1e-12
    assert rel_err(mod(m, z, tm, chunk_size=2), got) < 1e-12


def _msa_inputs(n=7, s=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    msa = torch.randint(0, 32, (2, s, n), generator=g)
    msa_mask = holes((2, s, n), seed=seed).to(dtype)
    feat = msa_features(msa, (torch.rand(2, s, n, generator=g) > 0.5).to(dtype),
                        torch.rand(2, s, n, generator=g, dtype=dtype))
    z = torch.randn(2, n, n, C_Z, generator=g, dtype=dtype)
    s_in = torch.randn(2, n, C_SI, generator=g, dtype=dtype)
    tm = holes((2, n), seed=seed + 1).to(dtype)
    msa_mask = msa_mask * tm[:, None]
    return feat, z, s_in, msa_mask, tm[:, :, None] * tm[:, None], tm


def _module(blocks=2):
    cfg = copy.deepcopy(CFG.msa)
    cfg.no_blocks = blocks
    return randomize_(MSAModule(cfg, C_Z, C_SI), scale=0.5).double().eval()


def test_msa_module_fp32_and_padding():
    mod = _module()
    feat, z, s_in, mm, pm, tm = _msa_inputs()
    ref = mod(feat, z, s_in, mm, pm, tm)
    assert ref.shape == z.shape
    got32 = copy.deepcopy(mod).float()(feat.float(), z.float(), s_in.float(), mm.float(),
                                       pm.float(), tm.float())
    assert rel_err(got32, ref) < 1e-5
    # Two padded tokens and one padded MSA row, all with random values.
    g = torch.Generator().manual_seed(7)
    n, s = 7, 5
    feat_p = torch.randn(2, s + 1, n + 2, feat.shape[-1], generator=g, dtype=feat.dtype)
    feat_p[:, :s, :n] = feat
    z_p = torch.randn(2, n + 2, n + 2, C_Z, generator=g, dtype=z.dtype)
    z_p[:, :n, :n] = z
    s_p = torch.randn(2, n + 2, C_SI, generator=g, dtype=z.dtype)
    s_p[:, :n] = s_in
    tm_p = torch.cat([tm, torch.zeros(2, 2, dtype=tm.dtype)], 1)
    mm_p = torch.zeros(2, s + 1, n + 2, dtype=mm.dtype)
    mm_p[:, :s, :n] = mm
    out = mod(feat_p, z_p, s_p, mm_p, tm_p[:, :, None] * tm_p[:, None], tm_p)
    keep = pm.bool()
    assert rel_err(out[:, :n, :n][keep], ref[keep]) < 1e-12


@pytest.mark.parametrize("chunk", [1, 4])
def test_msa_module_chunked(chunk):
    mod = _module()
    args = _msa_inputs(seed=3)
    ref = mod(*args)
    mod.set_chunk_size(chunk)
    assert rel_err(mod(*args), ref) < 1e-12


def test_msa_block_traces_with_fx():
    for last in (False, True):
        block = randomize_(MSAModuleBlock(CFG.msa, C_Z, last=last), scale=0.5).double().eval()
        gm = torch.fx.symbolic_trace(block)
        feat, z, s_in, mm, pm, tm = _msa_inputs(seed=2)
        m = torch.randn(*mm.shape, CFG.msa.c_m, dtype=torch.float64)
        ref, got = block(m, z, mm, pm, tm), gm(m, z, mm, pm, tm)
        assert rel_err(got[1], ref[1]) < 1e-12 and rel_err(got[0], ref[0]) < 1e-12


def test_template_features_known_case():
    # Residue 0 frame: N at -x... backbone N=(0,1,0), CA=(0,0,0), C=(1,0,0): e1 = x, e2 = y.
    bb = torch.zeros(1, 3, 3, 3, dtype=torch.float64)
    bb[0, 0] = torch.tensor([[0.0, 1, 0], [0, 0, 0], [1, 0, 0]])
    bb[0, 1] = torch.tensor([[0.0, 1, 5], [0, 0, 5], [1, 0, 5]])  # CA at z = 5 (dist 5)
    bb[0, 2] = torch.tensor([[0.0, 1, 60], [0, 0, 60], [1, 0, 60]])
    pb = bb[:, :, 1]  # pseudo-beta = CA here
    mask = torch.ones(1, 3, dtype=torch.float64)
    asym = torch.tensor([0, 0, 1])
    rt = torch.tensor([[3, 5, 31]])
    a = template_pair_features(rt, pb, mask, bb, mask, asym)
    assert a.shape == (1, 3, 3, 39 + 5 + 64)
    # distance 5: bin with lower edge <= 5 < next lower edge
    edges = torch.linspace(3.25, 50.75, 39)
    k = int((edges <= 5).sum()) - 1
    assert a[0, 0, 1, :39].argmax() == k and a[0, 0, 1, :39].sum() == 1
    assert torch.allclose(a[0, 0, 1, 40:43], torch.tensor([0.0, 0, 1], dtype=torch.float64),
                          atol=1e-6)  # unit vector along the frame's e3 = z
    assert a[0, 0, 2, :44].abs().sum() == 0  # different chains: zeroed
    assert a[0, 0, 2, 44 + 3] == 1 and a[0, 0, 2, 44 + 32 + 31] == 1  # restype of i and j


def _template_case(seed: int):
    """float64 features (with a padded template slot), an embedder, z and the pair mask."""
    f = {k: v.double() if v.is_floating_point() else v
         for k, v in random_features(seed=seed).items()}
    emb = randomize_(TemplateEmbedder(CFG.template, C_Z), scale=0.5).double().eval()
    n = f["asym_id"].shape[-1]
    z = torch.randn(1, n, n, C_Z, dtype=torch.float64)
    tm = f["token_mask"]
    return f, emb, z, tm[:, :, None] * tm[:, None]


def test_template_embedder_masks_and_padding():
    f, emb, z, pm = _template_case(seed=1)
    out = emb(f, z, pm)
    assert out.shape == z.shape and torch.isfinite(out).all()
    # The padded (masked) template does not matter: drop it and compare.
    g = {k: (v[:, :1] if k.startswith("template_") else v) for k, v in f.items()}
    assert rel_err(emb(g, z, pm), out) < 1e-12
    # No real template: the embedder adds nothing.
    none = dict(f, template_mask=torch.zeros_like(f["template_mask"]))
    assert emb(none, z, pm).abs().max() == 0


def test_template_embedder_one_at_a_time_and_skips():
    """Inference with the templates one at a time (set by chunking) sums the same as all at once
    (float64; a padded template slot is skipped); without any template the inference output is
    an exact zero and the pair stack does not run."""
    f, emb, z, pm = _template_case(seed=2)
    assert f["template_mask"].shape[-1] > 1 and f["template_mask"].min() == 0
    with torch.no_grad():
        ref = emb(f, z, pm)
        emb.set_chunk_size(3)
        assert emb.one_template_at_a_time
        chunked_one = emb(f, z, pm)
        emb.set_chunk_size(None)
        emb.one_template_at_a_time = True
        one = emb(f, z, pm)
    assert rel_err(one, ref) < 1e-12 and rel_err(chunked_one, ref) < 1e-10
    assert ref.abs().max() > 0
    runs = []
    emb.use_pair_stack(lambda v, m: runs.append(v.shape) or v)
    none = dict(f, template_mask=torch.zeros_like(f["template_mask"]))
    with torch.no_grad():
        out = emb(none, z, pm)
    assert not runs and out.shape == z.shape and torch.all(out == 0)
