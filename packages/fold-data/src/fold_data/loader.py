"""Non-blocking data loader (ScaleFold section 3.2, "Non-Blocking Data Pipeline").

PyTorch's DataLoader yields batches in sampler order, so one slow sample (a deep MSA, a large
complex) stalls the training step even when later samples are ready. Here worker processes
prepare samples and send them back over a queue; the consumer keeps the ready ones in a priority
queue keyed by their position in the epoch and always yields the smallest-position *ready* sample,
never waiting for a missing one. Order is therefore best-effort: in order when preparation keeps
up, out of order only when waiting would idle the consumer. ``strict_order=True`` restores exact
order (what DataLoader does), for evaluation or debugging.

* Bounded prefetch: at most ``prefetch`` samples are dispatched to workers and not yet yielded.
* Workers share one task queue, so an idle worker always takes the next task (a slow sample
  occupies one worker, not a round-robin slot).
* A failing ``prepare_fn`` raises :class:`LoaderError` in the consumer, naming the sample and
  carrying the worker's traceback; a worker process that dies (``os._exit``, a segfault, the OOM
  killer) is noticed by a liveness check every ``poll_interval`` seconds and raised the same way.
* Epochs: each ``iter()`` is a new epoch; ``shuffle=True`` permutes with a generator seeded by
  ``(seed, epoch)``; ``pass_seed=True`` gives ``prepare_fn`` a per-sample seed derived from
  ``(seed, epoch, index)``, so results do not depend on which worker ran the sample.
* No torch: samples are any picklable object (dicts of numpy arrays), pickled with protocol 5.
  Large array buffers (>= ``shm_min_bytes``) travel out of band through files in ``/dev/shm``
  (Linux shared memory): the worker writes them once, the consumer maps them copy-on-write and
  unpickles the arrays on top of the mapping without copying, instead of pushing every byte
  through a pipe. Where ``/dev/shm`` is missing, or a write fails (full), the buffers go in band.
"""

from __future__ import annotations

import glob
import heapq
import mmap
import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LoaderError", "LoaderStats", "NonBlockingLoader"]

_IDLE = -1
_SHM_DIR = "/dev/shm"
_ALIGN = 64  # byte alignment of each out-of-band buffer in a shared-memory file


class LoaderError(RuntimeError):
    """A sample could not be prepared: ``prepare_fn`` raised, or its worker process died."""

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        index: int | None = None,
        worker_traceback: str | None = None,
    ):
        self.name = name
        self.index = index
        self.worker_traceback = worker_traceback
        if worker_traceback:
            message = f"{message}\n--- worker traceback ---\n{worker_traceback.rstrip()}"
        super().__init__(message)


@dataclass
class LoaderStats:
    """Consumer-side counters (cumulative over epochs)."""

    samples: int = 0
    wait_s: float = 0.0  # time the consumer spent blocked in next() waiting for any sample
    out_of_order: int = 0  # samples yielded before a smaller-position sample was ready


def _sample_seed(seed: int, epoch: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


# A pickled sample: (pickle bytes, shared-memory file or None, [(offset, nbytes)] of its buffers).
Encoded = tuple[bytes, str | None, list[tuple[int, int]]]


def _encode(sample: Any, shm_path: str | None, min_bytes: int) -> Encoded:
    """Pickle ``sample``; buffers of >= ``min_bytes`` go to the file ``shm_path`` if given."""
    if shm_path is None:
        return pickle.dumps(sample, protocol=5), None, []
    large: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < min_bytes:
            return True  # small: in band
        large.append(buf)
        return False

    data = pickle.dumps(sample, protocol=5, buffer_callback=out_of_band)
    if not large:
        return data, None, []
    layout, offset = [], 0
    for buf in large:
        layout.append((offset, buf.raw().nbytes))
        offset += -(-buf.raw().nbytes // _ALIGN) * _ALIGN
    try:
        fd = os.open(shm_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as f:  # plain writes: a full tmpfs is an OSError, not SIGBUS
            for buf, (off, _) in zip(large, layout):
                f.seek(off)
                f.write(buf.raw())
            f.truncate(offset)
    except OSError:
        if os.path.exists(shm_path):
            os.unlink(shm_path)
        return pickle.dumps(sample, protocol=5), None, []
    return data, shm_path, layout


def _decode(encoded: Encoded) -> Any:
    """Unpickle; out-of-band buffers are views of a private (copy-on-write) mapping."""
    data, shm_path, layout = encoded
    if shm_path is None:
        return pickle.loads(data)
    fd = os.open(shm_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
    finally:
        os.close(fd)
        os.unlink(shm_path)  # the mapping outlives the name; freed with the last array
    view = memoryview(mapping) if mapping is not None else memoryview(b"")
    return pickle.loads(data, buffers=[view[off:off + n] for off, n in layout])


def _discard(encoded: Any) -> None:
    """Free the shared memory of a result that will never be decoded."""
    if isinstance(encoded, tuple) and len(encoded) == 3 and encoded[1] is not None:
        try:
            os.unlink(encoded[1])
        except OSError:
            pass


def _worker_loop(
    worker_id: int,
    prepare_fn: Callable[..., Any],
    pass_seed: bool,
    worker_init_fn: Callable[[int], None] | None,
    task_q: Any,
    result_q: Any,
    current: Any,
    started: Any,
    shm_prefix: str | None,
    shm_min_bytes: int,
    parent: int,
) -> None:
    """Worker process: take (epoch, pos, index, item, seed) tasks until the None sentinel, or
    until the consumer (pid ``parent``, passed in: it may die before this process starts) is
    gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
    count = 0
    while True:
        raw = _next_task(task_q, parent)
        if raw is _PARENT_GONE:  # killed consumer: free what it will never read, then exit
            result_q.cancel_join_thread()
            _unlink_matching(f"{shm_prefix}-{worker_id}-" if shm_prefix else None)
            return
        if raw is None:
            result_q.cancel_join_thread()  # results nobody will read must not block the exit
            return
        epoch, pos, index, item, seed = pickle.loads(raw)
        # Published so that the consumer can name the sample if this process dies.
        started[worker_id] = time.monotonic()  # system-wide clock: comparable across processes
        current[2 * worker_id], current[2 * worker_id + 1] = epoch, pos
        count += 1
        shm_path = None if shm_prefix is None else f"{shm_prefix}-{worker_id}-{count}"
        try:
            sample = prepare_fn(item, seed) if pass_seed else prepare_fn(item)
            msg = (epoch, pos, True, _encode(sample, shm_path, shm_min_bytes))
        except Exception as e:
            detail = (f"worker {worker_id} pid {os.getpid()}: {type(e).__name__}: {e}",
                      traceback.format_exc())
            msg = (epoch, pos, False, detail)
        result_q.put(msg)
        current[2 * worker_id] = current[2 * worker_id + 1] = _IDLE


_PARENT_GONE = object()
_PARENT_POLL_S = 1.0


def _next_task(task_q: Any, parent: int) -> Any:
    """The next task, or ``_PARENT_GONE`` once the consumer process has died (re-parented), so
    a worker never waits forever on a queue nobody will fill (SIGKILL of the consumer)."""
    while True:
        try:
            return task_q.get(timeout=_PARENT_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return _PARENT_GONE


def _unlink_matching(prefix: str | None) -> None:
    if prefix is None:
        return
    for path in glob.glob(glob.escape(prefix) + "*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def _shutdown(
    procs: list, task_q: Any, result_q: Any, shm_prefix: str | None, join_s: float = 2.0
) -> None:
    """Stop the workers (sentinel, bounded join, then terminate/kill); free shared memory."""
    for p in procs:
        if p.is_alive():
            try:
                task_q.put(None)
            except (OSError, ValueError):
                break
    deadline = time.monotonic() + join_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()
    for q in (task_q, result_q):
        q.cancel_join_thread()
        q.close()
    if shm_prefix is not None:  # results never consumed, or a worker killed mid-write
        _unlink_matching(shm_prefix + "-")


class NonBlockingLoader:
    """Iterate over ``prepare_fn(item)`` for every item, computed by worker processes.

    ``items`` is a dataset length (items are then the indices ``0..n-1``) or a sequence of
    picklable items. ``prepare_fn`` must be picklable (a module-level function); with
    ``pass_seed=True`` it is called as ``prepare_fn(item, seed)``. ``names[i]`` names item ``i``
    in errors. ``timeout`` (seconds, None = no limit) bounds the time a worker may spend on one
    sample (a hung sample raises :class:`LoaderError` naming it).
    ``mp_context`` is "spawn" (default, safe next to threads and CUDA), "forkserver" or "fork".
    ``shared_memory`` (default: where ``/dev/shm`` exists) moves array buffers of at least
    ``shm_min_bytes`` through shared memory instead of the result pipe.
    """

    def __init__(
        self,
        items: int | Sequence[Any],
        prepare_fn: Callable[..., Any],
        *,
        workers: int = 4,
        prefetch: int = 8,
        strict_order: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        names: Sequence[str] | None = None,
        pass_seed: bool = False,
        mp_context: str = "spawn",
        timeout: float | None = None,
        poll_interval: float = 0.2,
        worker_init_fn: Callable[[int], None] | None = None,
        shared_memory: bool | None = None,
        shm_min_bytes: int = 1 << 16,
    ):
        self._items: Sequence[Any] = range(items) if isinstance(items, int) else list(items)
        if names is not None and len(names) != len(self._items):
            raise ValueError(f"names has {len(names)} entries for {len(self._items)} items")
        if workers < 1 or prefetch < 1:
            raise ValueError(f"workers and prefetch must be >= 1, got {workers} and {prefetch}")
        self.prepare_fn = prepare_fn
        self.workers = workers
        self.prefetch = prefetch
        self.strict_order = strict_order
        self.shuffle = shuffle
        self.seed = seed
        self.names = None if names is None else list(names)
        self.pass_seed = pass_seed
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.worker_init_fn = worker_init_fn
        if shared_memory is None:
            shared_memory = os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK)
        self._shm_prefix = (
            os.path.join(_SHM_DIR, f"fold-data-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            if shared_memory else None
        )
        self.shm_min_bytes = max(1, shm_min_bytes)
        self.stats = LoaderStats()
        self._ctx = mp.get_context(mp_context)
        self._epoch = 0
        self._active_epoch = -1
        self._procs: list = []
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __enter__(self) -> NonBlockingLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (also done on garbage collection and at interpreter exit)."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` runs (it drives the shuffle and the per-sample seeds)."""
        self._epoch = epoch

    def _start(self) -> None:
        self._task_q = self._ctx.Queue()
        self._result_q = self._ctx.Queue()
        # Per worker: (epoch, position) of the sample in progress, or _IDLE.
        self._current = self._ctx.RawArray("q", [_IDLE] * (2 * self.workers))
        self._started = self._ctx.RawArray("d", self.workers)  # when the current sample began
        for wid in range(self.workers):
            p = self._ctx.Process(
                target=_worker_loop,
                args=(wid, self.prepare_fn, self.pass_seed, self.worker_init_fn,
                      self._task_q, self._result_q, self._current, self._started,
                      self._shm_prefix,
                      self.shm_min_bytes, os.getpid()),
                name=f"fold-data-loader-{wid}",
                daemon=True,
            )
            p.start()
            self._procs.append(p)
        self._finalizer = weakref.finalize(
            self, _shutdown, self._procs, self._task_q, self._result_q, self._shm_prefix
        )

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("NonBlockingLoader is closed")
        if not self._procs:
            self._start()
        epoch = self._epoch
        self._epoch += 1
        self._active_epoch = epoch
        return self._iterate(epoch)

    def _name(self, index: int) -> str:
        if self.names is not None:
            return self.names[index]
        item = self._items[index]
        return item if isinstance(item, str) else f"index {index}"

    def _drain_stale_tasks(self) -> None:
        """Drop tasks of an abandoned epoch that no worker has taken yet."""
        while True:
            try:
                self._task_q.get_nowait()
            except queue.Empty:
                return

    def _iterate(self, epoch: int) -> Iterator[Any]:
        n = len(self._items)
        order = np.arange(n)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
        self._drain_stale_tasks()
        # Heap of (position, ok, pickled sample or (error summary, traceback)).
        ready: list[tuple[int, bool, Any]] = []
        dispatched = 0
        yielded = 0
        first_missing = 0  # smallest position not yet yielded
        yielded_later: set[int] = set()  # yielded positions above first_missing
        try:
            while yielded < n:
                if self._active_epoch != epoch:
                    raise RuntimeError("a newer iteration over this loader started; this is stale")
                # Bounded prefetch: dispatched-but-not-yielded <= prefetch.
                while dispatched < n and dispatched - yielded < self.prefetch:
                    index = int(order[dispatched])
                    seed = _sample_seed(self.seed, epoch, index) if self.pass_seed else None
                    task = (epoch, dispatched, index, self._items[index], seed)
                    self._task_q.put(pickle.dumps(task, protocol=5))
                    dispatched += 1
                self._collect(epoch, order, ready, block=False)
                while not self._can_yield(ready, yielded):
                    t0 = time.perf_counter()
                    self._collect(epoch, order, ready, block=True)
                    self.stats.wait_s += time.perf_counter() - t0
                pos, ok, payload = heapq.heappop(ready)
                index = int(order[pos])
                if not ok:  # raised in its turn, so strict order yields every sample before it
                    summary, tb = payload
                    raise self._error(index, f"failed in a worker: {summary}", tb)
                if pos == first_missing:
                    first_missing += 1
                    while first_missing in yielded_later:
                        yielded_later.remove(first_missing)
                        first_missing += 1
                else:  # a smaller position is still being prepared: yielded out of order
                    yielded_later.add(pos)
                    self.stats.out_of_order += 1
                yielded += 1
                self.stats.samples += 1
                try:
                    sample = _decode(payload)
                except Exception as e:
                    what = f"could not be unpickled in the consumer: {type(e).__name__}: {e}"
                    raise self._error(index, what) from e
                yield sample
        finally:  # an abandoned or failed epoch: free what was prepared but not yielded
            for _, ok, payload in ready:
                if ok:
                    _discard(payload)

    def _error(self, index: int, what: str, tb: str | None = None) -> LoaderError:
        name = self._name(index)
        return LoaderError(f"sample {name!r} (index {index}) {what}", name=name, index=index,
                           worker_traceback=tb)

    def _can_yield(self, ready: list[tuple[int, bool, Any]], yielded: int) -> bool:
        if not ready:
            return False
        # Strict: positions are yielded 0, 1, 2, ... so the next one is position `yielded`.
        return not self.strict_order or ready[0][0] == yielded

    def _collect(self, epoch: int, order: np.ndarray, ready: list, *, block: bool) -> None:
        """Move every finished sample into the heap; with ``block``, wait for at least one."""
        while True:
            try:
                if block:
                    msg = self._result_q.get(timeout=self.poll_interval)
                else:
                    msg = self._result_q.get_nowait()
            except queue.Empty:
                if not block:
                    return
                self._check_workers(epoch, order)
                if self.timeout is not None:
                    self._check_timeout(epoch, order)
                continue
            msg_epoch, pos, ok, payload = msg
            if msg_epoch != epoch:
                if ok:
                    _discard(payload)
                continue  # a leftover of an abandoned epoch
            heapq.heappush(ready, (pos, ok, payload))
            block = False  # got one; now only drain what is already there

    def _in_progress(self, epoch: int, order: np.ndarray) -> dict[int, int]:
        """{worker id: dataset index} of the samples the workers are preparing for this epoch."""
        out = {}
        for wid in range(self.workers):
            e, pos = self._current[2 * wid], self._current[2 * wid + 1]
            if e == epoch and pos != _IDLE:
                out[wid] = int(order[pos])
        return out

    def _check_workers(self, epoch: int, order: np.ndarray) -> None:
        for wid, p in enumerate(self._procs):
            if p.exitcode is None:
                continue
            e, pos = self._current[2 * wid], self._current[2 * wid + 1]
            code = p.exitcode
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            self.close()
            if e == epoch and pos != _IDLE:
                index = int(order[pos])
                name = self._name(index)
                raise LoaderError(
                    f"worker {wid} (pid {p.pid}) died with {how} while preparing sample "
                    f"{name!r} (index {index})", name=name, index=index,
                )
            raise LoaderError(f"worker {wid} (pid {p.pid}) died with {how}")

    def _check_timeout(self, epoch: int, order: np.ndarray) -> None:
        now = time.monotonic()
        for wid, index in self._in_progress(epoch, order).items():
            elapsed = now - self._started[wid]
            if elapsed > self.timeout:
                raise self._error(
                    index, f"still not ready after {elapsed:.1f} s in worker {wid} "
                    f"(timeout {self.timeout} s)"
                )
