"""CPU smoke runs of ``benchmarks/parallel/predict_dap.py``: tiny AF2 and AF3 models predicted on
2 gloo ranks (DAP 2) and in one process (DAP 1), then the two results merged into one table."""

from __future__ import annotations

import json
import math

import pytest
from _dist import ok, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SMOKE = ["--tiny", "--device", "cpu", "--af3-tokens", "15", "--samples", "3",
         "--sampler-steps", "2"]


def _smoke(rank: int, world: int, out: str) -> int:
    from benchmarks.parallel import predict_dap

    return predict_dap.main([*SMOKE, "--out", out])


def test_benchmark_smoke(tmp_path):
    from benchmarks.parallel import predict_dap

    two = tmp_path / "two.json"
    ok(run_ranks(_smoke, 2, str(two), timeout_s=170))
    one = tmp_path / "one.json"
    assert predict_dap.main([*SMOKE, "--n-res", "21", "--out", str(one)]) == 0
    for path, dap in ((two, 2), (one, 1)):
        res = json.loads(path.read_text())
        assert res["world_size"] == dap
        for r in res["rows"]:
            assert r["status"] == "ok" and r["dap"] == dap and math.isfinite(r["total_s"])
            assert r["dap_stacks"] == (3 if dap > 1 else 0)
            if r["family"] == "af2":
                assert len(r["passes_s"]) == 2 and r["finite"]
                assert r["whole_prediction_estimate_s"] > 0
    merged = tmp_path / "merged.json"
    assert predict_dap.main(["--merge", str(two), str(one), "--out", str(merged)]) == 0
    rows = json.loads(merged.read_text())["rows"]
    assert [(r["family"], r["dap"]) for r in rows if r.get("n_res") == 21] == \
        [("af2", 1), ("af2", 2)]
    md = merged.with_suffix(".md").read_text()
    assert "547.955" not in md and "548.0 s on 8" in md  # FastFold's anchor, in the note
    assert "Not run yet: DAP 4, 8" in md
