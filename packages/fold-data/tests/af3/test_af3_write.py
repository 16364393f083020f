"""mmCIF output of AF3 predictions (fold_data.af3.write): every chain, ligands as HETATM named
by their CCD code (LIG for SMILES), atom names decoded from ref_atom_name_chars, pLDDT clipped
into the B-factor column."""

from __future__ import annotations

from pathlib import Path

import gemmi
import numpy as np
import pytest
from fold_data.af3 import Ccd, load_entry, make_features
from fold_data.af3.tokenizer import atom_name_from_chars
from fold_data.af3.write import SMILES_LIGAND_NAME, AF3Prediction, af3_prediction_to_structure
from fold_data.write import write_mmcif

AF3_DEMO = Path(__file__).resolve().parents[4] / "data" / "demo" / "af3"


def _predicted(name: str):
    """The entry, its raw features and a 'prediction' at its reference conformer positions
    with a pLDDT ramp that runs past 0-100 (the writer clips it)."""
    if not AF3_DEMO.is_dir():
        pytest.skip("bundled AF3 demo data not found")
    ccd = Ccd([AF3_DEMO / "ccd.cif"])
    entry = load_entry(AF3_DEMO / "inputs" / name, ccd=ccd)
    raw = make_features(entry, ccd=ccd)
    n_atom = len(raw["atom_to_token"])
    pred = AF3Prediction(positions=raw["ref_pos"].astype(np.float64),
                         plddt=np.linspace(-10.0, 110.0, n_atom), sample_plddt=np.zeros(1))
    return entry, raw, pred


def test_protein_and_ccd_ligand_read_back(tmp_path):
    entry, raw, pred = _predicted("fkbp51_fk506.json")
    path = write_mmcif(af3_prediction_to_structure(pred, raw, entry), tmp_path / "x.cif")
    st = gemmi.read_structure(str(path))
    assert [c.name for c in st[0]] == [c.chain_id for c in entry.chains]
    protein, ligand = entry.chains
    assert [r.name for r in st[0][protein.chain_id]] == list(protein.residues)
    assert [r.name for r in st[0][ligand.chain_id]] == ["FK5"]
    assert all(r.het_flag == "H" for r in st[0][ligand.chain_id])
    atoms = [a for res in st[0][protein.chain_id] for a in res]
    atoms += [a for res in st[0][ligand.chain_id] for a in res]
    names = [atom_name_from_chars(c) for c in raw["ref_atom_name_chars"]]
    assert [a.name for a in atoms] == names
    b = np.array([a.b_iso for a in atoms])
    np.testing.assert_allclose(b, np.clip(pred.plddt, 0.0, 100.0), atol=0.01)
    pos = np.array([a.pos.tolist() for a in atoms])
    np.testing.assert_allclose(pos, pred.positions, atol=1e-3)


def test_smiles_ligand_is_named_lig(tmp_path):
    entry, raw, pred = _predicted("streptavidin_biotin_smiles.json")
    st = af3_prediction_to_structure(pred, raw, entry)
    ligand = [c for c in entry.chains if c.smiles is not None][0]
    assert [r.name for r in st[0][ligand.chain_id]] == [SMILES_LIGAND_NAME]


def test_prediction_of_another_size_is_refused():
    entry, raw, pred = _predicted("fkbp51_fk506.json")
    short = AF3Prediction(pred.positions[:-1], pred.plddt[:-1], pred.sample_plddt)
    with pytest.raises(ValueError, match="positions"):
        af3_prediction_to_structure(short, raw, entry)
