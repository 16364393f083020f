"""The AF3 real-data training benchmark (``benchmarks/train/af3_msa.py``) end to end on CPU in
its tiny mode: the cache of the bundled 3U8V and 4ZEY with their alignments is built, ``fold-train
train --preset af3_tiny`` runs on it, the result names the MSA rows and templates of the data and
the graphed row says it needs CUDA."""

from __future__ import annotations

import json

import pytest

from benchmarks.train import af3_msa


def test_af3_msa_benchmark_smoke(tmp_path):
    from fold_data.af3.ccd import biotite_ccd_path

    if biotite_ccd_path() is None:
        pytest.skip("biotite's CCD is not installed (pip install biotite>=1.0)")
    cache = tmp_path / "cache"
    af3_msa.main(["--prepare", str(cache)])
    report = json.loads((cache / "af3" / "cache_report.json").read_text())
    rows = {r["name"]: (r["msa_rows"], r["templates"]) for r in report["entries"]}
    assert rows == {"3u8v": (1350, 0), "4zey": (850, 1)}

    out = tmp_path / "res" / "af3_msa.json"
    result = af3_msa.main(["--device", "cpu", "--tiny", "--steps", "3", "--cache", str(cache),
                           "--out", str(out)])
    eager, graphed = result["rows"]
    assert eager["exit_code"] == 0 and eager["losses_finite"] and len(eager["steps"]) == 3
    assert {c for s in eager["steps"] for c in s["chains"]} <= {"3u8v", "4zey"}
    assert "CUDA" in graphed["error"]
    assert "1350 MSA rows" in result["data"]
    saved = json.loads(out.read_text())
    assert saved["rows"][0]["row"] == "eager" and out.with_suffix(".md").is_file()
