"""The prediction CUDA-graph benchmark (``benchmarks/train/predict_graphs.py``) in its CPU smoke
mode: both families, graphs off and on (EagerCapture standing in for the capture), through a
checkpoint file and the CLI's loaders; finite timings and predictions, JSON + Markdown written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.train import predict_graphs

REPO = Path(__file__).resolve().parents[2]


def test_predict_graphs_benchmark_tiny(tmp_path):
    if not (REPO / "data" / "demo" / "af3" / "ccd.cif").is_file():
        pytest.skip("bundled AF3 demo CCD not found")
    assert predict_graphs.main(["--tiny", "--device", "cpu", "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "predict_graphs.json").read_text())
    rows = result["rows"]
    assert [(r["family"], r["graphs"]) for r in rows] == [("af2", False), ("af2", True),
                                                          ("af3", False), ("af3", True)]
    for r in rows:
        assert math.isfinite(r["mean_plddt"]) and 0 <= r["mean_plddt"] <= 100
        keys = ["recycle"] if r["family"] == "af2" else ["trunk_cycle", "sampler_step"]
        for key in keys:
            assert r[key]["n"] >= 1 and r[key]["median_s"] > 0
    af2_on = rows[1]
    assert af2_on["bucket"]["N_res"] == 64 and af2_on["recycle"]["n"] == 3  # tiny: R = 3 passes
    assert rows[3]["sampler_step"]["n"] == 3 and rows[3]["trunk_cycle"]["n"] >= 1
    assert "graphs on / off" in (tmp_path / "predict_graphs.md").read_text()


def test_weight_casts_configurations_and_ratio():
    """``--weight-casts both`` times the bf16 predictor with its weight casts made once and per
    call beside each other (fp32 casts nothing: one row per graphs setting), and the Markdown
    states their ratio."""
    assert predict_graphs._configs("bf16", "both") == [(False, True), (False, False),
                                                      (True, True), (True, False)]
    assert predict_graphs._configs("fp32", "both") == [(False, True), (True, True)]
    assert predict_graphs._configs("bf16", "per-call") == [(False, False), (True, False)]
    timing = {"n": 3, "median_s": 0.010, "min_s": 0.010, "mean_s": 0.010}
    rows = [{"family": "af3", "preset": "af3", "n_token": 8, "n_atom": 64, "samples": 1,
             "sampler_steps": 3, "graphs": graphs, "weights_cast_once": once,
             "precision": "bf16", "bucket": {"N_token": 8}, "first_call_s": 1.0, "total_s": 1.0,
             "trunk_cycle": timing,
             "sampler_step": {**timing, "median_s": 0.012 if once else 0.015}}
            for graphs, once in predict_graphs._configs("bf16", "both")]
    md = predict_graphs.to_markdown({"device": "cpu", "torch": "t", "triton": "t", "date": "d",
                                     "rows": rows})
    assert "AF3 sampler_step, graphs on: weights cast per call / once = 1.250" in md
    assert md.count("| per call |") == 2


def test_rounds_alternate_the_configurations(tmp_path):
    """``--rounds 2``: every AF3 configuration timed twice, in turn; each round's step median
    kept, the row's figures over both."""
    if not (REPO / "data" / "demo" / "af3" / "ccd.cif").is_file():
        pytest.skip("bundled AF3 demo CCD not found")
    assert predict_graphs.main(["--tiny", "--device", "cpu", "--only", "af3", "--rounds", "2",
                                "--out-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "predict_graphs.json").read_text())["rows"]
    assert [r["graphs"] for r in rows] == [False, True]
    for r in rows:
        assert r["rounds"] == 2 and len(r["round_step_ms"]) == 2
        assert r["sampler_step"]["n"] == 2 * 3  # both rounds' steps
    md = (tmp_path / "predict_graphs.md").read_text()
    assert md.count("2 timed predictions of each configuration") == 1


def test_predict_graphs_one_setting(tmp_path):
    """``--graphs on`` times the graphed predictions only (AF2 here: the AF3 demo files are
    not needed)."""
    assert predict_graphs.main(["--tiny", "--device", "cpu", "--only", "af2", "--graphs", "on",
                                "--out-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "predict_graphs.json").read_text())["rows"]
    assert [(r["family"], r["graphs"]) for r in rows] == [("af2", True)]
