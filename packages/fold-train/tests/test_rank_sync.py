"""Distributed cache build (torchrun, 2 processes, gloo on CPU): rank 0 may build for longer than
the process group's collective timeout (injected here: 2 s) while the other rank waits; rank 0's
failure reaches every rank with its message; a rank that stalls is named, whether it is rank 0
(its heartbeats stop) or another rank (it never checks in); a rank that dies ends the job at
once. The last test runs ``fold-train train`` itself with a build slower than the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from _train_helpers import DEMO, SMALL

pytestmark = pytest.mark.distributed

DRIVER = textwrap.dedent('''
    import os, sys, time
    import torch, torch.distributed as dist
    from fold_data.errors import InputError
    from fold_parallel import init_distributed
    from fold_train import rank_sync
    from fold_train.distributed import setup

    mode = sys.argv[1]
    init_distributed(timeout_s=2.0)  # collectives time out after 2 s
    ctx = setup()
    policy = rank_sync.SyncPolicy(poll_s=0.05, heartbeat_s=0.1, stall_s=2.0, check_in_s=3.0,
                                  report_s=1.0)

    def work():
        if mode == "fail":
            raise InputError("complexes/9xyz.cif", "chain A", "expected atoms")
        if mode == "frozen":  # rank 0 hangs, and its heartbeat (patched below) is silent
            time.sleep(60)
        time.sleep(5.0 if mode in ("slow", "barrier") else 0.1)
        return "built"

    if ctx.rank == 0 and mode == "frozen":
        rank_sync._Heartbeat.run = lambda self: None
    if ctx.rank == 1 and mode == "stall":
        time.sleep(60)
    if ctx.rank == 1 and mode == "die":
        os._exit(3)
    try:
        if mode == "barrier":  # the old way: one barrier after the build
            result = work() if ctx.is_main else "read"
            dist.barrier()
        else:
            result = rank_sync.run_on_rank0(ctx, "build the test cache", work,
                                            after=lambda: "read", policy=policy)
    except (InputError, rank_sync.RankStalled) as e:
        print(f"rank {ctx.rank}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    t = torch.ones(1)
    dist.all_reduce(t)  # the process group still works
    print(f"rank {ctx.rank}: {result} {int(t.item())}", flush=True)
    dist.destroy_process_group()
''')


def _torchrun(tmp_path, *args: str, timeout: float = 120) -> tuple[int, str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def _driver(tmp_path, mode: str) -> tuple[int, str, float]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    return _torchrun(tmp_path, str(script), mode)


def test_the_injected_timeout_bites_a_plain_barrier(tmp_path):
    code, out, _ = _driver(tmp_path, "barrier")
    assert code != 0 and "rank 1: read 2" not in out


def test_a_build_longer_than_the_collective_timeout_is_waited_for(tmp_path):
    code, out, _ = _driver(tmp_path, "slow")
    assert code == 0, out[-3000:]
    assert "rank 0: built 2" in out and "rank 1: read 2" in out
    assert "fold-train: rank 1 waiting for rank 0 to build the test cache (" in out


def test_rank0_failure_reaches_every_rank(tmp_path):
    code, out, _ = _driver(tmp_path, "fail")
    assert code != 0
    assert "rank 0: InputError: complexes/9xyz.cif [chain A]: expected atoms" in out
    assert ("rank 1: InputError: complexes/9xyz.cif [chain A]: expected atoms (rank 0 failed to "
            "build the test cache)") in out


def test_a_stalled_rank_is_named(tmp_path):
    code, out, seconds = _driver(tmp_path, "stall")
    assert code != 0 and seconds < 50  # rank 1 sleeps 60 s: the job did not wait for it
    assert ("rank 0: RankStalled: rank 1 did not arrive within 3 s after rank 0 finished to "
            "build the test cache") in out


def test_a_frozen_rank0_is_named(tmp_path):
    code, out, seconds = _driver(tmp_path, "frozen")
    assert code != 0 and seconds < 50
    assert ("rank 1: RankStalled: rank 0 stopped reporting progress while it was to build the "
            "test cache: no heartbeat for 2 s") in out


def test_a_dead_rank_ends_the_job_at_once(tmp_path):
    code, out, seconds = _driver(tmp_path, "die")
    assert code != 0 and seconds < 50
    assert "exitcode  : 3" in out and "rank      : 1" in out  # torchrun names the dead rank


def test_fold_train_train_waits_for_a_slow_cache_build(tmp_path):
    """``torchrun ... fold-train train --preset tiny`` with rank 0's cache build 7 s slower
    than the process group's 5 s timeout: the run completes."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import sys, time
        from fold_parallel import init_distributed
        import fold_train.data as data
        from fold_train.cli import main

        init_distributed(timeout_s=5.0)
        real = data.open_cache

        def slow(data_dir, *args, **kwargs):
            if data_dir is not None:
                time.sleep(7.0)
            return real(data_dir, *args, **kwargs)

        data.open_cache = slow
        sys.exit(main(sys.argv[1:]))
    '''))
    run = tmp_path / "run"
    code, out, _ = _torchrun(
        tmp_path, str(script), "train", "--preset", "tiny", "--data", str(DEMO), "--chains",
        "1psm_A,4zey_A", "--run-dir", str(run), "--cache", str(tmp_path / "cache"),
        "--no-progress", "--cache-workers", "1", *SMALL, "steps=1", timeout=240)
    assert code == 0, out[-3000:]
    assert out.count("fold-train: preset tiny") == 1 and "timed out" not in out.lower()
    assert (run / "checkpoints" / "step_00000001.ckpt").is_file()
