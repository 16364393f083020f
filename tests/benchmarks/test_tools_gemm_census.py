"""The GEMM census tool (benchmarks/tools/gemm_census.py) on CPU: a smoke run of the tiny
Pairformer records the step's GEMMs with their call sites and writes one timed row each."""

from __future__ import annotations

import json

from benchmarks.tools import gemm_census


def test_smoke_run_records_and_times_every_gemm(tmp_path):
    out = tmp_path / "gemms.json"
    gemm_census.main(["--device", "cpu", "--n", "7", "--reps", "1", "--rounds", "1",
                      "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["n_token"] == 7 and row["calls"] == sum(g["count"] for g in row["gemms"])
    ops = {g["op"] for g in row["gemms"]}
    assert "mm" in ops and "bmm" in ops  # projections and the triangle products
    for g in row["gemms"]:
        assert g["us"] > 0 and g["floor_us"] > 0 and g["count"] >= 1
        assert (g["transposed_us"] is None) == (g["op"] == "addmm")
    assert any("triangle_multiplication.py" in g["site"] for g in row["gemms"])
    assert "## 7 tokens" in out.with_suffix(".md").read_text()
