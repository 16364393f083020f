"""The pinning A/B tool (benchmarks/tools/pin_ab.py) on CPU: settings parse to the main thread's
and the other threads' CPUs, a smoke run writes every setting's rounds, the census counts every
backward node on the thread that ran it, and the process's affinity is restored afterwards."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchmarks.tools import pin_ab

START = os.sched_getaffinity(0)
CPU = min(START)


def test_parse_setting():
    assert pin_ab.parse_setting("all", START) == (START, START)
    assert pin_ab.parse_setting(str(CPU), START) == ({CPU}, {CPU})
    assert pin_ab.parse_setting(f"{CPU}/{CPU}", START) == ({CPU}, {CPU})
    with pytest.raises(SystemExit, match="outside"):
        pin_ab.parse_setting(str(max(START) + 1), START)
    with pytest.raises(ValueError, match="not a number"):
        pin_ab.parse_setting("x", START)


def test_census_counts_every_node_on_one_thread_on_cpu():
    c = pin_ab.census("pairformer:5", torch.device("cpu"))
    # on CPU the calling thread runs every node: no hand-over
    assert c["nodes"] > 20 and c["nodes_per_thread"] == {"main": c["nodes"]}
    assert c["handovers"] == 0


def test_smoke_run_restores_the_affinity(tmp_path):
    out = tmp_path / "pin.json"
    rows = pin_ab.main(["all", str(CPU), f"{CPU}/{CPU}", "pairformer:5", "fwd pairformer:5",
                        "--rounds", "2", "--reps", "1", "--out", str(out)])
    assert os.sched_getaffinity(0) == START
    doc = json.loads(out.read_text())
    assert doc["settings"] == ["all", str(CPU), f"{CPU}/{CPU}"]
    assert [r["target"] for r in doc["rows"]] == ["pairformer:5", "fwd pairformer:5"] == [
        r["target"] for r in rows]
    for r in doc["rows"]:
        assert all(len(v) == 2 and min(v) > 0 for v in r["eager_ms"].values())
        assert r["speedup_over_first"]["all"] == 1.0
    assert "| fwd pairformer:5 |" in out.with_suffix(".md").read_text()


def test_settings_and_targets_both_needed():
    with pytest.raises(SystemExit, match="one setting and one target"):
        pin_ab.main(["all"])
