"""The training ablation benchmark's CPU smoke mode (``python -m benchmarks.train.ablation
--device cpu --tiny``): every row runs or says why not, losses agree across rows, JSON +
Markdown written."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.train import ablation as bench


def test_train_ablation_smoke(tmp_path):
    out = tmp_path / "ablation.json"
    result = bench.main(["--device", "cpu", "--tiny", "--reps", "1", "--out", str(out)])
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == [k for k, _, _ in bench.ROWS]
    assert "CUDA" in rows["graphs"]["skipped"] and "GPU only" in rows["compile"]["skipped"]
    ran = [r for r in result["rows"] if "step_ms" in r]
    assert [r["row"] for r in ran] == ["baseline", "kernels", "flat", "fused_adam", "bf16",
                                       "no_ckpt", "gc_off"]
    assert rows["baseline"]["speedup_vs_baseline"] == 1.0
    for r in ran:
        assert math.isfinite(r["loss"]) and r["step_ms"] > 0 and "error" not in r
    # the same training: every fp32 row reaches the same loss; bf16 weights stay close
    fp32 = [r["loss"] for r in ran if not r["switches"]["bf16_params"]]
    assert max(fp32) - min(fp32) < 1e-4 * abs(fp32[0])
    assert rows["bf16"]["loss"] == pytest.approx(fp32[0], rel=1e-2)
    saved = json.loads(out.read_text())
    assert saved["device"] == "cpu" and saved["torch"] and saved["date"]
    md = out.with_suffix(".md").read_text()
    assert "| eager baseline |" in md and "CUDA Graphs need a CUDA device" in md
