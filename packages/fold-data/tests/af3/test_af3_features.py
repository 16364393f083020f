"""AF3 raw features on the real examples: tokens, atoms, bonds, conformers, MSA, schema."""

from __future__ import annotations

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.af3 import RAW_FEATURES
from fold_data.af3.tokenizer import GAP
from fold_data.schema import validate


def _protein_atoms(sequence: str) -> int:
    """Heavy atoms of a protein chain: each residue's atoms, plus OXT on the last one."""
    return sum(len(rc.residue_atoms[rc.restype_1to3[a]]) for a in sequence) + 1


# (file, tokens, atoms) computed independently of the tokenizer: standard residues one token,
# ligand / modified-residue heavy atoms one token each (leaving atoms of bonded atoms removed).
def test_token_and_atom_counts(raw_features, jsons, full_ccd):
    from fold_data.af3.parse import parse_af3_json

    strept = raw_features("streptavidin_biotin_smiles.json")
    seq = parse_af3_json(jsons / "streptavidin_biotin_smiles.json").chains[0].sequence
    assert len(strept["restype"]) == 126 + 16  # biotin: 16 heavy atoms
    assert len(strept["ref_pos"]) == _protein_atoms(seq) + 16

    kras = raw_features("kras_g12c_sotorasib.json")
    assert len(kras["restype"]) == 189 + 41  # MOV: 41 heavy atoms, one token each
    # Methylated DNA: 32 standard nucleotides + 8 x 5CM with OP3 removed (20 heavy atoms).
    assert len(raw_features("methylated_dna.json")["restype"]) == 32 + 8 * 20
    # Glycan: NAG, NAG (15 heavy - O1), BMA, MAN, MAN (12 - O1) bonded at C1.
    assert len(raw_features("rnaseb_glycosylated.json")["restype"]) == 124 + 14 * 2 + 11 * 3
    tetr = raw_features("tetr_dimer_dna.json")
    assert len(tetr["restype"]) == 2 * 218 + 40
    assert tetr["entity_id"].tolist().count(0) == 436 and set(tetr["sym_id"][:436]) == {0, 1}
    assert set(tetr["restype"][436:]) <= {26, 27, 28, 29}
    assert tetr["is_atomized"].sum() == 0


def test_covalent_ligand_bond(raw_features, full_ccd):
    kras = raw_features("kras_g12c_sotorasib.json")
    ligand = np.flatnonzero(kras["is_ligand"])
    cys = np.flatnonzero((kras["asym_id"] == 0) & (kras["residue_index"] == 11))
    assert kras["restype"][cys].tolist() == [rc.restype_order["C"]]
    pairs = {tuple(p) for p in kras["token_bonds"].tolist()}
    linked = [p for p in pairs if cys[0] in p]
    assert len(linked) == 1 and (set(linked[0]) - {cys[0]}) <= set(ligand.tolist())
    # Inside the ligand the token bonds are MOV's heavy-atom bonds (one H per H-bond: 73 - 41).
    mov = full_ccd.get("MOV")
    heavy_bonds = sum(not (mov.is_hydrogen[i] or mov.is_hydrogen[j]) for i, j in mov.bonds)
    intra = [p for p in pairs if p[0] in ligand and p[1] in ligand]
    assert len(intra) == heavy_bonds == 77 - 32


def test_glycan_bonds_and_leaving_atoms(raw_features):
    f = raw_features("1igy.cif")
    names = ["".join(chr(c + 32) for c in row).strip() for row in f["ref_atom_name_chars"]]
    glycan = np.flatnonzero(f["is_ligand"][f["atom_to_token"]])
    assert len(np.unique(f["asym_id"][f["atom_to_token"][glycan]])) == 2
    # The N-linked NAGs lost O1; every other glycan residue bonded at C1 too.
    bonds = f["atom_bonds"]
    a2t, asym = f["atom_to_token"], f["asym_id"]
    cross = bonds[asym[a2t[bonds[:, 0]]] != asym[a2t[bonds[:, 1]]]]
    assert {frozenset((names[i], names[j])) for i, j in cross} == {frozenset(("ND2", "C1"))}
    assert len(cross) == 2
    # Bonded atoms in the structure are at bonding distance (struct_conn respected).
    pos = f["atom_positions"]
    d = np.linalg.norm(pos[cross[:, 0]] - pos[cross[:, 1]], axis=-1)
    assert (d < 1.7).all()


@pytest.mark.parametrize("name", ["1igy.cif", "4i39.cif", "3o5r.cif", "5h73.cif", "4p5j.cif"])
def test_conformers_agree_with_the_structure(raw_features, name):
    """Bond lengths of the reference conformers vs the crystal structure: same atoms, same
    chemistry. Also checks that atom names map the conformer onto the structure."""
    f = raw_features(name)
    b = f["atom_bonds"]
    uid = f["ref_space_uid"]
    same = uid[b[:, 0]] == uid[b[:, 1]]
    both = same & (f["atom_resolved"][b[:, 0]] > 0) & (f["atom_resolved"][b[:, 1]] > 0)
    ref = np.linalg.norm(f["ref_pos"][b[:, 0]] - f["ref_pos"][b[:, 1]], axis=-1)
    gt = np.linalg.norm(f["atom_positions"][b[:, 0]] - f["atom_positions"][b[:, 1]], axis=-1)
    organic = np.isin(f["ref_element"][b], [6, 7, 8, 15, 16]).all(axis=1)
    assert (ref[same & organic] > 1.1).all() and (ref[same & organic] < 1.9).all()
    diff = np.abs(ref - gt)[both]
    assert np.median(diff) < 0.05 and np.quantile(diff, 0.99) < 0.3
    assert (f["ref_pos_source"] == 0).mean() > 0.99


def test_rna_with_modified_residue_and_ions(raw_features):
    f = raw_features("4p5j.cif")
    rna = f["is_rna"].astype(bool)
    atomized_rna = rna & f["is_atomized"].astype(bool)
    assert rna.sum() - atomized_rna.sum() == 85  # 85 standard nucleotides + A23 per atom
    assert set(f["restype"][atomized_rna]) == {21}  # A23's parent is A
    assert set(f["restype"][rna & ~atomized_rna]) <= {21, 22, 23, 24}
    mg = (f["ref_element"] == 12)
    assert mg.sum() == 2 and f["is_ligand"][f["atom_to_token"][mg]].all()
    assert f["ref_charge"][mg].tolist() == [2.0, 2.0]


def test_protein_dna_with_msas(raw_features, openfold_data):
    aln = openfold_data / "alignments"
    msa = {cid: [aln / f"2q2k_{cid}" / "bfd_uniclust_hits.a3m", aln / f"2q2k_{cid}" /
                 "uniref90_hits.sto"] for cid in ("A", "B")}
    f = raw_features("2q2k.cif", msa_paths=msa)
    validate(f, RAW_FEATURES, allow_extra=False)
    dna = f["is_dna"].astype(bool)
    # 18 standard nucleotides + 2 x 5IU per atom (21 heavy atoms, OP3 leaves: 20).
    assert dna.sum() == 18 + 2 * 20
    assert f["is_protein"].sum() == 140 and f["is_ligand"].sum() == 15  # EPE
    assert f["msa"].shape[0] > 10
    # Protein columns: the MSA rows and their profile; DNA and ligand columns: gaps below row 0.
    assert (f["msa"][1:, dna] == GAP).all()
    np.testing.assert_allclose(f["profile"].sum(axis=1), 1.0, atol=1e-5)
    prot = np.flatnonzero(f["is_protein"])
    rows = f["msa"][:, prot]
    onehot = (rows[..., None] == np.arange(32)).mean(axis=0)
    np.testing.assert_allclose(f["profile"][prot], onehot, atol=1e-6)
    assert (f["msa"][0] == f["restype"]).all()


def test_schema_for_every_example(raw_features):
    for name in ("kras_g12c_sotorasib.json", "methylated_dna.json", "rnaseb_glycosylated.json",
                 "streptavidin_biotin_smiles.json", "tetr_dimer_dna.json", "1k6p.cif",
                 "5ugo.cif", "5zng.cif"):
        f = raw_features(name)
        validate(f, RAW_FEATURES, where=name, allow_extra=False)
        a2t, centre = f["atom_to_token"], f["token_center_atom"]
        assert (np.diff(a2t) >= 0).all() and a2t[-1] == len(f["restype"]) - 1
        assert (a2t[centre] == np.arange(len(centre))).all()
        assert (f["token_bonds"][:, 0] < f["token_bonds"][:, 1]).all()
