"""One rank does a long job (building the feature cache) while the others wait, for as long as
the job needs; then every rank checks in, and a rank that does not is named.

A barrier or an all-reduce has the process group's timeout (300 s): rank 0 building a large
AF3 cache for longer than that used to kill the job, and a stalled peer was reported without
saying which one. :func:`run_on_rank0` waits through the process group's key-value store
instead, where nothing times out:

* rank 0 runs ``work()`` while a background thread counts heartbeats in the store; the other
  ranks poll the store for rank 0's result, printing how long they have waited now and then, and
  give up only when the heartbeats stop for ``stall_s`` (rank 0 dead or frozen), naming rank 0;
* rank 0's failure reaches every rank: rank 0 raises its own exception once every other rank
  has read it (or ``check_in_s`` has passed), the others an error that carries its message (an
  :class:`InputError` stays one);
* then the other ranks do their part (read what rank 0 wrote) and every rank checks in; a rank
  missing ``check_in_s`` after rank 0 finished is named in a :class:`RankStalled` on the ranks
  that did arrive.

Waits and timeouts are a :class:`SyncPolicy` (tests inject seconds).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch.distributed as dist
from fold_data.errors import InputError

__all__ = ["DEFAULT_POLICY", "RankStalled", "SyncPolicy", "run_on_rank0"]

T = TypeVar("T")


class RankStalled(RuntimeError):
    """A rank did not reach a synchronisation point in time (it is stalled or dead)."""


@dataclass(frozen=True)
class SyncPolicy:
    """How :func:`run_on_rank0` waits (seconds)."""

    poll_s: float = 1.0  # how often waiting ranks look at the store
    heartbeat_s: float = 5.0  # how often rank 0 proves it is alive while it works
    stall_s: float = 900.0  # no heartbeat for this long: rank 0 is stalled or dead
    check_in_s: float = 600.0  # after rank 0 finished, every rank must arrive within this
    report_s: float = 60.0  # waiting ranks print their wait this often


DEFAULT_POLICY = SyncPolicy()
_calls = {"n": 0}  # every rank calls run_on_rank0 in the same order: one key space per call


def _store():
    """The default process group's key-value store (torchrun's TCPStore, behind a prefix)."""
    return dist.distributed_c10d._get_default_store()


def _count(store, key: str) -> int:
    return int(store.add(key, 0))


class _Heartbeat(threading.Thread):
    def __init__(self, store, key: str, every_s: float):
        super().__init__(daemon=True, name="fold-rank0-heartbeat")
        self.store, self.key, self.every_s = store, key, every_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.store.add(self.key, 1)
            self.stopped.wait(self.every_s)


def _status_of(error: BaseException | None) -> str:
    if error is None:
        return json.dumps({"ok": True})
    if isinstance(error, InputError):
        return json.dumps({"ok": False, "type": "InputError", "path": error.path,
                           "record": error.record, "reason": error.reason})
    return json.dumps({"ok": False, "type": type(error).__name__, "reason": str(error)[:4000]})


def _raise_rank0_failure(status: dict, phase: str) -> None:
    if status["type"] == "InputError":
        raise InputError(status["path"], status["record"],
                         f"{status['reason']} (rank 0 failed to {phase})")
    raise RuntimeError(f"rank 0 failed to {phase}: {status['type']}: {status['reason']}")


def _wait_for_rank0(store, base: str, rank: int, phase: str, policy: SyncPolicy) -> dict:
    start = last_report = last_change = time.monotonic()
    beats = -1
    while not store.check([f"{base}/status"]):
        now = time.monotonic()
        seen = _count(store, f"{base}/beats")
        if seen != beats:
            beats, last_change = seen, now
        elif now - last_change > policy.stall_s:
            raise RankStalled(
                f"rank 0 stopped reporting progress while it was to {phase}: no heartbeat for "
                f"{now - last_change:.0f} s (waited {now - start:.0f} s in all); rank 0 is "
                "stalled or dead (its output says why)")
        if now - last_report >= policy.report_s:
            last_report = now
            print(f"fold-train: rank {rank} waiting for rank 0 to {phase} "
                  f"({now - start:.0f} s)", file=sys.stderr, flush=True)
        time.sleep(policy.poll_s)
    return json.loads(store.get(f"{base}/status").decode())


def _wait_for_acks(store, base: str, world: int, policy: SyncPolicy) -> None:
    """Rank 0, after reporting its failure: wait until every other rank has read it (at most
    ``check_in_s``). Rank 0's exit ends the job (torchrun stops the other ranks, and its store
    may go with it), so a rank still polling would die without the message."""
    deadline = time.monotonic() + policy.check_in_s
    while (_count(store, f"{base}/failure_seen") < world - 1
           and time.monotonic() < deadline):
        time.sleep(policy.poll_s)


def _check_in(store, base: str, rank: int, world: int, phase: str, policy: SyncPolicy) -> None:
    store.set(f"{base}/rank/{rank}", "1")
    store.add(f"{base}/arrived", 1)
    deadline = time.monotonic() + policy.check_in_s
    while _count(store, f"{base}/arrived") < world:
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([f"{base}/rank/{r}"])]
            raise RankStalled(
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not "
                f"arrive within {policy.check_in_s:.0f} s after rank 0 finished to {phase} "
                f"(rank {rank} waited for {'them' if len(missing) > 1 else 'it'}): stalled or "
                "dead; see that rank's output")
        time.sleep(policy.poll_s)


def run_on_rank0(ctx, phase: str, work: Callable[[], T], *, after: Callable[[], T] | None = None,
                 policy: SyncPolicy | None = None) -> T | None:
    """Run ``work()`` on rank 0 of ``ctx`` (a :class:`~fold_train.distributed.DistContext`)
    while every other rank waits as long as it takes, then ``after()`` on the other ranks (e.g.
    read the index rank 0 wrote) before all check in; returns ``work()``'s result on rank 0,
    ``after()``'s (None without it) on the others. ``phase`` completes "rank 0 ... to {phase}"
    in messages ("build the AF3 cache").

    Raises on every rank when rank 0 fails (its exception there; on the others an
    :class:`InputError` or ``RuntimeError`` with its message), and :class:`RankStalled` naming
    rank 0 when its heartbeats stop, or naming the ranks that do not check in afterwards.
    Single process: just ``work()``."""
    if not ctx.distributed:
        return work()
    policy = policy or DEFAULT_POLICY
    _calls["n"] += 1
    base = f"fold_rank_sync/{_calls['n']}"
    store = _store()
    if ctx.is_main:
        beat = _Heartbeat(store, f"{base}/beats", policy.heartbeat_s)
        beat.start()
        result, error = None, None
        try:
            result = work()
        except Exception as e:  # reported to the others, then raised here
            error = e
        finally:
            beat.stopped.set()
        store.set(f"{base}/status", _status_of(error))
        if error is not None:
            _wait_for_acks(store, base, ctx.world_size, policy)
            raise error
    else:
        status = _wait_for_rank0(store, base, ctx.rank, phase, policy)
        if not status["ok"]:
            store.add(f"{base}/failure_seen", 1)  # rank 0 may exit now: its message is here
            _raise_rank0_failure(status, phase)
        result = after() if after is not None else None
    _check_in(store, base, ctx.rank, ctx.world_size, phase, policy)
    return result
