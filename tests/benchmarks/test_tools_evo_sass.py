"""The instruction census (benchmarks/tools/evo_sass.py) compiles EvoAttention's forward for sm_90
without a GPU, with the ptxas and cuobjdump that Triton ships, and counts the key loop: one exp2
per logit of the tile and the tensor-core products it expects. Run in a fresh interpreter: the
tests' Triton runs in interpreter mode, the census needs the compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _have_ptxas() -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _have_ptxas(), reason="this Triton build ships no ptxas (not NVIDIA)")
def test_census_of_one_forward_config(tmp_path):
    out = tmp_path / "census.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-m", "benchmarks.tools.evo_sass", "--kernel", "fwd",
                    "--configs", "64x64:w4:s2:r2", "--out", str(out)], check=True, env=env,
                   cwd=REPO, capture_output=True, timeout=300)
    (row,) = json.loads(out.read_text())
    assert row["logits_per_thread"] == 64 * 64 * 2 / 128
    ops = row["opcodes"]
    # one exp2 per logit, plus one per row of the thread for the rescale factor
    assert row["logits_per_thread"] <= ops["MUFU"] <= row["logits_per_thread"] * 1.25
    assert ops.get("HGMMA", 0) > 0  # the products on Hopper's tensor cores
    assert 5 < row["instructions_per_logit"] < 40


@pytest.mark.skipif(not _have_ptxas(), reason="this Triton build ships no ptxas (not NVIDIA)")
def test_census_with_key_runs(tmp_path):
    """``--runs`` compiles the forward with the mask's key runs (the kernel's ``Runs`` pointer and
    ``HAS_RUNS``): its longest loop is the masked one, which the unmasked run's loop does not
    outgrow."""
    out = tmp_path / "census.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-m", "benchmarks.tools.evo_sass", "--kernel", "fwd",
                    "--configs", "64x32:w4:s3:r2", "--runs", "--out", str(out)], check=True,
                   env=env, cwd=REPO, capture_output=True, timeout=300)
    (row,) = json.loads(out.read_text())
    assert row["runs"] and row["mask"]
    assert row["logits_per_thread"] <= row["opcodes"]["MUFU"] <= row["logits_per_thread"] * 1.25
    assert 5 < row["instructions_per_logit"] < 40
