"""The bias-sums A/B tool (benchmarks/tools/bias_sums_ab.py) on CPU under the interpreter: a
smoke run writes every setting's rounds (the gate's grids, the sums off, no biases, the floor;
attention's sums on and off), and the switch's value and the gate's grid are restored."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from benchmarks.tools import bias_sums_ab


def test_smoke_run_writes_every_setting_and_restores_the_switch(tmp_path, monkeypatch):
    from fold_kernels import tuning

    if not tuning.interpreting():
        pytest.skip("the CPU smoke run needs TRITON_INTERPRET=1 (CI sets it)")
    elementwise = importlib.import_module("fold_kernels.elementwise")
    default_programs = elementwise._sum_programs
    monkeypatch.setenv("FOLD_KERNELS_GATE_SUMS", "keep")
    out = tmp_path / "ab.json"
    bias_sums_ab.main(["--device", "cpu", "--n", "6", "--per-sm", "1", "2", "--rounds", "2",
                       "--reps", "1", "--calls", "1", "--out", str(out)])
    assert os.environ["FOLD_KERNELS_GATE_SUMS"] == "keep"
    assert elementwise._sum_programs is default_programs
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["gate_us_per_call"]) == {"column sums", "1 per SM", "2 per SM",
                                            "no biases", "floor"}
    assert set(row["attention_us_per_call"]) == {"sums on", "sums off"}
    assert all(len(v) == 2 and min(v) > 0 for v in row["gate_us_per_call"].values())
    assert "| 6 |" in out.with_suffix(".md").read_text()
