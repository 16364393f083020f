"""The alternating-rounds tool (benchmarks/tools/peers_rounds.py) on CPU: fold's tiny Evoformer
block against a second fold block (an A/A run), each round timing both, with the ratios of each
round and of the best rounds written beside the rounds."""

from __future__ import annotations

import json

import pytest

from benchmarks.tools import peers_rounds


def test_a_a_smoke_run_has_every_round_and_the_ratios(tmp_path):
    out = tmp_path / "rounds.json"
    rows = peers_rounds.main(["evoformer:4x9", "--tiny", "--peer", "fold", "--device", "cpu",
                              "--modes", "train_eager,fwd_eager", "--rounds", "3", "--reps", "1",
                              "--warmup", "0", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["peer"] == "fold" and doc["rounds"] == 3
    assert [r["mode"] for r in doc["rows"]] == ["train_eager", "fwd_eager"] == [
        r["mode"] for r in rows]
    for r in doc["rows"]:
        fold, other = r["ms"]["fold"], r["ms"][peers_rounds.AGAIN]
        assert len(fold) == len(other) == 3 and min(fold + other) > 0
        ratio = r["ratio"]
        assert ratio["per_round"] == pytest.approx([o / f for f, o in zip(fold, other)])
        assert ratio["best_rounds"] == pytest.approx(min(other) / min(fold))
        assert min(ratio["per_round"]) <= ratio["median_of_rounds"] <= max(ratio["per_round"])
    assert "| evoformer N_seq 4 N_res 9 | fwd_eager |" in out.with_suffix(".md").read_text()


def test_unknown_mode_is_refused():
    with pytest.raises(SystemExit, match="--modes: choose from"):
        peers_rounds.main(["evoformer:4x9", "--tiny", "--peer", "fold", "--device", "cpu",
                           "--modes", "train_graph"])
