"""The autotuner-timer A/B tool (benchmarks/tools/tuner_ab.py) on CPU under the interpreter: a
smoke run. Each timer's trials, their picks and the replay figures are written, the user's
tuning cache is neither read nor written, and each trial searches again (``tuning.forget``)."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.tools import tuner_ab


def test_smoke_run_writes_both_timers_and_leaves_the_cache_alone(tmp_path, monkeypatch):
    from fold_kernels import tuning

    if not tuning.interpreting():
        pytest.skip("the CPU smoke run needs TRITON_INTERPRET=1 (CI sets it)")
    cache = tmp_path / "user_cache.json"
    monkeypatch.setenv("FOLD_KERNELS_CACHE", str(cache))
    out = tmp_path / "ab.json"
    tuner_ab.main(["ln_bwd:5", "attention:3,17,2,8", "--device", "cpu", "--trials", "2",
                   "--reps", "1", "--calls", "1", "--out", str(out)])
    assert os.environ["FOLD_KERNELS_CACHE"] == str(cache) and not cache.exists()
    doc = json.loads(out.read_text())
    assert [r["target"] for r in doc["rows"]] == ["ln_bwd:5", "attention:3,17,2,8"]
    for row in doc["rows"]:
        assert [t["timer"] for t in row["trials"]] == ["do_bench", "queued"] * 2
        for timer in tuner_ab.TIMERS:
            assert len(row[timer]["us"]) == 2 and all(u > 0 for u in row[timer]["us"])
            # the interpreter has one candidate a kernel: nothing is searched or recorded
            assert row[timer]["distinct_picks"] == 1
        assert all(t["picks"] == {} for t in row["trials"])
    with pytest.raises(SystemExit, match="unknown target"):
        tuner_ab.main(["softmax:5", "--device", "cpu"])
    assert "| ln_bwd:5 |" in out.with_suffix(".md").read_text()
