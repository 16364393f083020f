"""The forward sweep (benchmarks/kernels/attention_fwd_sweep.py) runs end to end on CPU in Triton's
interpreter on its tiny shape: the tuned op and every forward candidate pinned in turn, each
agreeing with the tuned op; JSON and Markdown written.
FlexAttention is left out on CPU (its compile needs a GPU run to mean anything)."""

from __future__ import annotations

import json
import math
import os

import torch

from benchmarks.kernels import attention_fwd_sweep as sweep


def test_tiny_sweep_times_every_candidate_against_the_tuned_op(tmp_path):
    out = tmp_path / "sweep.json"
    before = {k: os.environ.get(k) for k in ("FOLD_EVO_DBIAS", "FOLD_EVO_DQ",
                                             "FOLD_KERNELS_CACHE")}
    doc = sweep.main(["--device", "cpu", "--shapes", "tiny", "--contenders", "tuned",
                      "candidates", "--reps", "1", "--out", str(out)])
    res = doc["rows"][0]["results"]
    cands = sweep.forward_candidates(torch.device("cpu"), 32)
    assert set(res) == {"tuned", *map(sweep.cfg_name, cands)}
    for label, x in res.items():
        assert "error" not in x, (label, x)
        assert all(math.isfinite(x[m]) and x[m] > 0 for m in ("fwd_ms", "fwd_bwd_ms"))
        if label != "tuned":  # o, dq, dk, dv, dbias: both bf16, same function
            assert len(x["err_vs_tuned"]) == 5 and max(x["err_vs_tuned"]) < 2e-2, (label, x)
    assert json.loads(out.read_text())["rows"] == doc["rows"]
    assert "| tuned |" in out.with_suffix(".md").read_text()
    # the sweep's environment (backward modes, tuner cache) does not outlive it
    assert {k: os.environ.get(k) for k in before} == before
