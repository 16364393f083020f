"""The training ablation benchmark's CPU smoke mode (``benchmarks/train_ablation.py --device cpu
--tiny``): every row runs or says why not, losses agree across rows, JSON + Markdown written."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
from _train_helpers import REPO

SCRIPT = REPO / "benchmarks" / "train_ablation.py"


def test_train_ablation_smoke(tmp_path, monkeypatch):
    if not SCRIPT.exists():
        pytest.skip("benchmarks/ not in this checkout")
    spec = importlib.util.spec_from_file_location("train_ablation", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_ablation", bench)  # dataclasses look it up
    spec.loader.exec_module(bench)
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
