"""Input (Alg. 3-4) and recycling (Alg. 32) embedders; extra MSA and template angle features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _trunk_helpers import randomize_, rel_err
from fold_model.af2.embedders import (
    InputEmbedder,
    RecyclingEmbedder,
    TemplateAngleEmbedder,
    build_extra_msa_feat,
    build_template_angle_feat,
    distogram_one_hot,
)


def test_input_embedder_alg3_alg4():
    emb = randomize_(InputEmbedder(22, 49, 16, 12, relpos_k=4)).double()
    g = torch.Generator().manual_seed(0)
    tf = torch.randn(2, 9, 22, generator=g, dtype=torch.float64)
    msa = torch.randn(2, 5, 9, 49, generator=g, dtype=torch.float64)
    ri = torch.tensor([[0, 1, 2, 3, 10, 11, 12, 30, 31]] * 2)
    m, z = emb(tf, ri, msa)
    assert m.shape == (2, 5, 9, 16) and z.shape == (2, 9, 9, 12)
    d = (ri[:, :, None] - ri[:, None, :]).clamp(-4, 4) + 4
    relpos = emb.linear_relpos(F.one_hot(d, 9).double())
    z_ref = emb.linear_tf_z_i(tf)[:, :, None] + emb.linear_tf_z_j(tf)[:, None, :] + relpos
    m_ref = emb.linear_msa_m(msa) + emb.linear_tf_m(tf)[:, None]
    assert rel_err(z, z_ref) < 1e-12 and rel_err(m, m_ref) < 1e-12
    # Clipping: residues 30 apart share the |d| = k bin.
    assert torch.equal(d[0, 0, 7], d[0, 0, 8])


def test_distogram_bins():
    x = torch.zeros(1, 4, 3)
    x[0, 1, 0] = 3.0  # below the first edge: no bin
    x[0, 2, 0] = 4.0  # (3.25, 4.5]: bin 0 for edges 3.25 + 1.25 b
    x[0, 3, 0] = 100.0  # beyond the last edge: the open last bin
    d = distogram_one_hot(x, 3.25, 20.75, 15)
    assert d.shape == (1, 4, 4, 15)
    assert d[0, 0, 1].sum() == 0
    assert d[0, 0, 2].argmax() == 0 and d[0, 0, 2].sum() == 1
    assert d[0, 0, 3].argmax() == 14
    assert torch.equal(d, d.transpose(1, 2))


def test_recycling_embedder_alg32():
    emb = randomize_(RecyclingEmbedder(16, 12, 3.25, 20.75, 15, 1e8))
    g = torch.Generator().manual_seed(1)
    m1, z = torch.randn(2, 9, 16, generator=g), torch.randn(2, 9, 9, 12, generator=g)
    x = torch.randn(2, 9, 3, generator=g) * 8
    dm, dz = emb(m1, z, x)
    assert dm.shape == m1.shape and dz.shape == z.shape
    ref = F.layer_norm(z, (12,), emb.layer_norm_z.weight, emb.layer_norm_z.bias) + emb.linear(
        distogram_one_hot(x, 3.25, 20.75, 15)
    )
    assert rel_err(dz, ref) < 1e-6
    ln_m = F.layer_norm(m1, (16,), emb.layer_norm_m.weight, emb.layer_norm_m.bias)
    assert rel_err(dm, ln_m) < 1e-6


def test_extra_msa_and_template_angle_features():
    g = torch.Generator().manual_seed(2)
    msa = torch.randint(0, 23, (2, 6, 9), generator=g)
    has_del, del_val = (torch.rand(2, 6, 9, generator=g) > 0.5).float(), torch.rand(2, 6, 9)
    f = build_extra_msa_feat(msa, has_del, del_val)
    assert f.shape == (2, 6, 9, 25)
    assert torch.equal(f[..., :23].argmax(-1), msa) and torch.equal(f[..., 24], del_val)

    aatype = torch.randint(0, 22, (2, 3, 9), generator=g)
    sc, alt = torch.randn(2, 3, 9, 7, 2), torch.randn(2, 3, 9, 7, 2)
    tmask = (torch.rand(2, 3, 9, 7, generator=g) > 0.3).float()
    feat = build_template_angle_feat(aatype, sc, alt, tmask)
    assert feat.shape == (2, 3, 9, 57)
    assert torch.equal(feat[..., 22:36], sc.flatten(-2)) and torch.equal(feat[..., 50:], tmask)
    emb = randomize_(TemplateAngleEmbedder(57, 16))
    assert emb(feat).shape == (2, 3, 9, 16)
