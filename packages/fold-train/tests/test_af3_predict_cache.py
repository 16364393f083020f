"""``fold-train predict --cache DIR`` for AF3 inputs (one ``--json`` and ``--input-dir``): the
features are keyed by the bytes of the JSON, of every file it names (here a real MSA of the
bundled monomer, ``unpairedMsaPath``) and of the ``--ccd`` files. An unchanged input is read
back (featurisation not called) and predicts the same; a changed MSA file, or a changed CCD
file, misses the cache and is featurised again."""

from __future__ import annotations

import json
import shutil

import pytest
from _af3_helpers import CCD, needs_af3_demo
from _train_helpers import DEMO
from fold_train.cli import main
from fold_train.predict_af3 import cache_inputs
from test_predict_outputs import _noisy_checkpoint

MONO = DEMO / "monomer"
FAST = ["--samples", "1", "--sampler-steps", "2", "--recycles", "1", "--device", "cpu",
        "--no-cuda-graphs"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    needs_af3_demo()
    return _noisy_checkpoint(tmp_path_factory.mktemp("af3") / "af3.ckpt", "af3_tiny")


def _input(folder):
    """An AF3 JSON of the bundled monomer's query with its real MSA named by path, and a copy of
    the bundled CCD: the files the key must cover."""
    folder.mkdir()
    sequence = (MONO / "short.fasta").read_text().splitlines()[1].strip()
    shutil.copy(MONO / "bfd_uniclust_hits.a3m", folder / "query.a3m")
    shutil.copy(CCD, folder / "ccd.cif")
    doc = {"name": "query", "modelSeeds": [3], "dialect": "alphafold3", "version": 3,
           "sequences": [{"protein": {"id": "A", "sequence": sequence,
                                      "unpairedMsaPath": "query.a3m", "pairedMsa": "",
                                      "templates": []}}]}
    (folder / "query.json").write_text(json.dumps(doc))
    return folder / "query.json", folder / "ccd.cif"


def _predict(checkpoint, source, ccd, cache, out, capsys) -> dict:
    rc = main(["predict", "--checkpoint", str(checkpoint), "--json", str(source), "--ccd",
               str(ccd), "--cache", str(cache), "--out", str(out), *FAST])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


def test_changed_msa_or_ccd_misses_unchanged_input_hits(checkpoint, tmp_path, capsys,
                                                         monkeypatch):
    import fold_data.af3

    source, ccd = _input(tmp_path / "in")
    assert cache_inputs(source, [ccd]) == [source, source.parent / "query.a3m", ccd]
    cache = tmp_path / "cache"
    first = _predict(checkpoint, source, ccd, cache, tmp_path / "a.cif", capsys)
    assert first["cache"] == "built"
    entries = set((cache / "af3").glob("*.npz"))
    assert len(entries) == 1

    make_features = fold_data.af3.make_features

    def refused(*args, **kwargs):
        raise AssertionError("features made again instead of read from the cache")

    monkeypatch.setattr(fold_data.af3, "make_features", refused)
    again = _predict(checkpoint, source, ccd, cache, tmp_path / "b.cif", capsys)
    assert again["cache"] == "reused"
    assert again["ptm"] == first["ptm"] and again["mean_plddt"] == first["mean_plddt"]

    # the MSA file changes (its last sequence dropped), the JSON does not: a miss
    monkeypatch.setattr(fold_data.af3, "make_features", make_features)
    msa = source.parent / "query.a3m"
    lines = msa.read_text().splitlines()
    msa.write_text("\n".join(lines[:-2]) + "\n")
    changed = _predict(checkpoint, source, ccd, cache, tmp_path / "c.cif", capsys)
    assert changed["cache"] == "built"
    entries_now = set((cache / "af3").glob("*.npz"))
    assert len(entries_now) == 2 and entries < entries_now

    # the --ccd file's bytes change (a comment line): a miss too
    ccd.write_text(ccd.read_text() + "# touched\n")
    assert _predict(checkpoint, source, ccd, cache, tmp_path / "d.cif", capsys)["cache"] == \
        "built"
    assert len(list((cache / "af3").glob("*.npz"))) == 3
    assert not list((cache / "af3").glob("*.tmp"))  # nothing half-written left


@pytest.mark.slow
def test_batch_reads_the_cache(checkpoint, tmp_path, capsys, monkeypatch):
    """--input-dir takes --cache for AF3: a second run of the same directory featurises
    nothing."""
    import fold_data.af3

    source, ccd = _input(tmp_path / "in")
    base = ["predict", "--checkpoint", str(checkpoint), "--input-dir", str(source.parent),
            "--ccd", str(ccd), "--cache", str(tmp_path / "cache"), *FAST]
    ccd.rename(tmp_path / "ccd.cif")  # not an input of the directory
    base[base.index(str(ccd))] = str(tmp_path / "ccd.cif")
    assert main([*base, "--out-dir", str(tmp_path / "out1")]) == 0, capsys.readouterr().err
    capsys.readouterr()

    def refused(*args, **kwargs):
        raise AssertionError("features made again instead of read from the cache")

    monkeypatch.setattr(fold_data.af3, "make_features", refused)
    assert main([*base, "--out-dir", str(tmp_path / "out2")]) == 0, capsys.readouterr().err
    first = json.loads((tmp_path / "out1" / "query" / "summary_confidences.json").read_text())
    second = json.loads((tmp_path / "out2" / "query" / "summary_confidences.json").read_text())
    assert first["ptm"] == second["ptm"] and first["ranking_score"] == second["ranking_score"]
