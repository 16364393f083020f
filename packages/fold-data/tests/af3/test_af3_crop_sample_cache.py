"""Cropping (whole ligands, budgets), per-step samples and the AF3 ahead-of-time cache."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from fold_data.af3 import SAMPLE_FEATURES, af3_cache, fetch_af3_features, make_sample
from fold_data.af3.crop import contiguous_crop, crop_features, crop_units, spatial_crop
from fold_data.af3.presets import AF3DataPreset
from fold_data.af3.transforms import random_rotation
from fold_data.cache import CacheWarning, FeatureCache
from fold_data.schema import validate


def _ligands_whole(raw, tokens) -> None:
    kept = np.zeros(len(raw["asym_id"]), bool)
    kept[tokens] = True
    for a in np.unique(raw["asym_id"][raw["is_ligand"] > 0]):
        chain = raw["asym_id"] == a
        assert kept[chain].all() or not kept[chain].any(), f"ligand chain {a} split"


@pytest.mark.parametrize("method", ["contiguous", "spatial", "interface"])
def test_crop_keeps_whole_ligands_within_budget(raw_features, method):
    raw = raw_features("3o5r.cif")  # FKBP51 + FK506 (57 heavy atoms, 57 tokens)
    fk5 = np.flatnonzero(raw["is_ligand"])
    with_ligand = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        if method == "contiguous":
            tokens = contiguous_crop(raw, 96, rng, max_atoms=700)
        else:
            tokens = spatial_crop(raw, 96, rng, 700, interface=method == "interface")
        assert len(tokens) <= 96 and len(np.unique(tokens)) == len(tokens)
        assert np.isin(raw["atom_to_token"], tokens).sum() <= 700
        _ligands_whole(raw, tokens)
        with_ligand += np.isin(fk5, tokens).all()
    if method == "interface":
        assert with_ligand == 8  # the interface is the ligand pocket: FK506 always in the crop
    if method == "contiguous":  # per chain one window of consecutive residues
        prot = tokens[raw["is_protein"][tokens] > 0]
        assert (np.diff(raw["residue_index"][prot]) == 1).all()


def test_crop_units_and_remapping(raw_features):
    raw = raw_features("4p5j.cif")
    units = crop_units(raw)
    a23 = np.flatnonzero((raw["is_rna"] > 0) & (raw["is_atomized"] > 0))
    assert len(np.unique(units[a23])) == 1  # the modified residue is one unit
    rng = np.random.default_rng(0)
    tokens = spatial_crop(raw, 50, rng)
    cropped = crop_features(raw, tokens)
    n = len(tokens)
    assert cropped["restype"].shape == (n,) and cropped["msa"].shape[1] == n
    a2t, centre = cropped["atom_to_token"], cropped["token_center_atom"]
    assert (a2t[centre] == np.arange(n)).all() and a2t.max() == n - 1
    np.testing.assert_array_equal(cropped["token_index"], np.sort(tokens))
    # Kept atoms keep their coordinates and every kept bond joins kept atoms.
    old = np.flatnonzero(np.isin(raw["atom_to_token"], tokens))
    np.testing.assert_array_equal(cropped["ref_pos"], raw["ref_pos"][old])
    assert cropped["atom_bonds"].max() < len(a2t)


def test_random_rotation_is_a_rotation():
    rng = np.random.default_rng(1)
    for _ in range(5):
        r = random_rotation(rng)
        np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
        assert abs(np.linalg.det(r) - 1.0) < 1e-12


def test_sample_schema_conformer_augmentation_and_determinism(raw_features):
    raw = raw_features("1k6p.cif")
    preset = AF3DataPreset("test", n_token=128, n_atom=1024, n_msa=7, n_templ=2)
    s = make_sample(raw, preset, seed=5)
    validate(s, SAMPLE_FEATURES, sizes={"N_token": 128, "N_atom": 1024, "N_msa": 7,
                                        "N_templ": 2}, allow_extra=False)
    assert all(np.isfinite(v).all() for v in s.values() if v.dtype.kind == "f")
    n_tok, n_at = int(s["token_mask"].sum()), int(s["atom_mask"].sum())
    assert 0 < n_tok <= 128 and 0 < n_at <= 1024
    assert (s["restype"][n_tok:] == 31).all() and (s["atom_mask"][n_at:] == 0).all()
    assert (s["token_bonds"] == s["token_bonds"].T).all()
    # Rotation + translation per conformer: distances inside a conformer are unchanged.
    original = raw["ref_pos"][np.isin(raw["atom_to_token"], s["token_index"][:n_tok])]
    uid = s["ref_space_uid"][:n_at]
    for u in np.unique(uid)[:20]:
        a, b = s["ref_pos"][:n_at][uid == u], original[uid == u]
        da = np.linalg.norm(a[:, None] - a[None], axis=-1)
        db = np.linalg.norm(b[:, None] - b[None], axis=-1)
        np.testing.assert_allclose(da, db, atol=1e-4)
    assert np.abs(s["ref_pos"][:n_at] - original).max() > 0.5  # and they did move
    again = make_sample(raw, preset, seed=5)
    assert all(np.array_equal(again[k], s[k]) for k in s)
    other = make_sample(raw, preset, seed=6)
    assert not np.array_equal(other["ref_pos"], s["ref_pos"])


def test_predict_preset_keeps_everything(raw_features):
    raw = raw_features("rnaseb_glycosylated.json")
    s = make_sample(raw, "af3_predict", seed=0)
    assert s["token_mask"].shape == raw["restype"].shape and s["token_mask"].all()
    np.testing.assert_array_equal(s["restype"], raw["restype"])


def test_af3_cache_roundtrip_and_isolation(tmp_path, jsons, full_ccd):
    cache = af3_cache(tmp_path)
    src = jsons / "streptavidin_biotin_smiles.json"
    first = fetch_af3_features(cache, src, ccd=full_ccd, max_conformer_attempts=50)
    second = fetch_af3_features(cache, src, ccd=full_ccd, max_conformer_attempts=50)
    assert (first.status, second.status) == ("built", "reused")
    assert set(first.features) == set(second.features)
    for k in first.features:
        np.testing.assert_array_equal(first.features[k], second.features[k])
    # AF3 entries never share a key with AF2 entries of the same file and parameters.
    af2 = FeatureCache(tmp_path)
    assert af2.version != cache.version
    assert af2.key([src], {"pipeline": "af3"}) != cache.key([src], {"pipeline": "af3"})
    # A corrupt entry is detected, deleted and rebuilt.
    data = bytearray(first.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third = fetch_af3_features(cache, src, ccd=full_ccd, max_conformer_attempts=50)
    assert third.status == "rebuilt-corrupt"
    assert any(issubclass(w.category, CacheWarning) for w in caught)
    # A changed parameter (the conformer seed) is a different entry.
    assert fetch_af3_features(cache, src, ccd=full_ccd, seed=1,
                              max_conformer_attempts=50).key != first.key
