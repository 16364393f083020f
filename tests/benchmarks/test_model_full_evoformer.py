"""The full AF2 step benchmark (``benchmarks/model/full.py``) and the Evoformer block benchmark
(``benchmarks/model/evoformer.py``) in their CPU smoke modes, eager and with --graphs."""

from __future__ import annotations

import math

from benchmarks.model import evoformer, full


def test_benchmark_smoke_modes_on_cpu(tmp_path):
    full_row = full.main(
        ["--tiny", "--device", "cpu", "--reps", "1", "--out", str(tmp_path / "full.json")]
    )
    assert full_row["step_ms"] > 0 and math.isfinite(full_row["loss"])
    assert (tmp_path / "full.md").exists()
    rows = evoformer.main(
        ["--tiny", "--device", "cpu", "--reps", "1", "--orders", "parallel",
         "--out", str(tmp_path / "evo.json")]
    )
    assert len(rows) == 2 and all(r["fwd_bwd_ms"] > 0 for r in rows)
    graphed = evoformer.main(
        ["--tiny", "--device", "cpu", "--reps", "1", "--orders", "af2", "--shapes", "5,7",
         "--graphs", "--backend", "torch"]
    )
    assert len(graphed) == 1 and graphed[0]["graphs"] and graphed[0]["fwd_bwd_ms"] > 0
