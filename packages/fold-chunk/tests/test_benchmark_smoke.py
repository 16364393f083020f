"""The GPU benchmark's CPU smoke mode runs end to end and writes its results; a time budget
skips rows instead of running them; rows come in order of importance."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "chunk_evoformer.py"
pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ not in this checkout")


def _run(tmp_path: Path, *extra: str) -> dict:
    pytest.importorskip("fold_model.af2.evoformer")
    out = tmp_path / "chunk.json"
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--blocks", "1",
                    "--n-seq", "3", "--reps", "1", "--out", str(out), *extra],
                   check=True, capture_output=True, timeout=300)
    assert out.with_suffix(".md").exists()
    return json.loads(out.read_text())


def test_chunk_evoformer_cpu_smoke(tmp_path: Path) -> None:
    result = _run(tmp_path, "--n-res", "11")
    (row,) = result["rows"]
    for key in ("none", "manual64", "auto_equal", "auto_min"):
        assert row[key]["status"] == "ok", key
        assert row[key]["ms"] > 0 and row[key]["peak_bytes"] > 0, key
    for key in ("auto_equal", "auto_min"):
        assert row[key]["plan_s"] > 0 and row[key]["budget_bytes"] > 0, key
    assert row["auto_min"]["n_regions"] > 0
    assert row["planner_s"] > 0
    assert row["auto_min"]["peak_bytes"] < row["none"]["peak_bytes"]
    assert row["auto_min"]["rel_err_vs_none"] < 1e-5  # fp32 in smoke mode


def test_chunk_evoformer_time_budget_skips_rows(tmp_path: Path) -> None:
    result = _run(tmp_path, "--n-res", "11", "13", "--budget-seconds", "0")
    assert [r["n_res"] for r in result["rows"]] == [11, 13]
    for row in result["rows"]:
        for key in ("none", "manual64", "auto_equal", "auto_min"):
            assert row[key]["status"] == "skipped", (row["n_res"], key)


def test_row_order_most_important_first() -> None:
    pytest.importorskip("fold_model.af2.evoformer")
    spec = importlib.util.spec_from_file_location("chunk_evoformer", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    order = bench.row_order([4096, 512, 3072, 1024, 2048])
    assert [n for n, _ in order[:12]] == [512] * 4 + [1024] * 4 + [2048] * 4
    assert [n for n, _ in order[12:]] == [3072] * 4 + [4096] * 4
    assert [m for _, m in order[:4]] == ["none", "manual64", "auto_equal", "auto_min"]
