"""The forward sweep (benchmarks/kernels/attention_fwd_sweep.py) runs end to end on CPU in Triton's
interpreter on its tiny shape: v0 (the kernels before issue 21's forward work), every forward
candidate pinned in turn and the tuned op, each agreeing with v0; JSON and Markdown written.
FlexAttention is left out on CPU (its compile needs a GPU run to mean anything)."""

from __future__ import annotations

import json
import math
import os

import torch

from benchmarks.kernels import attention_fwd_sweep as sweep


def test_tiny_sweep_times_every_candidate_against_v0(tmp_path):
    out = tmp_path / "sweep.json"
    before = {k: os.environ.get(k) for k in ("FOLD_EVO_DBIAS", "FOLD_EVO_DQ",
                                             "FOLD_KERNELS_CACHE")}
    doc = sweep.main(["--device", "cpu", "--shapes", "tiny", "--contenders", "v0", "candidates",
                      "tuned", "--reps", "1", "--out", str(out)])
    res = doc["rows"][0]["results"]
    cands = sweep.forward_candidates(torch.device("cpu"), 32)
    assert set(res) == {"v0", "tuned", *map(sweep.cfg_name, cands)}
    for label, x in res.items():
        assert "error" not in x, (label, x)
        assert all(math.isfinite(x[m]) and x[m] > 0 for m in ("fwd_ms", "fwd_bwd_ms"))
        if label != "v0":  # o, dq, dk, dv, dbias: both bf16, same function
            assert len(x["err_vs_v0"]) == 5 and max(x["err_vs_v0"]) < 2e-2, (label, x)
    assert json.loads(out.read_text())["rows"] == doc["rows"]
    assert "| v0 |" in out.with_suffix(".md").read_text()
    # the sweep's environment (backward modes, tuner cache) does not outlive it
    assert {k: os.environ.get(k) for k in before} == before
