"""CCD reading, RDKit molecules and reference conformers (single-entry CCD files; no biotite)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fold_data.af3.ccd import Ccd, read_ccd_cif
from fold_data.af3.conformers import (
    SOURCE_CCD_IDEAL,
    SOURCE_CCD_MODEL,
    SOURCE_NONE,
    SOURCE_RDKIT,
    ccd_conformer,
    clear_conformer_memo,
    embed_conformer,
)
from fold_data.af3.molecules import mol_from_ccd, mol_from_smiles
from fold_data.errors import InputError


@pytest.fixture(scope="module")
def ccd(ccd_dir) -> Ccd:
    return Ccd([ccd_dir], use_biotite=False)


def _bond_lengths(conf) -> np.ndarray:
    b = np.asarray([(i, j) for i, j, _ in conf.bonds])
    return np.linalg.norm(conf.positions[b[:, 0]] - conf.positions[b[:, 1]], axis=-1)


def _ideal_lengths(conf, comp) -> np.ndarray:
    idx = [comp.atom_names.index(n) for n in conf.atom_names]
    ideal = comp.ideal_positions[idx]
    b = np.asarray([(i, j) for i, j, _ in conf.bonds])
    return np.linalg.norm(ideal[b[:, 0]] - ideal[b[:, 1]], axis=-1)


def test_single_entry_files(ccd):
    tyr = ccd.get("tyr")
    assert tyr.num_atoms == 24 and tyr.bonds.shape == (24, 2)
    assert {n for n, f in zip(tyr.atom_names, tyr.leaving) if f} == {"OXT", "HXT", "H2"}
    assert tyr.type == "L-PEPTIDE LINKING"
    assert ccd.get("03F").num_atoms == 130 and len(ccd.get("03F").bonds) == 130
    assert ccd.get("CYN").charges.tolist() == [-1, 0]
    assert ccd.get("HWB").charges.sum() == 1


def test_molecules_charges_aromaticity_and_leaving_atoms(ccd):
    tyr = mol_from_ccd(ccd.get("TYR"), frozenset({"OXT"}))
    assert tyr.sanitized
    assert "OXT" not in tyr.atom_names and len(tyr.atom_names) == 12
    assert tyr.mol.GetNumAtoms() == 24 - 2  # OXT and its HXT gone
    ring = [tyr.mol.GetAtomWithIdx(a).GetIsAromatic() for a in tyr.heavy_atoms]
    assert sum(ring) == 6  # the phenol ring
    hwb = mol_from_ccd(ccd.get("HWB"))
    assert hwb.charges.sum() == 1 and hwb.elements.tolist().count(8) == 6
    cyn = mol_from_ccd(ccd.get("CYN"))
    assert cyn.charges.tolist() == [-1, 0] and cyn.elements.tolist() == [6, 7]


@pytest.mark.parametrize("code", ["TYR", "03F", "HWB", "CYN"])
def test_conformer_bond_lengths_match_ccd_ideal(ccd, code):
    comp = ccd.get(code)
    conf = ccd_conformer(comp, seed=0, max_attempts=50)
    assert conf.source == SOURCE_RDKIT and conf.mask.all()
    assert np.isfinite(conf.positions).all()
    got, ideal = _bond_lengths(conf), _ideal_lengths(conf, comp)
    assert got.min() > 1.0 and got.max() < 1.9
    # ETKDG bond lengths vs the CCD's ideal geometry: the same chemistry. Distance geometry
    # without force-field refinement is off by up to ~0.13 A on single bonds, 0.03 typically.
    assert np.abs(got - ideal).max() < 0.15 and np.median(np.abs(got - ideal)) < 0.05


def test_conformers_are_seeded(ccd):
    comp = ccd.get("03F")
    clear_conformer_memo()
    a = ccd_conformer(comp, seed=3, max_attempts=50).positions
    clear_conformer_memo()
    b = ccd_conformer(comp, seed=3, max_attempts=50).positions
    c = ccd_conformer(comp, seed=4, max_attempts=50).positions
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.1


def test_fallback_to_ccd_coordinates(ccd):
    cyn = ccd.get("CYN")
    # A neutral nitrogen with a quadruple bond does not sanitize: no RDKit conformer.
    broken = dataclasses.replace(cyn, bond_orders=np.array([4], np.int32),
                                 charges=np.zeros(2, np.int32), code="XCN")
    conf = embed_conformer(mol_from_ccd(broken), seed=0)
    assert conf.source == SOURCE_CCD_IDEAL and conf.mask.all()
    ideal = cyn.ideal_positions - cyn.ideal_positions.mean(0)
    np.testing.assert_allclose(conf.positions, ideal, atol=1e-5)
    no_ideal = dataclasses.replace(broken, ideal_positions=np.full((2, 3), np.nan))
    assert embed_conformer(mol_from_ccd(no_ideal), 0).source == SOURCE_CCD_MODEL
    nothing = dataclasses.replace(no_ideal, model_positions=np.full((2, 3), np.nan))
    conf = embed_conformer(mol_from_ccd(nothing), 0)
    assert conf.source == SOURCE_NONE and not conf.mask.any()


def test_smiles_molecule_and_conformer():
    mol = mol_from_smiles("OC(=O)CCCC[C@@H]1SC[C@@H]2NC(=O)N[C@H]12")  # biotin
    assert len(mol.atom_names) == 16 and mol.atom_names[:3] == ("O1", "C1", "O2")
    conf = embed_conformer(mol, seed=0, max_attempts=50)
    assert conf.source == SOURCE_RDKIT
    d = _bond_lengths(conf)
    assert d.min() > 1.1 and d.max() < 1.9


@pytest.mark.parametrize("smiles, why", [("C1CC", "cannot parse"),
                                         ("C(C)(C)(C)(C)C", "cannot sanitize"), ("", "non-empty")])
def test_bad_smiles(smiles, why):
    with pytest.raises(InputError, match=why) as err:
        mol_from_smiles(smiles, path="job.json", record="sequences[1] ligand B")
    assert "sequences[1] ligand B" in str(err.value) and "'smiles'" in str(err.value)


def test_unknown_code_and_bad_file(ccd, tmp_path):
    assert ccd.get("ZZZZ") is None
    with pytest.raises(InputError, match="unknown CCD code 'ZZZZ'") as err:
        ccd.require("ZZZZ", "job.json", "sequences[1] ligand B", "ccdCodes[0]")
    assert "ccdCodes[0]" in str(err.value)
    bad = tmp_path / "bad.cif"
    bad.write_text("data_X\n_chem_comp.id X\n")
    with pytest.raises(InputError, match="_chem_comp_atom"):
        read_ccd_cif(bad)


def test_full_ccd_index(full_ccd):
    mov = full_ccd.get("MOV")
    assert mov.type == "NON-POLYMER" and mov.num_atoms == 73
    assert full_ccd.get("5CM").parent == "DC" and full_ccd.get("MSE").parent == "MET"
    nag = full_ccd.get("NAG")
    assert {n for n, f in zip(nag.atom_names, nag.leaving) if f and n[0] != "H"} == {"O1"}
    # The index slices the right rows: every bond names atoms of the same component.
    assert mov.bonds.max() < mov.num_atoms and len(mov.bonds) == 77
