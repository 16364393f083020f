"""Per-step AF2 transforms (fold_data.af2.transforms) on synthetic raw features."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from fold_data.af2.ground_truth import atom37_to_torsion_angles, make_pseudo_beta
from fold_data.af2.presets import PRESETS, DataPreset, get_preset
from fold_data.af2.schema import RAW_FEATURES, SAMPLE_FEATURES
from fold_data.af2.transforms import (
    GAP,
    MASK_TOKEN,
    assign_extra_to_clusters,
    deletion_value,
    make_msa_cycle,
    make_sample,
    masked_msa,
    msa_block_deletion,
    msa_profile,
    summarize_clusters,
)
from fold_data.schema import SchemaError, validate


def synthetic_raw(
    n_res: int, n_msa: int, n_templ: int = 0, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random but valid raw features (RAW_FEATURES): MSA rows are mutated query copies with gap
    runs and deletions, templates have gaps and atom masks with holes."""
    rng = np.random.default_rng(seed)
    aatype = rng.integers(0, 21, size=n_res).astype(np.int32)
    msa = np.repeat(aatype[None], n_msa, axis=0)
    mutate = rng.random((n_msa, n_res)) < rng.uniform(0.1, 0.7, size=(n_msa, 1))
    msa[mutate] = rng.integers(0, 21, size=mutate.sum())
    for i in range(1, n_msa):  # a gap run in most rows
        a = rng.integers(0, n_res)
        msa[i, a : a + rng.integers(0, max(n_res // 3, 1))] = GAP
    msa[0] = aatype
    deletions = np.where(rng.random((n_msa, n_res)) < 0.1, rng.integers(1, 30, (n_msa, n_res)), 0)
    deletions[0] = 0
    raw: dict[str, np.ndarray] = {
        "aatype": aatype,
        "residue_index": np.arange(n_res, dtype=np.int32),
        "seq_length": np.asarray(n_res, dtype=np.int32),
        "sequence": np.asarray("".join("ARNDCQEGHILKMFPSTWYVX"[a] for a in aatype).encode()),
        "msa": msa.astype(np.int32),
        "deletion_matrix": deletions.astype(np.float32),
        "msa_species": np.asarray([b""] * n_msa, dtype=object),
    }
    templ_aatype = rng.integers(0, 21, size=(n_templ, n_res))
    templ_aatype[rng.random((n_templ, n_res)) < 0.2] = GAP
    templ_mask = (rng.random((n_templ, n_res, 37)) < 0.8).astype(np.float32)
    templ_mask[templ_aatype == GAP] = 0.0
    templ_pos = rng.normal(scale=10.0, size=(n_templ, n_res, 37, 3)) * templ_mask[..., None]
    raw.update(
        template_aatype=templ_aatype.astype(np.int32),
        template_all_atom_positions=templ_pos.astype(np.float32),
        template_all_atom_mask=templ_mask,
        template_sum_probs=rng.random(n_templ).astype(np.float32),
        template_domain_names=np.asarray([f"1ab{i}_A".encode() for i in range(n_templ)], "S6"),
    )
    for name, spec in RAW_FEATURES.items():  # ground truth: random arrays of the right shape
        if name in raw:
            continue
        shape = tuple(n_res if d == "N_res" else d for d in spec.shape)
        if spec.dtype == "int32":
            raw[name] = rng.integers(0, 14, size=shape).astype(np.int32)
        elif name.endswith(("mask", "exists", "ambiguous")):
            raw[name] = (rng.random(shape) < 0.7).astype(np.float32)
        else:
            raw[name] = rng.normal(size=shape).astype(np.float32)
    validate(raw, RAW_FEATURES, where="synthetic raw")
    return raw


SMALL = DataPreset("small", n_res=24, n_clust=8, n_extra=12, n_templ=2, max_recycling_iters=1)


# --------------------------------------------------------------------------------------------
# Schema and determinism
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset_name", ["tiny", "af2_initial"])
@pytest.mark.parametrize("n_res", [37, 301])
@pytest.mark.parametrize("training", [True, False])
def test_sample_schema_holds(preset_name: str, n_res: int, training: bool) -> None:
    preset = PRESETS[preset_name]
    raw = synthetic_raw(n_res, n_msa=41, n_templ=3, seed=n_res)
    sample = make_sample(raw, preset_name, seed=3, training=training)
    expected_res = n_res if (not training and n_res > preset.n_res) else preset.n_res
    sizes = validate(sample, SAMPLE_FEATURES, allow_extra=False)
    assert sizes == {
        "R": preset.n_cycle,
        "N_res": expected_res,
        "N_clust": preset.n_clust,
        "N_extra": preset.n_extra,
        "N_templ": preset.n_templ,
    }
    n_real = min(n_res, expected_res)
    assert sample["seq_mask"].sum(axis=1).tolist() == [n_real] * preset.n_cycle


def test_sample_schema_holds_finetune() -> None:
    preset = PRESETS["af2_finetune"]
    raw = synthetic_raw(389, n_msa=19, seed=1)
    sample = make_sample(raw, preset, seed=0)
    validate(
        sample, SAMPLE_FEATURES, sizes={"R": 4, "N_res": 384, "N_clust": 512}, allow_extra=False
    )
    n_rows = sample["msa_mask"][:, :, 0].sum(axis=1)  # rows left after block deletion
    assert np.all((n_rows >= 1) & (n_rows < 19)) and np.all(n_rows == n_rows[0])
    assert sample["msa_mask"][:, : int(n_rows[0])].all() and not sample["msa_mask"][:, 19:].any()


def test_same_seed_same_sample_different_seed_differs() -> None:
    raw = synthetic_raw(70, n_msa=60, n_templ=2, seed=5)
    a = make_sample(raw, "tiny", seed=11)
    b = make_sample(raw, "tiny", seed=11)
    c = make_sample(raw, "tiny", seed=12)
    for name in SAMPLE_FEATURES:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert not np.array_equal(a["msa_feat"], c["msa_feat"])
    assert not np.array_equal(a["bert_mask"], c["bert_mask"])


def test_recycling_copies_resample_msa_and_copy_the_rest() -> None:
    raw = synthetic_raw(30, n_msa=50, seed=2)
    s = make_sample(raw, "tiny", seed=4)
    assert not np.array_equal(s["true_msa"][0], s["true_msa"][1])  # re-sampled clusters
    assert not np.array_equal(s["bert_mask"][0], s["bert_mask"][1])
    for name in ("aatype", "target_feat", "all_atom_positions", "use_clamped_fape", "resolution"):
        assert all(np.array_equal(s[name][0], s[name][r]) for r in range(3)), name


# --------------------------------------------------------------------------------------------
# Cropping and padding
# --------------------------------------------------------------------------------------------


def test_crop_keeps_contiguous_window() -> None:
    raw = synthetic_raw(83, n_msa=9, seed=7)
    for start in (0, 5, 83 - 64):
        s = make_sample(raw, "tiny", seed=1, crop_start=start)
        window = slice(start, start + 64)
        np.testing.assert_array_equal(s["aatype"][0], raw["aatype"][window])
        np.testing.assert_array_equal(s["residue_index"][0], raw["residue_index"][window])
        np.testing.assert_array_equal(s["all_atom_positions"][2], raw["all_atom_positions"][window])
        np.testing.assert_array_equal(s["true_msa"][1, 0], raw["aatype"][window])
    starts = set()
    for seed in range(12):  # random training crops: always a contiguous window of the raw chain
        s = make_sample(raw, "tiny", seed=seed)
        start = int(s["residue_index"][0, 0])
        np.testing.assert_array_equal(s["residue_index"][0], np.arange(start, start + 64))
        np.testing.assert_array_equal(s["aatype"][0], raw["aatype"][start : start + 64])
        starts.add(start)
    assert len(starts) > 3
    with pytest.raises(ValueError, match="crop_start"):
        make_sample(raw, "tiny", seed=1, crop_start=20)


def test_padding_is_masked_and_does_not_leak() -> None:
    n_res, n_msa = 19, 11  # fewer residues than N_res=24, fewer rows than N_clust + N_extra
    raw = synthetic_raw(n_res, n_msa, seed=3)
    seed = 9
    s = make_sample(raw, SMALL, seed=seed, training=False)
    assert not s["seq_mask"][:, n_res:].any() and s["seq_mask"][:, :n_res].all()
    assert (s["aatype"][:, n_res:] == 20).all()
    assert not s["target_feat"][:, n_res:].any()
    for key in ("msa_feat", "msa_mask", "bert_mask", "extra_msa_mask", "extra_has_deletion"):
        assert not s[key][:, :, n_res:].any(), key
    assert not s["msa_feat"][:, 8:].any()  # no cluster rows beyond the MSA (8 of 11 are centres)
    assert s["extra_msa_mask"][:, :3, :n_res].all() and not s["extra_msa_mask"][:, 3:].any()
    assert s["msa_mask"][:, :8, :n_res].all() and not s["msa_mask"][:, 8:].any()
    for key in ("all_atom_mask", "atom14_gt_exists", "backbone_rigid_mask", "pseudo_beta_mask"):
        assert not s[key][:, n_res:].any(), key
    np.testing.assert_array_equal(
        s["backbone_rigid_tensor"][0, n_res:], np.broadcast_to(np.eye(4), (5, 4, 4))
    )
    # The padded sample holds exactly the unpadded features of each pass (inference: no block
    # deletion, pass r uses random stream 1 + r of the seed).
    streams = np.random.SeedSequence(seed).spawn(1 + SMALL.n_cycle)[1:]
    profile = msa_profile(raw["msa"])
    for r, ss in enumerate(streams):
        cyc = make_msa_cycle(
            raw["msa"], raw["deletion_matrix"], profile, SMALL, np.random.default_rng(ss)
        )
        np.testing.assert_allclose(s["msa_feat"][r, :8, :n_res], cyc["msa_feat"], rtol=0, atol=1e-7)
        np.testing.assert_array_equal(s["extra_msa"][r, :3, :n_res], cyc["extra_msa"])


# --------------------------------------------------------------------------------------------
# MSA block deletion, cluster sampling, BERT masking
# --------------------------------------------------------------------------------------------


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [a, b] of consecutive integers."""
    runs: list[tuple[int, int]] = []
    for i in indices.tolist():
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


@pytest.mark.parametrize("n_msa", [1, 2, 7, 100, 1001])
def test_msa_block_deletion_removes_contiguous_blocks_never_the_query(n_msa: int) -> None:
    block = int(np.floor(n_msa * 0.3))
    for seed in range(20):
        keep = msa_block_deletion(
            n_msa, np.random.default_rng(seed), fraction_per_block=0.3, num_blocks=5
        )
        assert keep[0] == 0 and np.all(np.diff(keep) > 0)
        deleted = np.setdiff1d(np.arange(n_msa), keep)
        if block == 0:
            assert deleted.size == 0
            continue
        runs = _runs(deleted)
        assert 1 <= len(runs) <= 5
        for a, b in runs:  # each run is a union of whole blocks, clipped only at the MSA end
            assert a >= 1 and (b - a + 1 >= block or b == n_msa - 1)
        assert deleted.size <= 5 * block


def test_sample_applies_block_deletion_only_in_training() -> None:
    raw = synthetic_raw(20, n_msa=30, seed=4)
    preset = replace(SMALL, n_clust=40, n_extra=0)  # every surviving row becomes a centre
    train = make_sample(raw, preset, seed=2, training=True)
    infer = make_sample(raw, preset, seed=2, training=False)
    assert infer["msa_mask"][0, :, 0].sum() == 30
    n_kept = int(train["msa_mask"][0, :, 0].sum())
    assert n_kept < 30
    rows = {tuple(r) for r in raw["msa"].tolist()}
    assert all(tuple(r) in rows for r in train["true_msa"][0, :n_kept, :20].tolist())


def test_query_is_always_first_centre() -> None:
    raw = synthetic_raw(45, n_msa=200, seed=8)
    for seed in range(5):
        s = make_sample(raw, "tiny", seed=seed, crop_start=0)
        for r in range(s["true_msa"].shape[0]):
            np.testing.assert_array_equal(s["true_msa"][r, 0, :45], raw["aatype"])
            unmasked = s["bert_mask"][r, 0, :45] == 0
            onehot = s["msa_feat"][r, 0, :45, :23].argmax(-1)
            np.testing.assert_array_equal(onehot[unmasked], raw["aatype"][unmasked])


def test_bert_mask_statistics() -> None:
    rng = np.random.default_rng(0)
    msa = rng.integers(0, 22, size=(400, 300))
    profile = msa_profile(msa)
    bert, mask = masked_msa(
        msa, profile, rng, replace_fraction=0.15, uniform_prob=0.1, profile_prob=0.1, same_prob=0.1
    )
    n = msa.size
    assert abs(mask.mean() - 0.15) < 4 * np.sqrt(0.15 * 0.85 / n)
    assert np.array_equal(bert[mask == 0], msa[mask == 0])
    chosen = bert[mask == 1]
    m = chosen.size
    frac_mask = (chosen == MASK_TOKEN).mean()
    assert abs(frac_mask - 0.7) < 4 * np.sqrt(0.21 / m)
    assert bert.max() == MASK_TOKEN and bert.min() == 0
    # Unchanged + uniform + profile draws: 30% of the chosen positions are not the mask token;
    # the same-token rate is 10% + what the uniform (1/20 per aa) and profile draws hit.
    same = (chosen == msa[mask == 1]).mean()
    p_same = (
        0.1
        + 0.1 * np.mean(msa[mask == 1] < 20) / 20
        + 0.1 * np.mean(profile[np.nonzero(mask)[1], msa[mask == 1]])
    )
    assert abs(same - p_same) < 4 * np.sqrt(p_same * (1 - p_same) / m)


def test_bert_mask_fraction_in_sample() -> None:
    raw = synthetic_raw(64, n_msa=400, seed=1)
    s = make_sample(raw, "tiny", seed=3)
    real = s["msa_mask"] == 1
    frac = s["bert_mask"][real].mean()
    assert abs(frac - 0.15) < 4 * np.sqrt(0.15 * 0.85 / real.sum())
    assert not s["bert_mask"][~real].any()


# --------------------------------------------------------------------------------------------
# Clustering and msa_feat
# --------------------------------------------------------------------------------------------


def test_extra_sequences_assigned_to_nearest_centre() -> None:
    rng = np.random.default_rng(3)
    for n_c, n_e, n_res in [(5, 40, 13), (1, 3, 7), (9, 2100, 11)]:  # 2100 > one chunk
        centres = rng.integers(0, 23, size=(n_c, n_res))  # includes gaps (21) and masks (22)
        centres[:, : n_res // 2] = rng.integers(0, 3, size=(n_c, n_res // 2))  # force ties
        extra = rng.integers(0, 22, size=(n_e, n_res))
        got = assign_extra_to_clusters(centres, extra)
        for e in range(n_e):
            agree = [
                sum(int(extra[e, i] == centres[c, i] and centres[c, i] <= 20) for i in range(n_res))
                for c in range(n_c)
            ]
            assert got[e] == int(np.argmax(agree)), (e, agree)  # first maximum on ties
    all_gap = np.full((3, 5), GAP)
    assert assign_extra_to_clusters(all_gap, rng.integers(0, 22, (4, 5))).tolist() == [0] * 4


def test_cluster_profile_brute_force() -> None:
    rng = np.random.default_rng(4)
    centres = rng.integers(0, 23, size=(4, 9))
    extra = rng.integers(0, 22, size=(17, 9))
    c_del = rng.integers(0, 5, size=(4, 9)).astype(float)
    e_del = rng.integers(0, 5, size=(17, 9)).astype(float)
    assignment = assign_extra_to_clusters(centres, extra)
    profile, del_mean = summarize_clusters(centres, c_del, extra, e_del, assignment)
    for c in range(4):
        members = [centres[c]] + [extra[e] for e in range(17) if assignment[e] == c]
        dels = [c_del[c]] + [e_del[e] for e in range(17) if assignment[e] == c]
        for i in range(9):
            counts = np.bincount([m[i] for m in members], minlength=23)
            np.testing.assert_allclose(profile[c, i], counts / len(members), rtol=1e-12)
            np.testing.assert_allclose(del_mean[c, i], np.mean([d[i] for d in dels]), rtol=1e-12)


def test_msa_feat_channel_semantics() -> None:
    raw = synthetic_raw(29, n_msa=70, seed=6)
    preset = replace(SMALL, n_res=29, n_clust=10, n_extra=20)
    rng = np.random.default_rng(1)
    cyc = make_msa_cycle(raw["msa"], raw["deletion_matrix"], msa_profile(raw["msa"]), preset, rng)
    feat = cyc["msa_feat"]
    assert feat.shape == (10, 29, 49) and np.isfinite(feat).all()
    onehot = feat[..., :23]
    assert np.all((onehot == 0) | (onehot == 1))
    np.testing.assert_array_equal(onehot.sum(-1), 1.0)
    np.testing.assert_allclose(feat[..., 25:48].sum(-1), 1.0, rtol=0, atol=1e-6)
    bert_msa = onehot.argmax(-1)
    masked = bert_msa == MASK_TOKEN
    assert masked.any() and not (cyc["bert_mask"][masked] == 0).any()
    np.testing.assert_array_equal(
        bert_msa[cyc["bert_mask"] == 0], cyc["true_msa"][cyc["bert_mask"] == 0]
    )
    d = raw["deletion_matrix"][cyc["centre_index"]].astype(np.float64)
    np.testing.assert_array_equal(feat[..., 23], (d > 0).astype(np.float32))
    np.testing.assert_allclose(feat[..., 24], 2 / np.pi * np.arctan(d / 3), rtol=1e-6)
    # Deletion mean channel: transformed mean over the cluster members.
    rest = cyc["rest_index"]
    for c in (0, 3, 9):
        members = np.concatenate(
            [[cyc["centre_index"][c]], rest[cyc["extra_cluster_assignment"] == c]]
        )
        mean = raw["deletion_matrix"][members].astype(np.float64).mean(0)
        np.testing.assert_allclose(feat[c, :, 48], deletion_value(mean), rtol=1e-6)
    # The extra MSA stack is a subset of the non-centre rows; the profiles used all of them.
    assert cyc["extra_msa"].shape == (20, 29) and cyc["extra_cluster_assignment"].shape == (60,)
    np.testing.assert_array_equal(cyc["extra_msa"], raw["msa"][rest[:20]])


def test_deletion_value_transform() -> None:
    d = np.array([0.0, 1.0, 3.0, 30.0, 1e8])
    np.testing.assert_allclose(
        deletion_value(d),
        [0, 2 / np.pi * np.arctan(1 / 3), 0.5, 2 / np.pi * np.arctan(10), 1],
        atol=1e-6,
    )


def test_extra_msa_features() -> None:
    raw = synthetic_raw(33, n_msa=80, seed=12)
    s = make_sample(raw, replace(SMALL, n_res=40, n_extra=100), seed=5, training=False)
    rows = {tuple(r) for r in raw["msa"][1:].tolist()}
    n_e = int(s["extra_msa_mask"][0, :, 0].sum())
    assert n_e == 80 - 8
    assert all(tuple(r) in rows for r in s["extra_msa"][0, :n_e, :33].tolist())
    d = s["extra_deletion_value"][0, :n_e, :33]
    assert np.all((d >= 0) & (d < 1)) and d.max() > 0
    np.testing.assert_array_equal(s["extra_has_deletion"][0, :n_e, :33], (d > 0).astype(np.float32))
    assert s["extra_msa"].max() <= GAP


def test_target_feat() -> None:
    raw = synthetic_raw(17, n_msa=3, seed=0)
    s = make_sample(raw, SMALL, seed=0, training=False)
    tf = s["target_feat"][0]
    assert not tf[:, 0].any()  # between-segment bit: one chain
    np.testing.assert_array_equal(tf[:17, 1:].argmax(-1), raw["aatype"])
    np.testing.assert_array_equal(tf[:17].sum(-1), 1.0)


# --------------------------------------------------------------------------------------------
# Templates, clamped FAPE, errors
# --------------------------------------------------------------------------------------------


def test_template_selection_and_features() -> None:
    raw = synthetic_raw(40, n_msa=5, n_templ=5, seed=2)
    # Residues 2-3 (the one before the crop and the first cropped one) fully resolved alanines.
    raw["template_aatype"][:, 2:4] = 0
    raw["template_all_atom_mask"][:, 2:4] = 1.0
    raw["template_all_atom_positions"][:, 2:4] = np.random.default_rng(0).normal(size=(5, 2, 37, 3))
    s = make_sample(raw, SMALL, seed=0, training=False, crop_start=3)
    np.testing.assert_array_equal(s["template_mask"][0], [1, 1])  # inference: the top 2 hits
    np.testing.assert_array_equal(s["template_aatype"][0], raw["template_aatype"][:2, 3:27])
    np.testing.assert_array_equal(
        s["template_all_atom_positions"][1], raw["template_all_atom_positions"][:2, 3:27]
    )
    # Torsions and pseudo-beta of the window equal those of the whole chain, cropped: the first
    # cropped residue keeps its omega/phi (computed from its real predecessor).
    for t in range(2):
        aatype = np.minimum(raw["template_aatype"][t], 20)
        pos, mask = raw["template_all_atom_positions"][t], raw["template_all_atom_mask"][t]
        sin_cos, alt, tmask = atom37_to_torsion_angles(aatype, pos, mask)
        pb, pb_mask = make_pseudo_beta(aatype, pos, mask)
        np.testing.assert_allclose(
            s["template_torsion_angles_sin_cos"][0, t], sin_cos[3:27], atol=1e-6
        )
        np.testing.assert_allclose(
            s["template_alt_torsion_angles_sin_cos"][1, t], alt[3:27], atol=1e-6
        )
        np.testing.assert_array_equal(s["template_torsion_angles_mask"][0, t], tmask[3:27])
        np.testing.assert_array_equal(s["template_pseudo_beta"][1, t], pb[3:27])
        np.testing.assert_array_equal(s["template_pseudo_beta_mask"][0, t], pb_mask[3:27])
    assert s["template_torsion_angles_mask"][0, :, 0, :2].any()  # omega/phi of the first residue
    gaps = s["template_aatype"][0] == GAP
    assert not s["template_pseudo_beta_mask"][0][gaps].any()
    assert not s["template_torsion_angles_mask"][0][gaps].any()
    counts = set()
    for seed in range(30):  # training: a random number in [0, min(hits, N_templ)]
        t = make_sample(raw, SMALL, seed=seed)
        m = t["template_mask"][0]
        k = int(m.sum())
        counts.add(k)
        assert np.array_equal(m, [1.0] * k + [0.0] * (2 - k))
        assert not t["template_all_atom_mask"][:, k:].any()
    assert counts == {0, 1, 2}


def test_use_clamped_fape_fraction() -> None:
    raw = synthetic_raw(10, n_msa=2, seed=0)
    preset = replace(SMALL, max_recycling_iters=0)
    vals = [make_sample(raw, preset, seed=s)["use_clamped_fape"][0] for s in range(300)]
    assert set(vals) <= {0.0, 1.0}
    assert abs(np.mean(vals) - 0.9) < 4 * np.sqrt(0.09 / 300)
    assert make_sample(raw, preset, seed=1, training=False)["use_clamped_fape"][0] == 1.0


def test_bad_inputs() -> None:
    raw = synthetic_raw(10, n_msa=2, seed=0)
    with pytest.raises(ValueError, match="unknown AF2 data preset"):
        make_sample(raw, "nope", seed=0)
    broken = dict(raw)
    del broken["msa"]
    with pytest.raises(SchemaError, match="msa"):
        make_sample(broken, SMALL, seed=0)
    broken = dict(raw, msa=raw["msa"] + 5)
    with pytest.raises(ValueError, match="msa values"):
        make_sample(broken, SMALL, seed=0)
    with pytest.raises(ValueError, match="n_res"):
        DataPreset("bad", n_res=0, n_clust=1, n_extra=0, n_templ=0)


def test_presets() -> None:
    assert get_preset("af2_initial") is PRESETS["af2_initial"]
    p = PRESETS["af2_initial"]
    assert (p.n_res, p.n_clust, p.n_extra, p.n_templ, p.n_cycle) == (256, 128, 1024, 4, 4)
    p = PRESETS["af2_finetune"]
    assert (p.n_res, p.n_clust, p.n_extra, p.n_templ, p.n_cycle) == (384, 512, 5120, 4, 4)
    p = PRESETS["tiny"]
    assert (p.n_res, p.n_clust, p.n_extra, p.n_templ, p.n_cycle) == (64, 16, 32, 2, 3)
