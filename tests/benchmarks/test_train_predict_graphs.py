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
