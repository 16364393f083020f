"""``fold-train predict`` writes only where it must and never writes garbage: a hostile FASTA
header / AF3 JSON name becomes one file name in the output directory, an output path that is a
directory or under a file is a clear error, a diverged checkpoint's NaN or absurd structure is
refused, an AF2 query with B/J/O/U/Z names the FASTA."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _train_helpers import SMALL
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.families import make_family
from fold_train.outputs import check_prediction, output_path, safe_file_name


def _checkpoint(path: Path, name: str = "tiny", scale: float | None = None) -> Path:
    """An untrained checkpoint of ``name`` (the format ``load_trained_model`` reads); ``scale``
    multiplies every weight, as a diverged run leaves them (nan: all NaN)."""
    cfg = apply_overrides(preset(name), SMALL if name == "tiny" else [])
    torch.manual_seed(0)
    model = make_family(cfg.model.family, cfg.model_config()).build_model(cfg.model_config())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if scale is not None:
        state = {k: (v * scale if v.is_floating_point() else v) for k, v in state.items()}
    return save_checkpoint(path, {"config": cfg.to_dict(), "model": state})


def _fasta(tmp_path: Path, header: str, sequence: str = "MKTAYIAKQRQISFVKSHFSRQ") -> Path:
    path = tmp_path / "in" / "q.fasta"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f">{header}\n{sequence}\n")
    return path


@pytest.mark.parametrize("name, expected", [
    ("../../../escape", "escape.cif"), ("/etc/passwd", "etc_passwd.cif"),
    ("..", "prediction.cif"), ("a b/c", "a_b_c.cif"), (".hidden", "hidden.cif"),
    ("x" * 500, "x" * 200 + ".cif"), ("ok_name-1.2", "ok_name-1.2.cif"),
])
def test_safe_file_name(name, expected):
    assert safe_file_name(name) == expected


def test_hostile_fasta_header_writes_one_file_in_the_output_directory(tmp_path, monkeypatch,
                                                                      capsys):
    ckpt = _checkpoint(tmp_path / "model.ckpt")
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    fasta = _fasta(tmp_path, "../../../../escape")
    before = set(tmp_path.rglob("*"))
    assert main(["predict", "--checkpoint", str(ckpt), "--device", "cpu",
                 "--fasta", str(fasta)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert Path(summary["out"]) == work / "escape.cif"
    new = set(tmp_path.rglob("*")) - before
    assert new == {work / "escape.cif"}


@pytest.mark.parametrize("kind", ["directory", "under_a_file"])
def test_output_path_that_cannot_be_a_file_is_refused(tmp_path, kind):
    if kind == "directory":
        out = tmp_path
    else:
        (tmp_path / "plain").write_text("x")
        out = tmp_path / "plain" / "x.cif"
    with pytest.raises(Exception) as err:
        output_path(out, "ignored")
    assert type(err.value).__name__ == "InputError" and str(out) in str(err.value)
    assert err.value.record == "--out"


def test_predict_refuses_an_output_under_a_file_before_running(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.ckpt")
    (tmp_path / "plain").write_text("x")
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu",
                 "--fasta", str(_fasta(tmp_path, "q")), "--out", str(tmp_path / "plain" / "q.cif")])
    err = capsys.readouterr().err
    assert code == 1 and "plain is a file, not a directory" in err


@pytest.mark.parametrize("scale", [float("nan"), 1e12])
def test_diverged_checkpoint_is_refused_and_nothing_is_written(tmp_path, capsys, scale):
    ckpt = _checkpoint(tmp_path / "diverged.ckpt", scale=scale)
    out = tmp_path / "out.cif"
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu",
                 "--fasta", str(_fasta(tmp_path, "q")), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "diverged.ckpt [prediction]" in err and "diverged" in err
    assert not out.exists()


def test_check_prediction_limits():
    ok = np.zeros((3, 37, 3))
    check_prediction(ok, np.full(3, 50.0), "c.ckpt")
    with pytest.raises(Exception, match="non-finite"):
        check_prediction(ok, np.array([50.0, np.nan, 1.0]), "c.ckpt")
    big = ok.copy()
    big[1, 1, 0] = 1e11
    with pytest.raises(Exception, match=r"coordinates up to 1e\+11 A"):
        check_prediction(big, np.full(3, 100.0), "c.ckpt")
    # coordinates of atoms that do not exist (masked) do not count
    check_prediction(big, np.full(3, 100.0), "c.ckpt", mask=np.ones((3, 37)) * (big == 0).all(-1))


def test_ambiguous_letters_in_a_fasta_query_name_the_file(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.ckpt")
    fasta = _fasta(tmp_path, "query1 some protein", "MKTBZ")
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu", "--fasta", str(fasta),
                 "--out", str(tmp_path / "q.cif")])
    err = capsys.readouterr().err
    assert code == 1 and f"{fasta} [record query1, query sequence]" in err and "'B'" in err


def test_hostile_af3_json_name_and_outside_msa(tmp_path, monkeypatch, capsys):
    ckpt = _checkpoint(tmp_path / "af3.ckpt", "af3_tiny")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (tmp_path / "secret.a3m").write_text(">q\nMKCLV\n")
    doc = {"name": "../../escape", "modelSeeds": [1], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": "MKCLV",
                                      "unpairedMsaPath": "../secret.a3m"}}]}
    job = work / "job.json"
    job.write_text(json.dumps(doc))
    args = ["predict", "--checkpoint", str(ckpt), "--json", str(job), "--device", "cpu",
            "--samples", "1", "--sampler-steps", "2"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{job} [sequences[0] protein A]" in err and "outside the JSON's directory" in err
    before = set(tmp_path.rglob("*"))
    assert main([*args, "--allow-outside-paths"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert Path(summary["out"]) == work / "escape.cif"
    assert set(tmp_path.rglob("*")) - before == {work / "escape.cif"}

