"""The FlexAttention contender of the EvoAttention benchmarks (``common/attention_inputs.py``)
computes the attention of every row that keeps a key, for each key-mask pattern as a
FlexAttention user would pass it (the additive term, none, a BlockMask), on CPU against the
float64 reference.

Each check runs in a fresh interpreter: after ``torch.compile`` has built FlexAttention's CPU
kernels in a process, torch's profiler there failed to decode its events' names
(UnicodeDecodeError in ``key_averages``), which broke ``test_tools_profile_predict`` whenever
pytest ran both in one worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys, torch
from fold_ops import reference as ref
from benchmarks.common.attention_inputs import make_flex, make_inputs
pattern = sys.argv[1]
q, k, v, bias, mask, _ = make_inputs(3, 40, 2, 16, device="cpu", dtype=torch.float32,
                                     mask=pattern)
o = make_flex(pattern)(q, k, v, bias, mask)
want = ref.attention(q.double(), k.double(), v.double(), bias.double(), mask)
rows = mask[0].any(-1)  # FlexAttention's BlockMask gives rows with nothing kept 0
err = (o.double() - want)[0][rows].norm() / want[0][rows].norm()
print(json.dumps({"all_kept": bool(mask.all()), "rows": int(rows.sum()), "err": err.item()}))
"""


@pytest.mark.parametrize("pattern", ["holes", "none", "padded"])
def test_flex_contender_matches_reference(pattern):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", CHECK, pattern], check=True, env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    res = json.loads(run.stdout.strip().splitlines()[-1])
    assert res["all_kept"] == (pattern == "none")
    assert res["rows"] >= 2
    assert res["err"] < 1e-5


@pytest.mark.parametrize("pattern", ["holes", "padded"])
def test_reference_in_row_chunks_matches_float64(pattern):
    """The benchmark's float32 reference, in chunks of two rows, against one float64 pass of
    fold_ops' reference: output and every gradient, the bias's summed over the chunks."""
    import torch
    from fold_ops import reference as ref

    from benchmarks.common.attention_inputs import make_inputs, reference

    q, k, v, bias, mask, do = make_inputs(11, 24, 2, 8, device="cpu", dtype=torch.float32,
                                          mask=pattern)
    got = reference(q, k, v, bias, mask, do, max_logits=2 * 2 * 24 * 24)
    leaves = [t.double().requires_grad_() for t in (q, k, v, bias)]
    o = ref.attention(*leaves, mask)
    o.backward(do.double())
    for a, b in zip(got, [o.detach(), *(t.grad for t in leaves)]):
        assert torch.isfinite(a).all()
        assert (a.double() - b).norm() / b.norm() < 1e-5
    if pattern == "padded":  # rows that keep no key pass no gradient to q
        empty = ~mask[0].any(-1)
        assert empty.any() and got[1][0, empty].abs().max() == 0
