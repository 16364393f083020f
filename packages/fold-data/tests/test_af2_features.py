"""Raw AF2 features from the bundled real data (data/demo), and the samples made from them."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.af2 import (
    RAW_FEATURES,
    SAMPLE_FEATURES,
    make_features,
    make_features_from_sequence,
    make_sample,
)
from fold_data.errors import InputError, InputWarning
from fold_data.mmcif import parse_mmcif
from fold_data.schema import validate

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
pytestmark = pytest.mark.skipif(not DEMO.is_dir(), reason="bundled demo data not found")


def _alignments(chain: str) -> list[Path]:
    d = DEMO / "alignments" / chain
    return [d / "uniref90_hits.sto", d / "bfd_uniclust_hits.a3m", d / "mgnify_hits.sto"]


@pytest.fixture(scope="module")
def feats_3u8v() -> dict[str, np.ndarray]:
    return make_features(DEMO / "mmcifs" / "3u8v.cif", "A", _alignments("3u8v_A"))


@pytest.fixture(scope="module")
def feats_monomer() -> dict[str, np.ndarray]:
    d = DEMO / "monomer"
    sequence = (d / "short.fasta").read_text().split("\n", 1)[1].replace("\n", "")
    with warnings.catch_warnings():  # hits whose mmCIF is not bundled are skipped with a warning
        warnings.simplefilter("ignore", InputWarning)
        return make_features_from_sequence(
            sequence,
            [d / "bfd_uniclust_hits.a3m", d / "uniref90_hits.sto", d / "mgnify_hits.sto"],
            d / "pdb70_hits.hhr",
            template_mmcif_dir=DEMO / "mmcifs",
        )


def test_make_features_real_chain(feats_3u8v: dict[str, np.ndarray]) -> None:
    f = feats_3u8v
    sizes = validate(f, RAW_FEATURES, allow_extra=False)
    structure = parse_mmcif(DEMO / "mmcifs" / "3u8v.cif")
    chain = structure.get_chain("A")
    n = len(chain.sequence)
    assert sizes["N_res"] == n and int(f["seq_length"]) == n
    assert f["sequence"].item().decode() == chain.sequence
    np.testing.assert_array_equal(f["aatype"], rc.sequence_to_aatype(chain.sequence))
    np.testing.assert_array_equal(f["residue_index"], np.arange(n))
    assert f["resolution"] == np.float32(structure.resolution) and structure.resolution > 0
    # MSA: the merged, deduplicated alignments with the query first.
    assert sizes["N_msa"] > 100 and sizes["N_templ"] == 0
    np.testing.assert_array_equal(f["msa"][0], f["aatype"])
    assert len({r.tobytes() for r in f["msa"]}) == sizes["N_msa"]
    assert f["msa"].min() >= 0 and f["msa"].max() <= 21 and (f["msa"] == 21).any()
    assert (f["deletion_matrix"] >= 0).all() and f["deletion_matrix"].max() > 0
    assert not f["deletion_matrix"][0].any()
    # Ground truth from the structure: modelled residues have backbone atoms and frames.
    ca = rc.atom_order["CA"]
    np.testing.assert_array_equal(f["all_atom_mask"][:, ca], chain.atom37_mask[:, ca])
    np.testing.assert_allclose(
        f["all_atom_positions"][:, ca], chain.atom37_positions[:, ca], atol=1e-5
    )
    assert f["backbone_rigid_mask"].sum() > 0.8 * chain.modelled.sum()
    assert f["pseudo_beta_mask"].sum() > 0


def test_msa_options(feats_3u8v: dict[str, np.ndarray]) -> None:
    cif = DEMO / "mmcifs" / "3u8v.cif"
    single = make_features(cif, "A")
    assert single["msa"].shape == (1, feats_3u8v["aatype"].size)
    np.testing.assert_array_equal(single["msa"][0], single["aatype"])
    assert not single["deletion_matrix"].any()
    capped = make_features(cif, "A", _alignments("3u8v_A"), max_msa_sequences=50)
    np.testing.assert_array_equal(capped["msa"], feats_3u8v["msa"][:50])
    # The a3m alone is a subset of the merged MSA.
    a3m = make_features(cif, "A", [DEMO / "alignments" / "3u8v_A" / "bfd_uniclust_hits.a3m"])
    merged = {r.tobytes() for r in feats_3u8v["msa"]}
    assert all(r.tobytes() in merged for r in a3m["msa"])


def test_bad_inputs_name_the_file() -> None:
    cif = DEMO / "mmcifs" / "3u8v.cif"
    wrong = DEMO / "alignments" / "4zey_A" / "bfd_uniclust_hits.a3m"
    with pytest.raises(InputError, match="4zey_A/bfd_uniclust_hits.a3m") as err:
        make_features(cif, "A", [wrong])
    assert err.value.record == "query"
    fasta = DEMO / "monomer" / "short.fasta"
    with pytest.raises(InputError, match=r"short\.fasta.*expected \.a3m or \.sto"):
        make_features(cif, "A", [fasta])
    with pytest.raises(InputError, match=r"short\.fasta.*expected \.hhr or \.sto"):
        make_features(cif, "A", template_hits=fasta, template_mmcif_dir=DEMO / "mmcifs")
    with pytest.raises(InputError, match="chain Q"):
        make_features(cif, "Q")
    with pytest.raises(ValueError, match="template_mmcif_dir"):
        make_features_from_sequence("MKV" * 30, template_hits=DEMO / "monomer" / "pdb70_hits.hhr")
    with pytest.raises(InputError, match="query sequence"):
        make_features_from_sequence("MKV1")


def test_nmr_structure_has_zero_resolution() -> None:
    f = make_features(DEMO / "mmcifs" / "1psm.cif", "A", _alignments("1psm_A"))
    validate(f, RAW_FEATURES)
    assert f["resolution"] == 0.0 and f["all_atom_mask"].sum() > 0


def test_features_from_sequence_with_templates(feats_monomer: dict[str, np.ndarray]) -> None:
    f = feats_monomer
    sizes = validate(f, RAW_FEATURES, allow_extra=False)
    assert sizes["N_res"] == 73 and 1 <= sizes["N_templ"] <= 4
    assert all(
        n.decode()[:4] in {"3u8v", "4zey", "1psm", "3zee", "2q2k", "4i6p"}
        for n in f["template_domain_names"]
    )
    assert f["template_all_atom_mask"].sum() > 0
    # No structure: ground truth zero with zero masks; residue-type tables are still filled.
    for name in (
        "all_atom_mask",
        "atom14_gt_exists",
        "backbone_rigid_mask",
        "chi_mask",
        "pseudo_beta_mask",
        "rigidgroups_gt_exists",
    ):
        assert not f[name].any(), name
    assert not f["all_atom_positions"].any() and f["resolution"] == 0
    np.testing.assert_array_equal(f["atom14_atom_exists"], rc.restype_atom14_mask[f["aatype"]])


def test_sample_from_real_features(
    feats_monomer: dict[str, np.ndarray], feats_3u8v: dict[str, np.ndarray]
) -> None:
    s = make_sample(feats_monomer, "tiny", seed=0, training=False)
    n_t = min(feats_monomer["template_aatype"].shape[0], 2)
    validate(s, SAMPLE_FEATURES, sizes={"R": 3, "N_res": 73, "N_templ": 2}, allow_extra=False)
    np.testing.assert_array_equal(s["template_mask"][0], [1.0] * n_t + [0.0] * (2 - n_t))
    # Real template geometry: resolved residues get pseudo-beta and backbone torsions.
    real = s["template_all_atom_mask"][0, :n_t, :, rc.atom_order["CA"]] > 0
    assert real.any()
    assert s["template_pseudo_beta_mask"][0, :n_t][real].mean() > 0.9
    psi_mask = s["template_torsion_angles_mask"][0, :n_t, :, 2]
    assert psi_mask[real].mean() > 0.8
    sc = s["template_torsion_angles_sin_cos"][0, :n_t][psi_mask > 0]
    np.testing.assert_allclose(np.linalg.norm(sc[:, 2], axis=-1), 1.0, atol=1e-5)

    t = make_sample(feats_3u8v, "af2_initial", seed=1)
    validate(t, SAMPLE_FEATURES, sizes={"R": 4, "N_res": 256, "N_clust": 128}, allow_extra=False)
    n = feats_3u8v["aatype"].size
    np.testing.assert_array_equal(t["aatype"][0, :n], feats_3u8v["aatype"])
    np.testing.assert_array_equal(t["all_atom_positions"][3, :n], feats_3u8v["all_atom_positions"])
    assert t["msa_mask"][0, :, 0].sum() == 128 and t["extra_msa_mask"][0, :, 0].sum() > 0
