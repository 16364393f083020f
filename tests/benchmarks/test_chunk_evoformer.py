"""The AutoChunk GPU benchmark (``benchmarks/chunk/evoformer.py``): its CPU smoke mode runs end
to end (as ``python -m benchmarks.chunk.evoformer``) and writes its results; a time budget skips
rows instead of running them; rows come in order of importance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.chunk import evoformer as bench

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "chunk.json"
    subprocess.run([sys.executable, "-m", "benchmarks.chunk.evoformer", "--device", "cpu",
                    "--small", "--blocks", "1", "--n-seq", "3", "--reps", "1", "--out", str(out),
                    *extra],
                   check=True, capture_output=True, timeout=300, cwd=REPO)
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
    order = bench.row_order([4096, 512, 3072, 1024, 2048])
    assert [n for n, _ in order[:12]] == [512] * 4 + [1024] * 4 + [2048] * 4
    assert [n for n, _ in order[12:]] == [3072] * 4 + [4096] * 4
    assert [m for _, m in order[:4]] == ["none", "manual64", "auto_equal", "auto_min"]


def test_skipped_and_measured_modes_share_one_row(tmp_path: Path) -> None:
    """A mode skipped for time, then modes run at the same N_res: one row per N_res, written
    after each mode; (c) without a measured (b) is an error row, not a crash."""
    import argparse
    import math

    import torch
    from fold_model.af2.config import EvoformerConfig
    from fold_model.af2.evoformer import EvoformerStack

    cfg = EvoformerConfig(c_m=8, c_z=4, c_s=4, no_blocks=1, c_hidden_msa_att=4, no_heads_msa=2,
                          c_hidden_opm=2, c_hidden_mul=4, c_hidden_pair_att=4, no_heads_pair=2,
                          transition_n=2)
    torch.manual_seed(0)
    stack = EvoformerStack(cfg).eval()
    out = tmp_path / "rows.json"
    opts = argparse.Namespace(budget_seconds=None, reps=1, row_seconds=30.0, blocks=1, out=out)
    meta = {"device_name": "cpu", "dtype": "fp32", "blocks": 1, "n_seq": 3}
    b = bench.Benchmark(stack, opts, torch.device("cpu"), torch.float32, 3, 2, meta)
    b.deadline = b.t_start  # no time left: skipped
    b.run_row(9, "manual64")
    b.deadline = math.inf
    b.run_row(9, "auto_equal")  # (b) was skipped: no budget for (c)
    b.run_row(9, "none")
    b.run_row(9, "auto_min")
    (row,) = json.loads(out.read_text())["rows"]
    assert row["manual64"]["status"] == "skipped"
    assert row["auto_equal"]["status"] == "error" and "manual64" in row["auto_equal"]["error"]
    assert row["none"]["status"] == "ok" and row["auto_min"]["status"] == "ok"
    assert row["auto_min"]["rel_err_vs_none"] < 1e-5
    assert b.predicted_row_s(18, "none") > b.call_s[(9, "none")]
