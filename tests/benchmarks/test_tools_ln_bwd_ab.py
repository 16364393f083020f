"""The LayerNorm backward A/B tool (benchmarks/tools/ln_bwd_ab.py) on CPU under the interpreter:
a smoke run with FOLD_KERNELS_LN_DENSE off and on. Both settings' rounds, the floor and the
largest difference between their gradients (the same arithmetic: zero) are written, and the
switch's own value is restored."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.tools import ln_bwd_ab


def test_smoke_run_writes_both_settings_and_restores_the_switch(tmp_path, monkeypatch):
    from fold_kernels import tuning

    if not tuning.interpreting():
        pytest.skip("the CPU smoke run needs TRITON_INTERPRET=1 (CI sets it)")
    monkeypatch.setenv("FOLD_KERNELS_LN_DENSE", "keep")
    out = tmp_path / "ab.json"
    ln_bwd_ab.main(["FOLD_KERNELS_LN_DENSE=0,1", "--device", "cpu", "--sizes", "5",
                    "--rounds", "2", "--reps", "1", "--calls", "1", "--out", str(out)])
    assert os.environ["FOLD_KERNELS_LN_DENSE"] == "keep"
    doc = json.loads(out.read_text())
    assert doc["switch"] == "FOLD_KERNELS_LN_DENSE" and doc["values"] == ["0", "1"]
    (row,) = doc["rows"]
    assert row["rows"] == 25 and row["max_abs_diff"] == 0.0
    assert all(len(row["us_per_call"][v]) == 2 for v in ("0", "1"))
    assert row["floor_us"] > 0 and row["off_over_on"] > 0
    assert "| pair 5^2 x 128 |" in out.with_suffix(".md").read_text()
