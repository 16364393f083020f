"""CPU gloo smoke run of ``benchmarks/parallel_dap_bp.py`` (tiny sizes, every mode and section):
it runs to the end on 2 ranks and writes finite timings and the volume table."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from _dist import ok, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "parallel_dap_bp.py"


def _smoke(rank: int, world: int, out: str) -> dict:
    spec = importlib.util.spec_from_file_location("parallel_dap_bp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(["--smoke", "--reps", "1", "--out", out])


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ not in this checkout")
def test_benchmark_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    ok(run_ranks(_smoke, 2, str(out), timeout_s=170))
    res = json.loads(out.read_text())
    for section in ("evoformer", "train_step", "inference"):
        for row in res[section].values():
            for mode, r in row.items():
                assert isinstance(r, dict) and math.isfinite(r["ms"]) and r["ms"] > 0, mode
    assert res["volume"]["initial"]["dap2"]["calls"]["all_to_all"] == 12  # one block
    assert res["volume"]["initial"]["bp2"]["calls"]["all_reduce"] == 3  # join fwd + bwd, bcast bwd
    assert out.with_suffix(".md").exists()
