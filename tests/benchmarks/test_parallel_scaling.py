"""CPU gloo smoke run of ``benchmarks/parallel/scaling.py`` on 4 ranks (tiny sizes): every
training layout that fits in 4 ranks at both shapes and every inference row runs to the end with
finite timings (training: ``fold_train.Trainer`` steps with the layout's options), the result
files are complete after the run, and a second call that re-measures one layout keeps the other
rows."""

from __future__ import annotations

import json
import math

import pytest
from _dist import ok, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAIN = ("single", "dap4", "bp2_dap2", "dap2", "bp2", "dap4_dao", "bp2_dap2_dao", "dap2_dao",
         "single_parallel")
INFER = ("dap4_dao", "single")


def _smoke(rank: int, world: int, argv: list[str]) -> dict:
    from benchmarks.parallel import scaling

    return scaling.main(argv)


def test_scaling_smoke(tmp_path):
    out = tmp_path / "scaling.json"
    ok(run_ranks(_smoke, 4, ["--smoke", "--reps", "1", "--out", str(out)], timeout_s=170))
    res = json.loads(out.read_text())
    assert res["world_size"] == 4 and res["backend"] == "gloo" and res["torch"]
    rows = {(r["section"], r["shape"], r["layout"]): r for r in res["rows"]}
    want = [("train", s, lay) for s in ("finetune", "initial") for lay in TRAIN]
    want += [("inference", n, lay) for n in ("19", "13") for lay in INFER]
    assert sorted(rows) == sorted(want)
    assert [r["layout"] for r in res["rows"][: len(TRAIN)]] == list(TRAIN)  # importance order
    for key, r in rows.items():
        assert r["status"] == "ok", key
        assert len(r["ms_per_rank"]) == r["gpus"] == r["bp"] * r["dap"], key
        assert all(math.isfinite(t) and t > 0 for t in r["ms_per_rank"]), key
        if not r["layout"].startswith("single"):
            assert math.isfinite(r["speedup_vs_1gpu"]) and r["speedup_vs_1gpu"] > 0, key
    assert rows[("train", "finetune", "bp2_dap2")]["reference"].startswith("HelixFold")
    # training rows are fold-train Trainer steps of a TrainConfig: the layout is in its options
    lay = rows[("train", "initial", "bp2_dap2_dao")]
    assert lay["preset"] == "tiny"
    assert {"dap=2", "bp=2", "dao=true", "model.block_order=parallel"} <= set(lay["overrides"])
    md = out.with_suffix(".md").read_text()
    assert "| bp2_dap2_dao | 4 |" in md and "## Long-sequence inference" in md

    # A second call (one layout, inference only) replaces its rows and keeps the others.
    argv = ["--smoke", "--reps", "1", "--only", "inference", "--layouts", "single",
            "--skip-single-inference", "--out", str(out)]
    ok(run_ranks(_smoke, 4, argv, timeout_s=120))
    again = json.loads(out.read_text())
    rows2 = {(r["section"], r["shape"], r["layout"]): r for r in again["rows"]}
    assert sorted(rows2) == sorted(want) and len(again["commands"]) == 2
    assert rows2[("inference", "13", "single")]["status"].startswith("skipped")
    assert rows2[("train", "initial", "dap4")] == rows[("train", "initial", "dap4")]
