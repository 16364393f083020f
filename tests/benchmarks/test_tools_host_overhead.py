"""The host-time tool (benchmarks/tools/host_overhead.py) in its CPU mode: Triton's interpreter
with every launch stubbed, run in a fresh interpreter (it sets TRITON_INTERPRET and replaces the
interpreter's launch, which must not leak into this process). Its ``--gpu`` mode needs a CUDA
device; without one it stops with a message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "benchmarks.tools.host_overhead", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_cpu_mode_times_every_op_on_both_backends(tmp_path):
    out = tmp_path / "host.json"
    proc = _run("--calls", "2", "--reps", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "cpu, launches stubbed" and doc["device"] == "cpu"
    calls = {r["call"] for r in doc["rows"]}
    assert {"layer_norm", "attention (bias, mask, gate)", "resolve('attention') only",
            "evoformer block step (tiny)", "pairformer block step (tiny)"} <= calls
    chained = {r["call"] for r in doc["rows"] if r["mode"].startswith("chain")}
    assert {"x * 2 (PyTorch node)", "Python autograd Function (x * 2)", "layer_norm",
            "attention (bias, mask, gate)"} <= chained
    for r in doc["rows"]:
        assert r["torch_us"] > 0, r
        # only PyTorch's own nodes (the chains' floors) have no fold-kernels path
        assert (r["triton_us"] is None) == ("PyTorch node" in r["call"]
                                            or "Python autograd" in r["call"]), r
        assert r["triton_us"] is None or r["triton_us"] > 0, r
    assert "| layer_norm | fwd+bwd |" in out.with_suffix(".md").read_text()


def test_sections_select_the_rows(tmp_path):
    out = tmp_path / "chain.json"
    proc = _run("--calls", "10", "--reps", "1", "--sections", "chain", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["sections"] == ["chain"]
    assert doc["rows"] and all(r["mode"].startswith("chain") for r in doc["rows"])
    proc = _run("--sections", "chain,kernels")
    assert proc.returncode != 0 and "unknown --sections ['kernels']" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU mode runs here")
def test_gpu_mode_refuses_without_a_device():
    proc = _run("--gpu", "--calls", "1", "--reps", "1")
    assert proc.returncode != 0
    assert "no CUDA device" in proc.stderr


def test_profile_names_the_wrappers_of_the_call(tmp_path):
    out = tmp_path / "profile.txt"
    proc = _run("--profile", "layer_norm", "--calls", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "## layer_norm, fwd, no_grad, 5 calls" in text and "## layer_norm, fwd+bwd" in text
    assert "ln_forward" in text and "ln_backward" in text  # fold-kernels' wrappers were profiled
    proc = _run("--profile", "no_such_op", "--calls", "1")
    assert proc.returncode != 0 and "unknown call 'no_such_op'" in proc.stderr


def test_blas_rows_time_each_backend_and_restore_the_preference(monkeypatch):
    """The GPU-only F.linear rows, their logic on the CPU: each BLAS back end PyTorch accepts
    gets a row per mode, one it refuses none, and the preference is restored."""
    from benchmarks.tools import host_overhead

    state = {"now": "default", "set": []}

    def prefer(lib=None):
        if lib is None:
            return state["now"]
        if lib == "cublaslt":
            raise RuntimeError("not compiled with cuBLASLt")
        state["set"].append(lib)
        state["now"] = lib
        return lib

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", prefer)
    ran = []

    def chain(node, x0, grad):
        return lambda: ran.append(tuple(node(x0).shape))

    def per_node(run, grad):
        run()
        return 1.5

    node, x0, _ = host_overhead.chain_cases(torch.device("cpu"))[host_overhead.LINEAR]
    rows = host_overhead._blas_rows(node, x0, per_node, chain)
    assert [(r["call"], r["mode"]) for r in rows] == [
        ("F.linear + bias, cublas (PyTorch node)", "chain fwd+bwd, per node"),
        ("F.linear + bias, cublas (PyTorch node)", "chain fwd no_grad, per node")]
    assert all(r["torch_us"] == 1.5 and r["triton_us"] is None for r in rows)
    assert ran == [(1, 4, 16, 32)] * 2
    assert state["set"] == ["cublas", "default"] and state["now"] == "default"
