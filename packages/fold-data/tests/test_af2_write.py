"""mmCIF output of AF2 predictions (fold_data.af2.write, fold_data.write): gemmi-readable,
pLDDT in B-factors, read back by fold_data.mmcif."""

from __future__ import annotations

from pathlib import Path

import gemmi
import numpy as np
import pytest
from fold_data.af2.write import Prediction, prediction_to_structure
from fold_data.mmcif import parse_mmcif
from fold_data.write import write_mmcif

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
TRUE = DEMO / "mmcifs" / "4zey.cif"


@pytest.fixture(scope="module")
def truth() -> Prediction:
    """4ZEY chain A's own coordinates as a 'prediction', with a made-up pLDDT profile."""
    if not TRUE.exists():
        pytest.skip("bundled demo data not found")
    chain = parse_mmcif(TRUE).get_chain("A")
    n = chain.num_res
    return Prediction(aatype=chain.aatype.astype(np.int64),
                      positions=chain.atom37_positions.astype(np.float32),
                      atom_mask=chain.atom37_mask.astype(np.float32),
                      plddt=np.linspace(20.0, 95.0, n).astype(np.float32))


def test_written_mmcif_reads_back_with_plddt_in_b_factors(truth, tmp_path):
    path = write_mmcif(prediction_to_structure(truth, "4zey_A"), tmp_path / "4zey_A.cif")
    st = gemmi.read_structure(str(path))
    residues = list(st[0]["A"])
    resolved = np.nonzero(truth.atom_mask.sum(-1) > 0)[0]
    assert len(residues) == len(resolved)
    for res, i in zip(residues, resolved):
        assert res.seqid.num == i + 1
        assert len(res) == int(truth.atom_mask[i].sum())
        for atom in res:
            assert atom.b_iso == pytest.approx(float(truth.plddt[i]), abs=0.01)
    back = parse_mmcif(path).get_chain("A")
    assert back.sequence == truth.sequence
    np.testing.assert_allclose(back.atom37_positions[truth.atom_mask > 0],
                               truth.positions[truth.atom_mask > 0], atol=1e-3)


def test_write_mmcif_creates_missing_directories(truth, tmp_path):
    path = write_mmcif(prediction_to_structure(truth, "4zey_A"), tmp_path / "a" / "b" / "x.cif")
    assert path.is_file() and not list(path.parent.glob(".*.tmp"))
