"""The long-input benchmark (``benchmarks/chunk/longest_input.py``) in its CPU smoke mode: each
trial a subprocess driving ``fold-train predict``; the ladder stops at the first failure and
bisects; the estimate mode records the dry run's estimate next to the real prediction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "longest.json"
    subprocess.run([sys.executable, "-m", "benchmarks.chunk.longest_input", "--device", "cpu",
                    "--tiny", "--out", str(out), *extra],
                   check=True, capture_output=True, timeout=600, cwd=REPO)
    assert out.with_suffix(".md").exists()
    return json.loads(out.read_text())


def test_longest_input_cpu_smoke(tmp_path: Path) -> None:
    # --max-tokens 12 makes 16 residues fail (refused by the size check): 8 ok, 16 fails,
    # bisection tries 12 (ok) and stops at the resolution of 4
    result = _run(tmp_path, "--families", "af2", "--af2-flags", "--max-tokens 12")
    (fam,) = result["families"]
    assert [t["n_res"] for t in fam["trials"]] == [8, 16, 12]
    assert [t["ok"] for t in fam["trials"]] == [True, False, True]
    assert fam["longest_ok"] == 12 and fam["first_failure"] == 16
    assert "--max-tokens" in fam["trials"][1]["error"] or "12" in fam["trials"][1]["error"]
    assert fam["best"]["flags"][:2] == ["--autochunk", "auto"]
    assert fam["best"]["wall_s"] > 0


def test_bisection_starts_from_a_known_length(tmp_path: Path) -> None:
    # an earlier run predicted 8 (--known-ok 8): 16 fails, the bisection tries 12, not 8 and 4
    result = _run(tmp_path, "--families", "af2", "--af2-ladder", "8,16", "--known-ok", "8",
                  "--af2-flags", "--max-tokens 12")
    (fam,) = result["families"]
    assert [(t["n_res"], t["ok"]) for t in fam["trials"]] == [(16, False), (12, True)]
    assert fam["longest_ok"] == 12 and fam["first_failure"] == 16


def test_estimate_mode_cpu_smoke(tmp_path: Path) -> None:
    result = _run(tmp_path, "--estimate", "--families", "af3")
    (rec,) = result["estimates"]
    assert rec["ok"] and rec["estimated_peak_bytes"] > rec["weights_bytes"] > 0
    assert set(rec["estimated_stages"]) >= {"Pairformer", "diffusion step", "confidence head"}


def test_predicted_time_keeps_the_start_up_and_scales_the_rest() -> None:
    from benchmarks.chunk.longest_input import STARTUP_S, predicted_seconds

    assert predicted_seconds(2048, 2048, 85.0) == pytest.approx(85.0)
    # the measured H100 pair: 2048 residues in 85 s, 4096 in 180 s (the cube said 680 s)
    assert 150.0 < predicted_seconds(4096, 2048, 85.0) < 300.0
    assert predicted_seconds(4096, 2048, 10.0) == STARTUP_S  # all start-up: nothing to scale


def test_a_timeout_is_undecided_not_a_failure(tmp_path: Path) -> None:
    # a trial limit shorter than a start-up: 8 times out, the search stops there without a
    # failure (the length might fit and need more time), 16 is not tried
    result = _run(tmp_path, "--families", "af2", "--af2-ladder", "8,16", "--trial-timeout", "0.5")
    (fam,) = result["families"]
    assert [(t["n_res"], t["ok"]) for t in fam["trials"]] == [(8, None)]
    assert fam["trials"][0]["error"].startswith("timeout")
    assert fam["longest_ok"] is None and fam["first_failure"] is None and fam["best"] is None
