"""The EvoAttention module A/B tool (benchmarks/tools/attention_ab.py) on CPU under the
interpreter: a smoke run of a copy of the current module against itself (the same kernels: equal
gradients), and its refusals of a bad shape and of a file that is no copy of the module."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.tools import attention_ab


def _smoke_run(tmp_path, *args: str) -> tuple[dict, str]:
    """A copy of the current module against it on CPU, one rep and call per round: the one
    result row and the Markdown table."""
    from fold_kernels import tuning

    if not tuning.interpreting():
        pytest.skip("the CPU smoke run needs TRITON_INTERPRET=1 (CI sets it)")
    copy = tmp_path / "evo_copy.py"
    shutil.copy(importlib.import_module("fold_kernels.evo_attention").__file__, copy)
    out = tmp_path / "ab.json"
    attention_ab.main([str(copy), *args, "--device", "cpu", "--reps", "1", "--calls", "1",
                       "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    return row, out.with_suffix(".md").read_text()


def test_smoke_run_of_a_copy_against_the_current_module(tmp_path):
    row, md = _smoke_run(tmp_path, "3,17,2,8", "--gate", "--rounds", "2")
    assert row["shape"] == [3, 17, 2, 8] and row["gate"] and row["max_abs_grad_diff"] == 0.0
    assert all(len(row["ms_per_call"][k]) == 2 for k in ("other", "current"))
    assert row["other_over_current"] > 0
    assert "| 3, 17, 2, 8 | yes |" in md


def test_smoke_run_with_a_padded_mask(tmp_path):
    """``--mask padded``: rows that keep no key (the last tenth of R) and a masked key tail."""
    row, md = _smoke_run(tmp_path, "11,20,1,8", "--mask", "padded", "--rounds", "1")
    assert row["mask"] == "padded" and row["max_abs_grad_diff"] == 0.0
    assert "key mask: padded" in md


def test_bad_shape_and_a_file_that_is_not_the_module_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="R,N,H,D"):
        attention_ab.parse_shape("3,17,2")
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    with pytest.raises(SystemExit, match="has no evo_attention"):
        attention_ab.load_copy(Path(other))
