"""Evaluation of written predictions (files and directories) and the CLI; the mmCIF writer
itself is tested in fold-data (tests/test_af2_write.py)."""

from __future__ import annotations

import json

import gemmi
import numpy as np
import pytest
import torch
from _train_helpers import DEMO, SMALL
from fold_data.af2.write import Prediction, prediction_to_structure
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif
from fold_data.write import write_mmcif
from fold_train.checkpoint import find_latest, load_checkpoint
from fold_train.cli import build_parser, main
from fold_train.evaluate import evaluate_pair
from fold_train.predict import load_trained_model

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


def test_evaluate_pair_known_cases(truth, tmp_path):
    same = write_mmcif(prediction_to_structure(truth, "4zey_A"), tmp_path / "same.cif")
    r = evaluate_pair(same, TRUE, true_chain="A")
    assert r["lddt_ca"] == pytest.approx(1.0) and r["tm_score"] == pytest.approx(1.0)
    assert r["gdt_ts"] == 1.0 and r["rmsd"] == pytest.approx(0.0, abs=1e-3)
    # a rigid motion is invisible; a shifted half is not
    rot = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    moved = Prediction(truth.aatype, truth.positions @ rot.T + 5.0, truth.atom_mask, truth.plddt)
    r = evaluate_pair(write_mmcif(prediction_to_structure(moved, "m"), tmp_path / "m.cif"),
                      TRUE, true_chain="A")
    assert r["lddt_ca"] == pytest.approx(1.0) and r["rmsd"] == pytest.approx(0.0, abs=2e-3)
    bent = truth.positions.copy()
    bent[len(bent) // 2:] += 30.0
    bent_pred = Prediction(truth.aatype, bent, truth.atom_mask, truth.plddt)
    r = evaluate_pair(write_mmcif(prediction_to_structure(bent_pred, "b"), tmp_path / "b.cif"),
                      TRUE, true_chain="A")
    assert r["lddt_ca"] < 0.9 and r["gdt_ts"] < 0.75


def test_evaluate_directories(truth, tmp_path, capsys):
    preds = tmp_path / "preds"
    write_mmcif(prediction_to_structure(truth, "4zey_A"), preds / "4zey_A.cif")
    assert main(["evaluate", str(preds), str(DEMO / "mmcifs")]) == 0
    result = json.loads(capsys.readouterr().out.strip())
    assert result["lddt_ca"] == pytest.approx(1.0) and result["pred"].endswith("4zey_A.cif")
    write_mmcif(prediction_to_structure(truth, "9xyz_A"), preds / "9xyz_A.cif")
    assert main(["evaluate", str(preds), str(DEMO / "mmcifs")]) == 1
    assert "9xyz.cif: expected the true structure of 9xyz_A.cif" in capsys.readouterr().err


def test_evaluate_refuses_another_sequence(truth, tmp_path):
    other = Prediction(truth.aatype[:-3], truth.positions[:-3], truth.atom_mask[:-3],
                       truth.plddt[:-3])
    path = write_mmcif(prediction_to_structure(other, "x"), tmp_path / "x.cif")
    with pytest.raises(InputError, match="expected the same sequence"):
        evaluate_pair(path, TRUE, true_chain="A")


def test_help_of_every_command(capsys):
    for cmd in ("train", "predict", "evaluate", "demo"):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args([cmd, "--help"])
        assert info.value.code == 0
        assert "usage: fold-train " + cmd in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for cmd in ("train", "predict", "evaluate", "cache", "demo"):
        assert cmd in out


def test_print_config_shows_every_resolved_field(capsys):
    assert main(["train", "--preset", "af2_initial", "--print-config", "optim.lr=5e-4",
                 "model.evoformer.no_blocks=12"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["train"]["optim"]["lr"] == 5e-4 and cfg["model"]["evoformer"]["no_blocks"] == 12
    assert cfg["data"]["n_res"] == 256 and cfg["model"]["evoformer"]["c_m"] == 256


def test_bad_override_exits_2_with_the_reason(tmp_path, capsys, demo_cache):
    code = main(["train", "--cache", demo_cache[0], "--run-dir", str(tmp_path), "steps=lots"])
    assert code == 2
    assert "steps='lots': expected an integer" in capsys.readouterr().err


def test_train_then_predict_through_the_cli(demo_cache, tmp_path, capsys):
    cache_dir, _ = demo_cache
    run = tmp_path / "run"
    code = main(["train", "--cache", cache_dir, "--run-dir", str(run), "--hold-out", "4zey_A",
                 "--no-progress", *SMALL, "steps=2", "eval_every=1", "async_eval=true"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held out: 4zey_A" in out and "done at step 2" in out
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2}
    # the held-out chain was scored in the background after step 1, and at the end
    assert [r["step"] for r in records if "eval/4zey_A/lddt_ca" in r] == [1, 2]
    assert all(r["chains"] == ["1psm_A"] for r in records if "chains" in r)

    ckpt = find_latest(run / "checkpoints")
    model, cfg = load_trained_model(ckpt)
    opt_state = load_checkpoint(ckpt)["optimizer"]
    ema, offsets = opt_state["ema"][0], opt_state["offsets"][0]
    for p, off in zip(model.parameters(), offsets, strict=True):
        # prediction runs with the averaged weights (parameters at aligned flat offsets)
        assert torch.equal(p.detach().reshape(-1), ema[off:off + p.numel()])

    align = DEMO / "alignments" / "4zey_A"
    pred = tmp_path / "4zey_A.cif"
    code = main(["predict", "--checkpoint", str(ckpt), "--mmcif", str(TRUE), "--chain", "A",
                 "--msa", str(align / "bfd_uniclust_hits.a3m"), "--out", str(pred)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_res"] == parse_mmcif(TRUE).get_chain("A").num_res
    assert 0 <= summary["lddt_ca"] <= 1 and np.isfinite(summary["rmsd"])
    seconds = summary["seconds"]  # where the time went (fold_train.stage_timer)
    assert set(seconds) == {"load", "features", "model", "confidence", "write"}
    assert all(v >= 0 for v in seconds.values()) and seconds["model"] > 0
    st = gemmi.read_structure(str(pred))
    b = [a.b_iso for r in st[0]["A"] for a in r]
    assert len(b) > 0 and all(0 <= x <= 100 for x in b)
    assert summary["mean_plddt"] == pytest.approx(
        np.mean([r[0].b_iso for r in st[0]["A"]]), abs=0.01)

    code = main(["evaluate", str(pred), str(TRUE), "--chain", "A"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip())
    assert result["lddt_ca"] == pytest.approx(summary["lddt_ca"], abs=1e-3)

    code = main(["predict", "--checkpoint", str(ckpt), "--mmcif", str(TRUE), "--out",
                 str(pred)])
    assert code == 1 and "expected a chain ID" in capsys.readouterr().err

    # --resume continues the run from its latest checkpoint
    code = main(["train", "--cache", cache_dir, "--run-dir", str(run), "--hold-out", "4zey_A",
                 "--no-progress", "--resume", *SMALL, "steps=3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "resumed at step 2" in out and "done at step 3" in out
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(x)]
    assert steps == [1, 2, 3]

    # a sequence from FASTA (no ground truth: no scores, just the structure)
    mono = DEMO / "monomer"
    fasta_out = tmp_path / "short.cif"
    code = main(["predict", "--checkpoint", str(ckpt), "--fasta", str(mono / "short.fasta"),
                 "--msa", str(mono / "bfd_uniclust_hits.a3m"), "--out", str(fasta_out)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "lddt_ca" not in summary and summary["n_res"] == 73
    assert len(gemmi.read_structure(str(fasta_out))[0]["A"]) == 73

    # a damaged checkpoint is refused by name
    bad = tmp_path / "bad.ckpt"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 3] ^= 0x01
    bad.write_bytes(bytes(data))
    code = main(["predict", "--checkpoint", str(bad), "--fasta", str(mono / "short.fasta"),
                 "--out", str(fasta_out)])
    assert code == 1 and "bad.ckpt: corrupt checkpoint" in capsys.readouterr().err


def test_cache_command_delegates_to_fold_data(tmp_path, capsys):
    if not DEMO.exists():
        pytest.skip("bundled demo data not found")
    code = main(["cache", str(DEMO), "--out", str(tmp_path), "--chains", "1psm_A",
                 "--workers", "1", "--no-progress"])
    assert code == 0
    assert "1 chains" in capsys.readouterr().out
    assert list(json.loads((tmp_path / "index.json").read_text())["entries"]) == ["1psm_A"]
