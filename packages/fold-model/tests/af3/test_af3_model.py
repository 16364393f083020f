"""The assembled AlphaFold3 (tiny preset): training and inference shapes at odd sizes with
masks, the trunk's invariance to padding, recycling, chunked == unchunked, per-sub-layer
checkpointing == plain, confidence targets of a perfect prediction and of a moved representative
atom, presets."""

from __future__ import annotations

import copy

import pytest
import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3 import AlphaFold3, config
from fold_model.af3.confidence import confidence_targets, token_atom_index, token_frame_atoms
from fold_model.af3.diffusion import random_rotation


def _f64(f):
    return {k: v.double() if v.is_floating_point() else v for k, v in f.items()}


def _model(**kw):
    torch.manual_seed(0)
    return randomize_(AlphaFold3(config("tiny", **kw)), scale=0.5)


def test_presets():
    af3 = config("af3")
    assert (af3.c_s, af3.c_z, af3.pairformer.no_blocks, af3.msa.no_blocks) == (384, 128, 48, 4)
    assert (af3.diffusion.c_token, af3.diffusion.no_blocks, af3.diffusion.no_heads) == (768, 24, 16)
    assert af3.diffusion.sigma_data == 16 and af3.sampler.no_steps == 200
    assert af3.diffusion.no_samples == 48 and af3.c_s_inputs == 449
    assert af3.atom.n_queries == 32 and af3.atom.n_keys == 128 and af3.atom.no_blocks == 3
    assert config("af3_finetune").loss.bond_weight == 1.0 and af3.loss.bond_weight == 0.0
    with pytest.raises(ValueError, match="unknown AF3 preset"):
        config("af4")
    with pytest.raises(ValueError, match="no 'nope'"):
        config("tiny", pairformer__nope=1)


def test_training_step_shapes_loss_and_gradients():
    model = _model()
    model.train()
    f = random_features(n_token=9, batch=2, seed=1, n_pad_token=2, n_pad_atom=3)
    out = model(f, generator=torch.Generator().manual_seed(0))
    S = model.config.diffusion.no_samples
    A = f["atom_mask"].shape[-1]
    assert out["x_denoised"].shape == (2, S, A, 3) and out["sigma"].shape == (2, S)
    assert out["distogram_logits"].shape == (2, 11, 11, 64)
    assert out["confidence_logits"]["plddt"].shape == (2, 1, A, 50)
    loss, parts = model.loss(out, f)
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in parts.values())
    loss.backward()
    got = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in got)
    nonzero = sum(int(g.abs().max() > 0) for g in got)
    assert nonzero >= 0.95 * len(got)


def test_inference_shapes_masks_and_confidences():
    model = _model().eval()
    f = random_features(n_token=7, batch=1, seed=2)
    with torch.no_grad():
        out = model(f, generator=torch.Generator().manual_seed(1))
    x = out["x_pred"]
    assert x.shape == (1, model.config.sampler.no_samples, f["atom_mask"].shape[-1], 3)
    assert torch.isfinite(x).all() and x[..., f["atom_mask"][0] == 0, :].abs().max() == 0
    assert ((out["plddt"] >= 0) & (out["plddt"] <= 100)).all()
    assert out["pae"].shape == (1, 1, 8, 8)


def _pad(f, extra_tok, extra_atom, seed=0):
    """Append padded tokens / atoms with random garbage (masks 0)."""
    g = torch.Generator().manual_seed(seed)
    N = f["token_mask"].shape[-1]
    out = {}
    for k, v in f.items():
        shape = list(v.shape)
        dims = [i for i, s in enumerate(shape) if i > 0 and s == N and not k.startswith("ref_")
                and k not in ("atom_to_token", "atom_positions", "atom_resolved", "atom_mask")]
        if k in ("ref_pos", "ref_mask", "ref_element", "ref_charge", "ref_atom_name_chars",
                 "ref_space_uid", "ref_pos_source", "atom_to_token", "atom_positions",
                 "atom_resolved", "atom_mask"):
            dims, add = [1], extra_atom
        else:
            add = extra_tok
        for d in dims:
            pad_shape = list(v.shape)
            pad_shape[d] = add
            if v.is_floating_point():
                junk = torch.rand(pad_shape, generator=g, dtype=v.dtype) * 3
            else:
                junk = torch.randint(0, 5, pad_shape, generator=g).to(v.dtype)
            v = torch.cat([v, junk], d)
        out[k] = v
    for k in ("token_mask", "msa_mask", "atom_mask"):
        n_old = f[k].shape[-1]
        out[k] = out[k].clone()
        out[k][..., n_old:] = 0
    out["msa_mask"] = out["msa_mask"] * out["token_mask"][:, None]
    out["template_mask"] = f["template_mask"]
    return out


def test_trunk_ignores_padding():
    model = _model().double().eval()
    f = _f64(random_features(n_token=8, batch=1, seed=3))
    g = _pad(f, 3, 4)
    with torch.no_grad():
        s_in, s, z = model.trunk(f, 2)
        s_in2, s2, z2 = model.trunk(g, 2)
    n = f["token_mask"].shape[-1]
    real = f["token_mask"][0].bool()
    assert rel_err(s2[0, :n][real], s[0][real]) < 1e-10
    assert rel_err(z2[0, :n, :n][real][:, real], z[0][real][:, real]) < 1e-10
    # recycling changes the result
    _, s1, _ = model.trunk(f, 1)
    assert rel_err(s1, s) > 1e-3


def test_chunked_trunk_equals_unchunked():
    model = _model().double().eval()
    f = _f64(random_features(n_token=9, batch=1, seed=4))
    with torch.no_grad():
        ref = model.trunk(f, 2)
        model.set_chunk_size(3)
        got = model.trunk(f, 2)
    assert rel_err(got[1], ref[1]) < 1e-12 and rel_err(got[2], ref[2]) < 1e-12


@pytest.mark.parametrize("blocks,atoms,plain_blocks", [(False, False, 0), (True, True, 0),
                                                       (False, False, 1), (True, True, 1)],
                         ids=["sublayers", "blocks+atoms", "sublayers-last1", "blocks+atoms-last1"])
def test_checkpointing_same_loss_and_grads(blocks, atoms, plain_blocks):
    plain = _model(confidence__enabled=False).double()
    ckpt = copy.deepcopy(plain)
    ckpt.set_uncheckpointed_blocks(pairformer=plain_blocks, diffusion=plain_blocks)
    ckpt.set_checkpointing(True, blocks=blocks, atoms=atoms)  # keeps the exempt blocks
    d = ckpt.diffusion
    assert d.encoder.transformer.use_checkpoint == d.decoder.transformer.use_checkpoint == atoms
    assert all(b.checkpoint_blocks == blocks for b in ckpt.pairformer.blocks)
    n = len(ckpt.pairformer.blocks)
    assert [b.use_checkpoint for b in ckpt.pairformer.blocks] == [i < n - plain_blocks
                                                                  for i in range(n)]
    assert d.transformer.uncheckpointed_blocks == plain_blocks
    assert ckpt.checkpointed_stacks() == {"pairformer": n, "diffusion": len(d.transformer.blocks)}
    f = _f64(random_features(n_token=7, batch=1, seed=5))
    res = []
    for model in (plain, ckpt):
        model.train()
        torch.manual_seed(3)
        out = model(f, no_cycles=2, generator=torch.Generator().manual_seed(2))
        loss, _ = model.loss(out, f)
        loss.backward()
        res.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert rel_err(res[1][0], res[0][0]) < 1e-12
    for n, g in res[0][1].items():
        assert rel_err(res[1][1][n], g) < 1e-9 or g.abs().max() == 0, n


def test_uncheckpointed_blocks_from_the_config_and_their_errors():
    model = _model(checkpoint=True, uncheckpointed_pairformer_blocks=1,
                   uncheckpointed_diffusion_blocks=2)
    assert model.uncheckpointed_blocks() == {"pairformer": 1, "diffusion": 2}
    assert [b.use_checkpoint for b in model.pairformer.blocks] == [True, False]
    model.set_checkpointing(False)
    assert model.checkpointed_stacks() == {}
    assert not any(b.use_checkpoint for b in model.pairformer.blocks)
    with pytest.raises(ValueError, match="uncheckpointed_pairformer_blocks must be in 0..48"):
        config("af3", uncheckpointed_pairformer_blocks=49)
    with pytest.raises(ValueError, match="'diffusion' must be in 0..2, got 3"):
        model.set_uncheckpointed_blocks(diffusion=3)
    with pytest.raises(ValueError, match="unknown stack 'evoformer'"):
        model.set_uncheckpointed_blocks(evoformer=1)


def test_confidence_targets_of_a_perfect_prediction():
    cfg = config("tiny")
    f = random_features(n_token=9, batch=1, seed=6)
    f["atom_resolved"] = f["atom_mask"].clone()
    rot = random_rotation((1, 2), torch.Generator().manual_seed(0))
    x = torch.einsum("bsij,bsaj->bsai", rot, f["atom_positions"][:, None].expand(1, 2, -1, 3)) + 7
    t = confidence_targets(f, x, cfg)
    m = t["plddt_mask"] > 0
    assert m.any() and (t["plddt"][m] == cfg.confidence.plddt_no_bins - 1).all()
    assert (t["pde"][t["pde_mask"] > 0] == 0).all()
    assert t["pae_mask"].sum() > 0 and (t["pae"][t["pae_mask"] > 0] == 0).all()
    # Frames: amino-acid tokens use (centre - 1, centre, centre + 1).
    frame, valid = token_frame_atoms(f, f["atom_positions"])
    c = f["token_center_atom"][0, 0].item()
    assert frame[0, 0].tolist() == [c - 1, c, c + 1] and valid[0, 0]
    assert token_atom_index(f["atom_to_token"], 9)[0, :4].tolist() == [0, 1, 2, 0]


def test_pde_targets_and_distance_features_use_the_representative_atoms():
    """Moving one token's representative (CB-like) atom, not its centre, changes the PDE targets
    of exactly that token's pairs and the confidence head's distance input; an unresolved
    representative atom masks its pairs out of the PDE loss (not out of pLDDT / PAE)."""
    cfg = config("tiny")
    f = _f64(random_features(n_token=9, batch=1, seed=6))
    f["atom_resolved"] = f["atom_mask"].clone()
    rep, center = f["token_pseudo_beta_atom"][0].long(), f["token_center_atom"][0].long()
    k = int(torch.nonzero(rep != center)[0])
    x = f["atom_positions"][:, None].clone()  # [1, 1, A, 3]: a perfect prediction
    x[0, 0, rep[k]] += torch.tensor([1000.0, 0.0, 0.0], dtype=x.dtype)  # every error > 0.5 A
    t = confidence_targets(f, x, cfg)
    moved = (t["pde"][0, 0] > 0) & (t["pde_mask"][0, 0] > 0)  # [N, N]
    n_real = int(f["token_mask"].sum())
    expect = torch.zeros_like(moved)
    expect[k, :n_real] = expect[:n_real, k] = True
    expect[k, k] = False
    assert torch.equal(moved, expect)
    # Unresolved representative atom of token k: no PDE pair with k; centre-based masks kept.
    f2 = dict(f, atom_resolved=f["atom_resolved"].clone())
    f2["atom_resolved"][0, rep[k]] = 0.0
    t2 = confidence_targets(f2, x, cfg)
    assert (t2["pde_mask"][0, 0, k] == 0).all() and (t2["pde_mask"][0, 0, :, k] == 0).all()
    others = torch.arange(f["token_mask"].shape[1]) != k  # PAE of centre k in others' frames
    col, col2 = t["pae_mask"][0, 0, others, k], t2["pae_mask"][0, 0, others, k]
    assert torch.equal(col, col2) and col.sum() > 0
    # The head's distance one-hot reads the representative atoms: moving a centre atom alone
    # leaves its logits unchanged, moving a representative atom changes them.
    torch.manual_seed(0)
    model = randomize_(AlphaFold3(cfg), scale=0.5).double().eval()  # no dropout
    head = model.confidence_head
    n = f["token_mask"].shape[1]
    g = torch.Generator().manual_seed(1)
    s_inputs = torch.randn(1, n, cfg.c_s_inputs, generator=g, dtype=torch.float64)
    s_trunk = torch.randn(1, n, cfg.c_s, generator=g, dtype=torch.float64)
    z_trunk = torch.randn(1, n, n, cfg.c_z, generator=g, dtype=torch.float64)
    x0 = f["atom_positions"][:, None].clone()
    base = head(f, s_inputs, s_trunk, z_trunk, x0)["pde"]
    x_c = x0.clone()
    x_c[0, 0, center[k]] += 30.0
    x_r = x0.clone()
    x_r[0, 0, rep[k]] += 30.0
    assert torch.equal(head(f, s_inputs, s_trunk, z_trunk, x_c)["pde"], base)
    assert not torch.allclose(head(f, s_inputs, s_trunk, z_trunk, x_r)["pde"], base)
