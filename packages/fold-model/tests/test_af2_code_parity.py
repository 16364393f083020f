"""fold-model against AF2's code where its released weights depend on it (issue 22 items 1-4).

Each reference is numpy float64 written from AlphaFold2's ``modules.py`` / ``folding.py``
(``OuterProductMean``, ``SingleTemplateEmbedding``, ``InvariantPointAttention``), in AF2's own
parameter layout (Haiku ``[in, out]`` weights, ``kv_scalar``, x/y/z point blocks); the fold module
gets the same numbers through the plain transposition the importer applies. Random inputs, odd
sizes, masks with holes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _trunk_helpers import holes, randomize_
from fold_model.af2 import config
from fold_model.af2.evoformer import OuterProductMean, make_block
from fold_model.af2.rigid import Rigid
from fold_model.af2.structure_module import InvariantPointAttention
from fold_model.af2.template import build_template_pair_feat


def _ln(x, scale, offset, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + offset


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


# ---------------------------------------------------------------- item 1: outer product mean
def af2_outer_product_mean(act, mask, p):
    """AF2 ``OuterProductMean.__call__`` for one example: act ``[S, N, C_m]``, mask ``[S, N]``."""
    mask = mask[..., None]
    act = _ln(act, p["ln_scale"], p["ln_offset"])
    left = mask * (act @ p["left_w"] + p["left_b"])
    right = mask * (act @ p["right_w"] + p["right_b"])
    left = np.transpose(left, [0, 2, 1])  # 'acb'
    out = np.einsum("acb,ade->dceb", left, right)
    out = np.einsum("dceb,cef->dbf", out, p["output_w"]) + p["output_b"]
    out = np.transpose(out, [1, 0, 2])
    norm = np.einsum("abc,adc->bdc", mask, mask)
    return out / (1e-3 + norm)


@pytest.mark.parametrize("layout", ["col", "row"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_outer_product_mean_divides_bias_like_af2(layout, chunk):
    c_m, c_z, c, s, n = 9, 7, 5, 6, 11
    mod = randomize_(OuterProductMean(c_m, c_z, c, divide_bias=True), seed=1).double()
    g = torch.Generator().manual_seed(2)
    m = torch.randn(2, s, n, c_m, generator=g, dtype=torch.float64)
    mask = holes((2, s, n), seed=3).double()
    mask[1, :, 4] = 0.0  # a residue absent from every sequence: n_ij = 0 on its row/column
    out = mod(m, mask, chunk_size=chunk, layout=layout)
    p = {
        "ln_scale": _np(mod.layer_norm.weight), "ln_offset": _np(mod.layer_norm.bias),
        "left_w": _np(mod.linear_1.weight).T, "left_b": _np(mod.linear_1.bias),
        "right_w": _np(mod.linear_2.weight).T, "right_b": _np(mod.linear_2.bias),
        "output_w": _np(mod.linear_out.weight).T.reshape(c, c, c_z),
        "output_b": _np(mod.linear_out.bias),
    }
    for b in range(2):
        ref = af2_outer_product_mean(_np(m[b]), _np(mask[b]), p)
        np.testing.assert_allclose(_np(out[b]), ref, rtol=1e-10, atol=1e-10)
    # where no sequence pairs up, AF2's update is the bias / 1e-3, not the bias
    np.testing.assert_allclose(_np(out[1, 4, 0]), p["output_b"] / 1e-3, rtol=1e-10)


def test_outer_product_mean_switch_is_the_supplements_linear_of_the_mean():
    mod = randomize_(OuterProductMean(9, 7, 5, divide_bias=False), seed=4).double()
    g = torch.Generator().manual_seed(5)
    m = torch.randn(1, 6, 11, 9, generator=g, dtype=torch.float64)
    mask = holes((1, 6, 11), seed=6).double()
    mm = mod.layer_norm(m)
    a, b = mod.linear_1(mm) * mask[..., None], mod.linear_2(mm) * mask[..., None]
    mean = torch.einsum("bsic,bsjd->bijcd", a, b).flatten(-2) / (
        1e-3 + torch.einsum("bsi,bsj->bij", mask, mask)[..., None])
    torch.testing.assert_close(mod(m, mask), mod.linear_out(mean), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("stack", ["evoformer", "extra_msa"])
def test_af2_blocks_divide_the_bias_by_default(stack):
    cfg = getattr(config("tiny"), stack)
    assert cfg.opm_divide_bias is True
    c_m = cfg.c_m if stack == "evoformer" else cfg.c_e
    block = make_block(cfg, c_m, 12, "af2", extra_msa=stack == "extra_msa")
    assert block.outer_product_mean.divide_bias is True
    cfg.opm_divide_bias = False
    block = make_block(cfg, c_m, 12, "af2", extra_msa=stack == "extra_msa")
    assert block.outer_product_mean.divide_bias is False


# ---------------------------------------------------------------- items 2, 4: template features
def _af2_frame(n, ca, c):
    """AF2 ``make_transform_from_reference``: the frame with C-CA along x and N in the x-y
    plane (the same frame as Alg. 21), as rotation matrices ``[N, 3, 3]`` and translations."""
    e1 = c - ca
    e1 = e1 / np.linalg.norm(e1, axis=-1, keepdims=True)
    v2 = n - ca
    e2 = v2 - (v2 * e1).sum(-1, keepdims=True) * e1
    e2 = e2 / np.linalg.norm(e2, axis=-1, keepdims=True)
    e3 = np.cross(e1, e2)
    return np.stack([e1, e2, e3], axis=-1), ca


def af2_template_pair_feat(batch, use_unit_vector):
    """AF2 ``SingleTemplateEmbedding.__call__`` up to ``embedding2d`` for one template."""
    pb_mask = batch["template_pseudo_beta_mask"]
    pb_mask_2d = pb_mask[:, None] * pb_mask[None, :]
    lower = np.linspace(3.25, 50.75, 39) ** 2
    upper = np.concatenate([lower[1:], [1e8]])
    pb = batch["template_pseudo_beta"]
    d2 = ((pb[:, None, :] - pb[None, :, :]) ** 2).sum(-1, keepdims=True)
    dgram = (d2 > lower) * (d2 < upper)
    to_concat = [dgram, pb_mask_2d[:, :, None]]
    num_res = pb.shape[0]
    aatype = np.eye(22)[batch["template_aatype"]]
    to_concat.append(np.tile(aatype[None, :, :], [num_res, 1, 1]))
    to_concat.append(np.tile(aatype[:, None, :], [1, num_res, 1]))
    pos = batch["template_all_atom_positions"]
    rot, trans = _af2_frame(pos[:, 0], pos[:, 1], pos[:, 2])
    # invert_point(translations, extra_dims=1): [i, j] = R_i^T (CA_j - CA_i)
    vec = np.einsum("iba,ijb->ija", rot, trans[None, :, :] - trans[:, None, :])
    inv_dist = 1.0 / np.sqrt(1e-6 + (vec**2).sum(-1))
    am = batch["template_all_atom_masks"]
    bb = am[:, 0] * am[:, 1] * am[:, 2]
    bb_2d = bb[:, None] * bb[None, :]
    inv_dist = inv_dist * bb_2d
    unit = vec * inv_dist[..., None]
    if not use_unit_vector:
        unit = np.zeros_like(unit)
    to_concat.append(unit)
    to_concat.append(bb_2d[..., None])
    act = np.concatenate(to_concat, axis=-1)
    return act * bb_2d[..., None]


@pytest.mark.parametrize("use_unit_vector", [False, True])
def test_template_pair_features_masked_like_af2(use_unit_vector):
    t, n = 3, 13
    g = np.random.default_rng(7)
    pos = 8.0 * g.standard_normal((2, t, n, 37, 3))
    atom_mask = (g.random((2, t, n, 37)) > 0.2).astype(np.float64)
    atom_mask[:, :, :3, :3] = 1.0  # some residues with a whole backbone
    atom_mask[0, 0, 5, 1] = 0.0  # a residue without CA
    aatype = g.integers(0, 22, (2, t, n))
    aatype[:, :, 7] = 21  # unaligned positions: gap, no atoms
    atom_mask[:, :, 7] = 0.0
    pb = 8.0 * g.standard_normal((2, t, n, 3))
    pb_mask = (g.random((2, t, n)) > 0.3).astype(np.float64)  # holes not where the backbone's
    feats = {
        "template_pseudo_beta": torch.tensor(pb),
        "template_pseudo_beta_mask": torch.tensor(pb_mask),
        "template_aatype": torch.tensor(aatype),
        "template_all_atom_positions": torch.tensor(pos),
        "template_all_atom_mask": torch.tensor(atom_mask),
    }
    out = _np(build_template_pair_feat(feats, use_unit_vector=use_unit_vector))
    for b in range(2):
        for k in range(t):
            ref = af2_template_pair_feat({
                "template_pseudo_beta": pb[b, k], "template_pseudo_beta_mask": pb_mask[b, k],
                "template_aatype": aatype[b, k], "template_all_atom_positions": pos[b, k],
                "template_all_atom_masks": atom_mask[b, k],
            }, use_unit_vector)
            # fold builds the features in float32: distogram bins compare exactly unless a
            # distance sits on a bin edge (none does for these draws)
            np.testing.assert_allclose(out[b, k], ref, atol=1e-5)
    assert np.all(out[:, :, 7] == 0) and np.all(out[:, :, :, 7] == 0)


def test_unit_vector_defaults_off_as_released():
    assert config("af2_initial").template.use_unit_vector is False
    assert config("tiny").template.use_unit_vector is False


# ---------------------------------------------------------------- item 3: IPA
def af2_ipa(act, pair, mask, rot, trans, p, h, c, pq, pv):
    """AF2 ``InvariantPointAttention.__call__`` for one example (``folding.py``): act ``[N, C_s]``,
    pair ``[N, N, C_z]``, mask ``[N, 1]``, frames ``rot [N, 3, 3]``, ``trans [N, 3]``."""
    n = act.shape[0]

    def lin(x, name):
        return x @ p[name + "/weights"] + p[name + "/bias"]

    def apply(pts):  # list of 3 [N, ...] coordinate arrays -> global
        r = rot.reshape(n, *([1] * (pts[0].ndim - 1)), 3, 3)
        t = trans.reshape(n, *([1] * (pts[0].ndim - 1)), 3)
        x = np.stack(pts, -1)
        return list(np.moveaxis(np.einsum("...ab,...b->...a", r, x) + t, -1, 0))

    def invert(pts):
        r = rot.reshape(n, 1, 3, 3)
        t = trans.reshape(n, 1, 3)
        x = np.stack(pts, -1) - t
        return list(np.moveaxis(np.einsum("...ba,...b->...a", r, x), -1, 0))

    q_scalar = lin(act, "q_scalar").reshape(n, h, c)
    kv_scalar = lin(act, "kv_scalar").reshape(n, h, 2 * c)
    k_scalar, v_scalar = np.split(kv_scalar, [c], axis=-1)
    q_point_local = np.split(lin(act, "q_point_local"), 3, axis=-1)
    q_point = [x.reshape(n, h, pq) for x in apply(q_point_local)]
    kv_point_local = np.split(lin(act, "kv_point_local"), 3, axis=-1)
    kv_point = [x.reshape(n, h, pq + pv) for x in apply(kv_point_local)]
    k_point, v_point = list(zip(*[np.split(x, [pq], axis=-1) for x in kv_point]))

    scalar_weights = np.sqrt(1.0 / (3 * max(c, 1)))
    point_weights = np.sqrt(1.0 / (3 * max(pq, 1) * 9.0 / 2))
    trainable = np.log1p(np.exp(p["trainable_point_weights"]))
    point_weights = point_weights * trainable[:, None]
    v_point = [np.swapaxes(x, -2, -3) for x in v_point]
    q_point = [np.swapaxes(x, -2, -3) for x in q_point]
    k_point = [np.swapaxes(x, -2, -3) for x in k_point]
    dist2 = sum((qx[:, :, None, :] - kx[:, None, :, :]) ** 2 for qx, kx in zip(q_point, k_point))
    attn_qk_point = -0.5 * np.sum(point_weights[:, None, None, :] * dist2, axis=-1)
    v = np.swapaxes(v_scalar, -2, -3)
    q = np.swapaxes(scalar_weights * q_scalar, -2, -3)
    k = np.swapaxes(k_scalar, -2, -3)
    logits = q @ np.swapaxes(k, -2, -1) + attn_qk_point
    logits = logits + np.sqrt(1.0 / 3) * np.transpose(lin(pair, "attention_2d"), [2, 0, 1])
    mask_2d = mask * np.swapaxes(mask, -1, -2)
    logits = logits - 1e5 * (1.0 - mask_2d)
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn = attn / attn.sum(-1, keepdims=True)
    result_scalar = np.swapaxes(attn @ v, -2, -3).reshape(n, h * c)
    result_point = [np.swapaxes(np.sum(attn[..., None] * vx[:, None, :, :], axis=-2), -2, -3)
                    .reshape(n, h * pv) for vx in v_point]
    local = invert(result_point)
    feats = [result_scalar, *local, np.sqrt(1e-8 + sum(x**2 for x in local))]
    feats.append(np.einsum("hij,ijc->ihc", attn, pair).reshape(n, -1))
    return lin(np.concatenate(feats, axis=-1), "output_projection")


def test_ipa_matches_af2_code_with_af2_parameters():
    c_s, c_z, h, c, pq, pv, n = 13, 7, 3, 5, 4, 3, 9
    ipa = InvariantPointAttention(c_s, c_z, c, h, pq, pv).double()
    g = np.random.default_rng(8)
    p = {
        "q_scalar/weights": g.standard_normal((c_s, h * c)) / 3,
        "kv_scalar/weights": g.standard_normal((c_s, h * 2 * c)) / 3,
        "q_point_local/weights": g.standard_normal((c_s, 3 * h * pq)) / 3,
        "kv_point_local/weights": g.standard_normal((c_s, 3 * h * (pq + pv))) / 3,
        "attention_2d/weights": g.standard_normal((c_z, h)) / 3,
        "output_projection/weights": g.standard_normal((h * (c + 4 * pv + c_z), c_s)) / 3,
        "trainable_point_weights": g.standard_normal(h),
    }
    for name in ("q_scalar", "kv_scalar", "q_point_local", "kv_point_local", "attention_2d",
                 "output_projection"):
        p[name + "/bias"] = g.standard_normal(p[name + "/weights"].shape[1])
    fold_names = {"q_scalar": "linear_q", "kv_scalar": "linear_kv",
                  "q_point_local": "linear_q_points", "kv_point_local": "linear_kv_points",
                  "attention_2d": "linear_b", "output_projection": "linear_out"}
    with torch.no_grad():
        for af2, fold in fold_names.items():
            getattr(ipa, fold).weight.copy_(torch.tensor(p[af2 + "/weights"].T))
            getattr(ipa, fold).bias.copy_(torch.tensor(p[af2 + "/bias"]))
        ipa.head_weights.copy_(torch.tensor(p["trainable_point_weights"]))

    s = torch.tensor(g.standard_normal((2, n, c_s)))
    z = torch.tensor(g.standard_normal((2, n, n, c_z)))
    quat = torch.tensor(g.standard_normal((2, n, 4)))
    rigid = Rigid.from_quat_and_trans(quat, torch.tensor(2.0 * g.standard_normal((2, n, 3))))
    mask = holes((2, n), seed=9).double()
    out = ipa(s, z, rigid, mask)
    for b in range(2):
        ref = af2_ipa(_np(s[b]), _np(z[b]), _np(mask[b])[:, None], _np(rigid.rots[b]),
                      _np(rigid.trans[b]), p, h, c, pq, pv)
        real = _np(mask[b]).astype(bool)  # a fully masked query row is arbitrary in both
        np.testing.assert_allclose(_np(out[b])[real], ref[real], rtol=1e-9, atol=1e-9)
