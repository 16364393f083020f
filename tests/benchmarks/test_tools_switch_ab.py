"""The switch A/B tool (benchmarks/tools/switch_ab.py) on CPU: a smoke run of a training step
and a forward target with a switch off and on. Every row has both settings' rounds and the
ratios, and the switch's own value is restored. On CPU a "replay" is the eager step."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.tools import switch_ab


def test_parse_switch():
    assert switch_ab.parse_switch("FOLD_KERNELS_PDL=0,1") == ("FOLD_KERNELS_PDL", ("0", "1"))
    for bad in ("FOLD_KERNELS_PDL", "FOLD_KERNELS_PDL=1", "=0,1", "X=0,", "X=0,1,2"):
        with pytest.raises(SystemExit, match="NAME=OFF,ON"):
            switch_ab.parse_switch(bad)


def test_smoke_run_writes_both_settings_and_restores_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_KERNELS_PDL", "keep")
    out = tmp_path / "ab.json"
    rows = switch_ab.main(["FOLD_KERNELS_PDL=0,1", "pairformer:5", "fwd pairformer:5",
                           "--rounds", "2", "--reps", "1", "--out", str(out)])
    assert os.environ["FOLD_KERNELS_PDL"] == "keep"
    doc = json.loads(out.read_text())
    assert doc["switch"] == "FOLD_KERNELS_PDL" and doc["values"] == ["0", "1"]
    assert [r["target"] for r in doc["rows"]] == ["pairformer:5", "fwd pairformer:5"] == [
        r["target"] for r in rows]
    for r in doc["rows"]:
        for mode in ("replay_ms", "eager_ms"):
            assert all(len(r[mode][v]) == 2 and min(r[mode][v]) > 0 for v in ("0", "1"))
        assert r["replay_off_over_on"] > 0 and r["eager_off_over_on"] > 0
    assert "| fwd pairformer:5 |" in out.with_suffix(".md").read_text()


def test_bad_forward_target_names_what_is_accepted():
    import torch

    with pytest.raises(SystemExit, match="fwd pairformer:N"):
        switch_ab.steps("fwd evoformer:8,8", torch.device("cpu"))
