"""The GPU benchmark's CPU smoke mode runs end to end and writes its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "chunk_evoformer.py"


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ not in this checkout")
def test_chunk_evoformer_cpu_smoke(tmp_path: Path) -> None:
    pytest.importorskip("fold_model.af2.evoformer")
    out = tmp_path / "chunk.json"
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--blocks", "1",
                    "--n-res", "11", "--n-seq", "3", "--reps", "1", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    for key in ("none", "manual64", "auto_equal", "auto_min"):
        assert row[key]["ms"] > 0 and row[key]["peak_bytes"] > 0, key
    assert row["auto_min"]["peak_bytes"] < row["none"]["peak_bytes"]
    assert row["auto_min"]["rel_err_vs_none"] < 1e-5  # fp32 in smoke mode
    assert out.with_suffix(".md").exists()
