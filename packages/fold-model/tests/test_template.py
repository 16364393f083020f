"""Template pair features (88 channels), template pair stack (Alg. 16), pointwise attention
(Alg. 17) and the template embedder."""

from __future__ import annotations

import math

import torch
from _trunk_helpers import holes, make_batch, randomize_, rel_err
from fold_model.af2 import config
from fold_model.af2.template import (
    TemplateEmbedder,
    TemplatePairStack,
    TemplatePointwiseAttention,
    build_template_pair_feat,
)


def _templ_feats(seed=0):
    batch = make_batch(b=2, r=1, n_res=9, n_templ=3, seed=seed)
    return {k: v[:, 0] for k, v in batch.items() if k.startswith("template_")}


def _rotation(seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.det(q))).float()


def test_pair_features_layout_and_rigid_invariance():
    feats = _templ_feats()
    feats["template_all_atom_mask"][..., :3] = 1.0  # whole backbones: no channel masked
    f = build_template_pair_feat(feats, use_unit_vector=True)
    assert f.shape == (2, 3, 9, 9, 88)
    pb_mask = feats["template_pseudo_beta_mask"]
    assert torch.equal(f[..., 39], pb_mask[..., :, None] * pb_mask[..., None, :])
    assert torch.equal(f[..., 40:62].argmax(-1)[:, :, 0], feats["template_aatype"].long())
    assert torch.equal(f[..., 62:84].argmax(-1)[:, :, :, 0], feats["template_aatype"].long())
    unit = f[..., 84:87]
    bb = f[..., 87].bool()
    assert torch.allclose(unit[bb & ~torch.eye(9, dtype=torch.bool)].norm(dim=-1),
                          torch.ones(()), atol=1e-4)
    assert torch.all(unit[~bb] == 0)
    # Rotating and translating a template changes no feature (distances and local frames).
    rot, shift = _rotation(1), torch.tensor([5.0, -3.0, 2.0])
    moved = dict(feats)
    moved["template_all_atom_positions"] = feats["template_all_atom_positions"] @ rot.T + shift
    moved["template_pseudo_beta"] = feats["template_pseudo_beta"] @ rot.T + shift
    f2 = build_template_pair_feat(moved, use_unit_vector=True)
    # Distance bins are exact unless a distance sits within float noise of a bin edge.
    d = (feats["template_pseudo_beta"][..., :, None, :] - feats["template_pseudo_beta"][
        ..., None, :, :]).norm(dim=-1)
    edges = torch.linspace(3.25, 50.75, 39)
    near_edge = (d[..., None] - edges).abs().min() < 1e-3
    if not near_edge:
        assert torch.equal(f2[..., :39], f[..., :39])
    assert (f2[..., 84:87] - unit).abs().max() < 1e-4


def test_unit_vector_in_backbone_frame():
    feats = _templ_feats(2)
    pos = torch.zeros_like(feats["template_all_atom_positions"])
    # Residue 0: N on +y, CA at origin, C on +x -> identity frame; residue 1's CA at (0, 0, 2).
    pos[..., 0, 0, :] = torch.tensor([0.0, 1.0, 0.0])
    pos[..., 0, 2, :] = torch.tensor([1.0, 0.0, 0.0])
    pos[..., 1, 1, :] = torch.tensor([0.0, 0.0, 2.0])
    feats["template_all_atom_positions"] = pos
    feats["template_all_atom_mask"] = torch.ones_like(feats["template_all_atom_mask"])
    f = build_template_pair_feat(feats, use_unit_vector=True)
    assert torch.allclose(f[0, 0, 0, 1, 84:87], torch.tensor([0.0, 0.0, 1.0]), atol=1e-5)
    off = build_template_pair_feat(feats, use_unit_vector=False)
    assert torch.all(off[..., 84:87] == 0) and torch.equal(off[..., :84], f[..., :84])


def test_pointwise_attention_alg17():
    mod = randomize_(TemplatePointwiseAttention(10, 12, 4, 2)).double()
    g = torch.Generator().manual_seed(3)
    t = torch.randn(2, 3, 7, 7, 10, generator=g, dtype=torch.float64)
    z = torch.randn(2, 7, 7, 12, generator=g, dtype=torch.float64)
    tmask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    a = mod.mha
    q = a.linear_q(z).unflatten(-1, (2, 4))  # [B, i, j, H, D]
    k = a.linear_k(t).unflatten(-1, (2, 4))  # [B, T, i, j, H, D]
    v = a.linear_v(t).unflatten(-1, (2, 4))
    logits = torch.einsum("bijhd,btijhd->bijht", q, k) / math.sqrt(4)
    logits = logits + (tmask[:, None, None, None, :] - 1) * 1e9
    o = torch.einsum("bijht,btijhd->bijhd", torch.softmax(logits, -1), v)
    ref = a.linear_o(o.flatten(-2))
    assert rel_err(mod(t, z, tmask), ref) < 1e-12


def test_template_pair_stack_shapes_and_mask():
    cfg = config("tiny").template
    stack = randomize_(TemplatePairStack(cfg)).eval()
    t = torch.randn(2, 3, 7, 7, cfg.c_t)
    seq = holes((2, 7))
    pm = seq[:, :, None] * seq[:, None, :]
    out = stack(t, pm)
    assert out.shape == t.shape and torch.isfinite(out).all()
    stack64 = randomize_(TemplatePairStack(cfg)).double().eval()
    assert rel_err(out, stack64(t.double(), pm.double())) < 1e-5


def test_template_embedder_outputs_and_no_template():
    cfg = config("tiny").template
    emb = randomize_(TemplateEmbedder(cfg, c_m=16, c_z=12)).eval()
    feats = _templ_feats(4)
    z = torch.randn(2, 9, 9, 12)
    pm = torch.ones(2, 9, 9)
    out = emb(feats, z, pm)
    assert out["template_pair_embedding"].shape == (2, 9, 9, 12)
    assert out["template_single_embedding"].shape == (2, 3, 9, 16)
    assert out["template_single_mask"].shape == (2, 3, 9)
    assert torch.all(out["template_single_mask"][:, -1] == 0)  # the absent template
    assert out["template_pair_embedding"].abs().max() > 0
    feats["template_mask"] = torch.zeros_like(feats["template_mask"])
    assert torch.all(emb(feats, z, pm)["template_pair_embedding"] == 0)


def test_template_embedder_one_at_a_time_inference_equals_batched():
    """Inference with the templates one at a time (set by chunking: long inputs) gives what the
    batched path gives, in float64, with a template absent in one batch entry only, one absent
    everywhere (skipped, zero slot) and pair-mask holes; chunked pointwise attention included."""
    cfg = config("tiny").template
    emb = randomize_(TemplateEmbedder(cfg, c_m=16, c_z=12)).double().eval()
    feats = {k: v.double() if v.is_floating_point() else v
             for k, v in _templ_feats(5).items()}
    feats["template_mask"] = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]],
                                          dtype=torch.float64)
    z = torch.randn(2, 9, 9, 12, dtype=torch.float64)
    pm = holes((2, 9, 9), seed=6).double()
    with torch.no_grad():
        ref = emb(feats, z, pm)
        emb.set_chunk_size(4)
        assert emb.one_template_at_a_time
        one = emb(feats, z, pm)
        emb.set_chunk_size(None)
        emb.one_template_at_a_time = True  # AutoChunk's setting: no chunk size
        one_unchunked = emb(feats, z, pm)
    for key in ref:
        assert rel_err(one[key], ref[key]) < 1e-12, key
        assert rel_err(one_unchunked[key], ref[key]) < 1e-12, key
    assert ref["template_pair_embedding"].abs().max() > 0


def test_template_embedder_skips_stack_without_templates_at_inference(monkeypatch):
    """No template present, inference: the pair stack is not run and the update is an exact
    zero (a view, no buffer); with gradients on the stack runs (its parameters get zero
    gradients, as the batched path gives them)."""
    cfg = config("tiny").template
    emb = randomize_(TemplateEmbedder(cfg, c_m=16, c_z=12)).eval()
    feats = _templ_feats(7)
    feats["template_mask"] = torch.zeros_like(feats["template_mask"])
    z = torch.randn(2, 9, 9, 12)
    pm = torch.ones(2, 9, 9)
    calls = []
    monkeypatch.setattr(emb.pair_stack, "forward",
                        lambda *a: calls.append(1) or TemplatePairStack.forward(emb.pair_stack,
                                                                                 *a))
    with torch.no_grad():
        out = emb(feats, z, pm)["template_pair_embedding"]
    assert not calls and out.shape == z.shape and torch.all(out == 0)
    emb(feats, z, pm)["template_pair_embedding"].sum().backward()
    assert calls and emb.linear_t.weight.grad is not None


def test_template_embedder_runs_on_fake_tensors():
    """``predict --dry-run`` runs the model on FakeTensors: the mask's values are unknown there,
    so the full path runs (an upper bound of memory) instead of failing on a host read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = config("tiny").template
    emb = randomize_(TemplateEmbedder(cfg, c_m=16, c_z=12)).eval()
    emb.set_chunk_size(4)
    feats = _templ_feats(8)
    z, pm = torch.randn(2, 9, 9, 12), torch.ones(2, 9, 9)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
        fake = {k: mode.from_tensor(v) for k, v in feats.items()}
        out = emb(fake, mode.from_tensor(z), mode.from_tensor(pm))
    assert out["template_pair_embedding"].shape == (2, 9, 9, 12)
