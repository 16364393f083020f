"""Run a function on several gloo ranks (spawned processes on 127.0.0.1) and collect results.

``run_ranks(fn, n, *args)`` starts ``n`` processes, each calls ``fn(rank, n, *args)`` after
``init_process_group("gloo")``; the return values (anything ``torch.save`` takes) come back in rank
order. An exception on a rank is returned as a :class:`RankFailed` with its traceback, so tests
can assert on failure behaviour; a rank still running at ``timeout_s`` is killed and reported.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp


@dataclass
class RankFailed:
    rank: int
    error_type: str
    message: str
    traceback: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, pg_timeout_s: float, outdir: str, fn, args) -> None:
    import torch.distributed as dist
    from fold_parallel.groups import init_distributed

    torch.set_num_threads(1)
    try:
        init_distributed(
            "gloo", pg_timeout_s, f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        result: Any = fn(rank, world, *args)
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        result = RankFailed(rank, type(err).__name__, str(err), traceback.format_exc())
    torch.save(result, os.path.join(outdir, f"rank{rank}.pt"))
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer may be gone
            pass


def run_ranks(
    fn, world: int, *args, timeout_s: float = 120.0, pg_timeout_s: float = 30.0
) -> list[Any]:
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as outdir:
        procs = [
            ctx.Process(target=_entry, args=(r, world, port, pg_timeout_s, outdir, fn, args))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        results: list[Any] = []
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                p.join()
                results.append(RankFailed(r, "Timeout", f"rank {r} still running", ""))
                continue
            path = os.path.join(outdir, f"rank{r}.pt")
            if os.path.exists(path):
                results.append(torch.load(path, weights_only=False))
            else:
                results.append(RankFailed(r, "Died", f"exit code {p.exitcode}", ""))
        return results


def ok(results: list[Any]) -> list[Any]:
    """The results, after failing the test with the traceback of any rank that raised."""
    for r in results:
        if isinstance(r, RankFailed):
            msg = f"rank {r.rank} failed: {r.error_type}: {r.message}\n{r.traceback}"
            raise AssertionError(msg)
    return results


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in float64; any NaN/inf gives inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return float("inf")
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()
