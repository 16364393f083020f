"""CPU gloo smoke run of ``benchmarks/parallel/dap_bp.py`` (tiny sizes, every mode and section):
it runs to the end on 2 ranks and writes finite timings and the volume table."""

from __future__ import annotations

import json
import math

import pytest
from _dist import ok, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _smoke(rank: int, world: int, out: str) -> dict:
    from benchmarks.parallel import dap_bp

    return dap_bp.main(["--smoke", "--reps", "1", "--out", out])


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    ok(run_ranks(_smoke, 2, str(out), timeout_s=170))
    res = json.loads(out.read_text())
    assert "train_step" not in res  # the Trainer's steps: benchmarks.parallel.scaling
    for section in ("evoformer", "inference"):
        for row in res[section].values():
            for mode, r in row.items():
                assert isinstance(r, dict) and math.isfinite(r["ms"]) and r["ms"] > 0, mode
    assert res["volume"]["initial"]["dap2"]["calls"]["all_to_all"] == 12  # one block
    assert res["volume"]["initial"]["bp2"]["calls"]["all_reduce"] == 3  # join fwd + bwd, bcast bwd
    assert out.with_suffix(".md").exists()
