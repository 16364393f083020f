"""``fold-train predict --json``: an AlphaFold3 input JSON -> mmCIF of every chain with ligands and
per-atom pLDDT, from a checkpoint that ``fold-train train --preset af3_tiny`` wrote (and resumed);
and the clear errors: a JSON without sequences, an unknown CCD code, a checkpoint of the other
model family."""

from __future__ import annotations

import json
from pathlib import Path

import gemmi
import numpy as np
import pytest
from _af3_helpers import CCD, INPUTS, needs_af3_demo, train_args
from fold_train.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def af3_checkpoint(tmp_path_factory) -> Path:
    """A 3-step tiny AF3 run on 3O5R, interrupted after step 2 and resumed."""
    needs_af3_demo()
    run = tmp_path_factory.mktemp("af3_run")
    assert main(train_args(run, "steps=2", "checkpoint_every=1")) == 0
    # the resumed part prepares its sample in a loader worker process (the AF2 pipeline's path)
    assert main(train_args(run, "steps=3", "checkpoint_every=1", "loader_workers=1")
                + ["--resume"]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    ckpt = run / "checkpoints" / "step_00000003.ckpt"
    assert ckpt.is_file()
    return ckpt


def _predict(ckpt: Path, source: Path, out: Path, capsys) -> dict:
    rc = main(["predict", "--checkpoint", str(ckpt), "--json", str(source), "--ccd", str(CCD),
               "--out", str(out), "--device", "cpu", "--samples", "2"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


def _check_structure(path: Path, doc: dict) -> gemmi.Structure:
    """The mmCIF re-read with gemmi: chains and polymer residues as in the JSON, finite
    coordinates, B-factors (pLDDT) in [0, 100]."""
    st = gemmi.read_structure(str(path))
    model = st[0]
    chains = {c.name: c for c in model}
    expected = {}
    for item in doc["sequences"]:
        (kind, body), = item.items()
        for cid in [body["id"]] if isinstance(body["id"], str) else body["id"]:
            expected[cid] = (kind, body)
    assert sorted(chains) == sorted(expected)
    for cid, (kind, body) in expected.items():
        residues = list(chains[cid])
        if kind == "protein":
            names = [r.name for r in residues]
            assert "".join(gemmi.find_tabulated_residue(n).one_letter_code.upper()
                           for n in names) == body["sequence"]
            assert all(r.het_flag == "A" for r in residues)
        else:
            assert all(r.het_flag == "H" for r in residues)
    b = np.array([a.b_iso for ch in model for res in ch for a in res])
    xyz = np.array([a.pos.tolist() for ch in model for res in ch for a in res])
    assert np.isfinite(xyz).all() and np.isfinite(b).all()
    assert (b >= 0).all() and (b <= 100).all()
    assert b.std() > 0  # per-atom values, not one number per structure
    return st


def test_predict_protein_ligand_json_writes_ligand_and_plddt(af3_checkpoint, tmp_path, capsys):
    source = INPUTS / "fkbp51_fk506.json"
    out = tmp_path / "pred" / "fkbp51.cif"
    summary = _predict(af3_checkpoint, source, out, capsys)
    assert summary["chains"] == ["A", "B"] and summary["ligand_chains"] == ["B"]
    assert summary["seed"] == 7 and len(summary["sample_mean_plddt"]) == 2
    assert set(summary["seconds"]) == {"load", "features", "model", "confidence", "write"}
    st = _check_structure(out, json.loads(source.read_text()))
    ligand = list(st[0]["B"])
    assert [r.name for r in ligand] == ["FK5"]
    assert len(ligand[0]) == 57  # FK506's heavy atoms (C44 H69 N O12)
    assert sum(len(r) for r in st[0]["A"]) + 57 == summary["n_atom"]  # every atom written once
    assert {a.name for a in ligand[0]} >= {"C1", "N7", "O1"}  # the CCD's atom names
    assert not list(tmp_path.glob("pred/.*tmp"))  # written atomically: no temporary left


def test_predict_smiles_ligand(af3_checkpoint, tmp_path, capsys):
    source = INPUTS / "streptavidin_biotin_smiles.json"
    out = tmp_path / "strep.cif"
    summary = _predict(af3_checkpoint, source, out, capsys)
    st = _check_structure(out, json.loads(source.read_text()))
    ligand = list(st[0]["B"])
    assert [r.name for r in ligand] == ["LIG"]
    assert len(ligand[0]) == 16  # biotin C10 H16 N2 O3 S: 16 heavy atoms
    assert sorted({a.element.name for a in ligand[0]}) == ["C", "N", "O", "S"]
    assert summary["n_token"] == 126 + 16


def _af3_json(tmp_path: Path, **changes) -> Path:
    doc = json.loads((INPUTS / "fkbp51_fk506.json").read_text())
    doc.update(changes)
    path = tmp_path / "input.json"
    path.write_text(json.dumps(doc))
    return path


def test_bad_inputs_give_clear_errors(af3_checkpoint, tmp_path, capsys):
    def run(source: Path) -> str:
        rc = main(["predict", "--checkpoint", str(af3_checkpoint), "--json", str(source),
                   "--ccd", str(CCD), "--out", str(tmp_path / "x.cif"), "--device", "cpu"])
        err = capsys.readouterr().err
        assert rc == 1 and not (tmp_path / "x.cif").exists()
        return err

    err = run(_af3_json(tmp_path, sequences=[]))
    assert "input.json" in err and "'sequences' is empty" in err
    no_seq = json.loads((INPUTS / "fkbp51_fk506.json").read_text())
    del no_seq["sequences"]
    (tmp_path / "input.json").write_text(json.dumps(no_seq))
    assert "sequences" in run(tmp_path / "input.json")
    err = run(_af3_json(tmp_path, sequences=[
        {"protein": {"id": "A", "sequence": "GAPATV"}},
        {"ligand": {"id": "B", "ccdCodes": ["QQ9X"]}}]))
    assert "unknown CCD code 'QQ9X'" in err and "ligand B" in err


def test_checkpoint_of_the_other_family_is_refused(af3_checkpoint, tmp_path, capsys):
    rc = main(["predict", "--checkpoint", str(af3_checkpoint), "--fasta",
               str(Path(__file__).resolve().parents[3] / "data/demo/monomer/short.fasta"),
               "--out", str(tmp_path / "x.cif"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "is an AF3 checkpoint" in err and "--json" in err


def test_af2_checkpoint_is_refused_for_a_json(tmp_path, capsys):
    """An AF2 checkpoint (a real one, written by save_checkpoint) with an AF3 input."""
    import torch
    from fold_model.af2 import AlphaFold2
    from fold_train.checkpoint import save_checkpoint
    from fold_train.config import preset

    needs_af3_demo()
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = AlphaFold2(cfg.model_config())
    ckpt = save_checkpoint(tmp_path / "af2.ckpt", {
        "format": "fold-train/1", "config": cfg.to_dict(),
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()}})
    rc = main(["predict", "--checkpoint", str(ckpt), "--json",
               str(INPUTS / "fkbp51_fk506.json"), "--out", str(tmp_path / "x.cif")])
    err = capsys.readouterr().err
    assert rc == 1 and "is an AF2 checkpoint" in err and "AF3 model" in err
