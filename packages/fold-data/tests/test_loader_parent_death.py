"""Loader workers do not outlive a consumer killed with SIGKILL (no handler can run): they notice
the re-parenting, free their shared memory and exit instead of waiting forever on the queue."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

PREPARE = textwrap.dedent("""
    import numpy as np

    def prepare(i):
        return np.full(1 << 17, i, dtype=np.float32)  # large enough for shared memory
""")
CONSUMER = textwrap.dedent("""
    import os, signal
    from fold_data.loader import NonBlockingLoader
    from loader_victim import prepare

    if __name__ == "__main__":  # spawn re-imports the main module in each worker
        loader = NonBlockingLoader(6, prepare, workers=2, prefetch=4)
        it = iter(loader)
        next(it)
        print(" ".join(str(p.pid) for p in loader._procs), loader._shm_prefix, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for a reaper has exited
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and /dev/shm")
def test_workers_exit_when_the_consumer_is_killed(tmp_path):
    (tmp_path / "loader_victim.py").write_text(PREPARE)  # spawn workers import it by name
    (tmp_path / "consumer.py").write_text(CONSUMER)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    # stdout to a file: the workers share it, and a pipe would stay open while they live
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.run([sys.executable, str(tmp_path / "consumer.py")], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": path})
    proc.stdout = (tmp_path / "out.txt").read_text()
    assert proc.returncode == -9, proc.stderr
    *pids, prefix = proc.stdout.split()
    pids = [int(p) for p in pids]
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "loader workers outlived their consumer"
    if prefix != "None":
        leftover = [f for f in os.listdir("/dev/shm") if f.startswith(os.path.basename(prefix))]
        assert leftover == []
