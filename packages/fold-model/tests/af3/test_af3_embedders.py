"""AF3 input embedding: relative position encoding on known pairs, the windowed atom transformer
against the dense form of Alg. 7 (bias -1e10 outside the windows), padding invariance of the atom
attention encoder, fp32 == fp64, the input feature embedder's width."""

from __future__ import annotations

import copy

import pytest
import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3.config import config
from fold_model.af3.embedders import (
    AtomAttentionDecoder,
    AtomAttentionEncoder,
    AtomTransformer,
    AtomWindows,
    InputFeatureEmbedder,
    mean_over_atoms,
    relative_position_features,
)

CFG = config("tiny")


def _double(f):
    return {k: v.double() if v.is_floating_point() else v for k, v in f.items()}


def test_relative_position_known_pairs():
    f = {
        "asym_id": torch.tensor([0, 0, 0, 1, 2]),
        "entity_id": torch.tensor([0, 0, 0, 0, 1]),
        "sym_id": torch.tensor([0, 0, 0, 1, 0]),
        "residue_index": torch.tensor([2, 5, 60, 2, 0]),
        "token_index": torch.tensor([0, 1, 2, 3, 4]),
    }
    r, s = 32, 2
    x = relative_position_features(f, r, s)
    assert x.shape == (5, 5, 2 * 66 + 1 + 6)
    d_res, d_tok = x[..., :66].argmax(-1), x[..., 66:132].argmax(-1)
    same_ent, d_chain = x[..., 132], x[..., 133:].argmax(-1)
    assert d_res[0, 1] == 2 - 5 + r and d_res[0, 2] == 0 and d_res[2, 0] == 2 * r
    assert d_res[0, 3] == 2 * r + 1  # other chain: overflow bin
    assert d_tok[0, 0] == r and d_tok[0, 1] == 2 * r + 1  # different residues: overflow
    assert same_ent[0, 3] == 1 and same_ent[0, 4] == 0
    assert d_chain[0, 3] == 0 - 1 + s and d_chain[0, 4] == 2 * s + 1
    assert torch.all(x.sum(-1) == 3 + same_ent)  # three one-hots plus the entity bit


def test_mean_over_atoms():
    x = torch.arange(12.0).reshape(1, 1, 4, 3)
    tok = torch.tensor([[0, 0, 2, 2]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = mean_over_atoms(x, tok, mask, 3)
    assert torch.equal(out[0, 0], torch.tensor([[1.5, 2.5, 3.5], [0, 0, 0], [6, 7, 8]]))


def _dense_atom_transformer(mod: AtomTransformer, q, c, p_full, atom_mask, n_q, n_k):
    """Alg. 7 as written: dense attention over all atoms with beta = -1e10 outside the windows."""
    A = q.shape[-2]
    idx = torch.arange(A, dtype=torch.float64)
    centres = torch.arange(n_q / 2 - 0.5, A + n_q, n_q, dtype=torch.float64)
    inside = ((idx[:, None, None] - centres).abs() < n_q / 2) & (
        (idx[None, :, None] - centres).abs() < n_k / 2)
    beta = torch.where(inside.any(-1), 0.0, -1e10)  # [A, A]
    c_all = c.unsqueeze(1)
    key_mask = atom_mask[:, None, :].expand(-1, q.shape[1], -1)
    for attn, trans in zip(mod.attention, mod.transition):
        zn = attn.layer_norm_z(p_full)
        bias = attn.linear_z(zn).movedim(-1, -3) + beta  # [B, H, A, A]
        x = attn.normalize(q, c_all)
        x_kv = attn.normalize_keys(q, x, c_all)  # the keys' own AdaLN (AF3's cross_attention)
        q = q + attn.attend(x, x_kv, key_mask, bias, c_all)
        q = q + trans(q, c_all)
    return q


def test_window_major_keys_and_window_sums():
    """The window-major gather equals the sample-major one transposed; the window-wise
    residual sum equals the sum after unwindowing, padded (A % n_q != 0) or not."""
    g = torch.Generator().manual_seed(1)
    for atoms in (19, 20):
        win = AtomWindows(torch.ones(2, atoms), 4, 10)
        x = torch.randn(2, 3, atoms, 5, generator=g)
        assert torch.equal(win.keys_by_window(x), win.keys(x).transpose(1, 2))
        upd = torch.randn(2, win.n_windows, 3, 4, 5, generator=g)  # [B, K, S, n_q, C]
        assert torch.equal(win.add_windows(x, upd), x + win.unwindow(upd.transpose(1, 2)))
        # inference's overlapping views of the padded keys: the gathered windows where a key
        # is an atom, zeros where the window overhangs (both masked by key_valid there)
        views = win.key_windows(win.pad_keys(x))
        inside = (win.key_index == (torch.arange(win.n_windows)[:, None] * 4 - 3
                                    + torch.arange(10)))[None, :, None, :, None]
        assert torch.equal(views, torch.where(inside, win.keys_by_window(x), 0.0))


@pytest.mark.parametrize("A", [19, 20])  # odd (a partial last window) and a multiple of n_q
def test_windowed_atom_transformer_equals_dense(A):
    n_q, n_k = 4, 10  # windows overhang both ends
    mod = randomize_(AtomTransformer(8, 5, no_blocks=2, no_heads=2), scale=0.5).double()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, A, 8, generator=g, dtype=torch.float64)
    c = torch.randn(2, A, 8, generator=g, dtype=torch.float64)
    p_full = torch.randn(2, A, A, 5, generator=g, dtype=torch.float64)
    atom_mask = torch.ones(2, A, dtype=torch.float64)
    atom_mask[0, [3, 11]] = 0
    atom_mask[1, -2:] = 0
    win = AtomWindows(atom_mask, n_q, n_k)
    rows = win.queries(torch.arange(A)[None, :, None]).squeeze(-1).clamp_max(A - 1)  # [1, K, n_q]
    p_win = p_full[:, rows[0][:, :, None], win.key_index[:, None, :]]  # [B, K, n_q, n_k, C]
    got = mod(q, c, p_win, win)
    with torch.no_grad():  # inference: k, v per atom, the windows as overlapping views
        got_inference = mod(q, c, p_win, win)
    ref = _dense_atom_transformer(mod, q, c, p_full, atom_mask, n_q, n_k)
    real = atom_mask.bool()[:, None, :].expand(-1, 3, -1)
    assert rel_err(got[real], ref[real]) < 1e-12
    assert rel_err(got_inference[real], ref[real]) < 1e-12


def _encoder_inputs(seed=0):
    f = _double(random_features(n_token=9, batch=2, seed=seed, n_pad_atom=5))
    n = f["token_mask"].shape[-1]
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(2, 3, f["atom_mask"].shape[-1], 3, generator=g, dtype=torch.float64) * 5
    s = torch.randn(2, n, CFG.c_s, generator=g, dtype=torch.float64)
    z = torch.randn(2, n, n, CFG.c_z, generator=g, dtype=torch.float64)
    return f, r, s, z


def test_encoder_decoder_padding_invariance_and_fp32():
    enc = randomize_(AtomAttentionEncoder(CFG.atom, 30, CFG.c_s, CFG.c_z), scale=0.5).double()
    dec = randomize_(AtomAttentionDecoder(CFG.atom, 30), scale=0.5).double()
    f, r, s, z = _encoder_inputs()

    def run(f, r, s, z, enc=enc, dec=dec):
        a, q, c, p, win = enc(f, r, s, z)
        return a, dec(a, q, c, p, win, f["atom_to_token"])

    a, x = run(f, r, s, z)
    assert a.shape == (2, 3, f["token_mask"].shape[-1], 30) and x.shape == r.shape
    # Garbage in the padded atoms (features, positions) changes no real output.
    pad = f["atom_mask"] == 0
    g = dict(f)
    g["ref_pos"] = f["ref_pos"] + 50 * pad[..., None]
    g["ref_element"] = torch.where(pad, 7, f["ref_element"])
    g["ref_space_uid"] = torch.where(pad, 0, f["ref_space_uid"])
    g["atom_to_token"] = torch.where(pad, 0, f["atom_to_token"])
    r2 = r + 30 * pad[:, None, :, None]
    a2, x2 = run(g, r2, s, z)
    real_tok = f["token_mask"].bool()[:, None].expand(-1, 3, -1)
    real_atom = (~pad)[:, None].expand(-1, 3, -1)
    assert rel_err(a2[real_tok], a[real_tok]) < 1e-12
    assert rel_err(x2[real_atom], x[real_atom]) < 1e-12
    # fp32 against fp64
    f32 = {k: v.float() if v.is_floating_point() else v for k, v in f.items()}
    a32, x32 = run(f32, r.float(), s.float(), z.float(), copy.deepcopy(enc).float(),
                   copy.deepcopy(dec).float())
    assert rel_err(a32, a) < 1e-5 and rel_err(x32, x) < 1e-5


def test_encoder_gradients_reach_every_parameter():
    enc = randomize_(AtomAttentionEncoder(CFG.atom, 30, CFG.c_s, CFG.c_z), scale=0.5).double()
    f, r, s, z = _encoder_inputs(seed=1)
    a = enc(f, r, s, z)[0]
    (a * torch.randn_like(a)).sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name


def test_input_feature_embedder_width():
    emb = InputFeatureEmbedder(CFG.atom, CFG.c_token_input)
    f = random_features(n_token=6, batch=1)
    out = emb(f)
    assert out.shape == (1, 7, CFG.c_s_inputs) and torch.isfinite(out).all()
    assert torch.equal(out[..., CFG.c_token_input:CFG.c_token_input + 32].argmax(-1),
                       f["restype"].long())
