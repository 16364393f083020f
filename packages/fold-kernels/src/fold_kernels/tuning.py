"""Per-architecture launch configurations and a small cached autotuner.

One Triton source serves NVIDIA and AMD; what differs per architecture is the list of candidate
launch configurations (block sizes, ``num_warps``, ``num_stages``). :func:`arch` names the device
(``sm80``, ``sm90``, ``gfx942``, ...; ``interpreter`` under ``TRITON_INTERPRET=1``), and
:func:`pick` times each candidate once per (kernel, architecture, shape bucket) and remembers the
fastest, in memory and in a JSON file (``$FOLD_KERNELS_CACHE`` or
``~/.cache/fold_kernels/tuning.json``) written atomically, so later processes skip the search.
Sizes in a key are bucketed (:func:`bucket`), so training with varying crops tunes a handful of
keys; an unreadable cache file is ignored with a warning and rewritten by the next search.
``FOLD_KERNELS_AUTOTUNE=0`` skips the search and takes the first (default) candidate.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from fold_ops.env import EnvVar

from fold_kernels.ints import next_power_of_2

__all__ = [
    "Config", "arch", "interpreting", "pick", "attention_configs", "gemm_configs", "cache_path",
    "multiprocessors", "bucket", "bucket_key", "pinned", "chosen",
]


@dataclass(frozen=True)
class Config:
    """A launch configuration: tile sizes plus Triton's ``num_warps`` / ``num_stages``."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    block_k: int = 32
    rows: int = 1  # EvoAttention: rows of R per program (1 or 2; sharing each bias tile)
    transpose: bool = False  # EvoAttention dK/dV: key-major tiles (S^T = K Q^T)
    acc_tile: bool = False  # LayerNorm backward: dw / db partial sums as row tiles


_INTERPRET = EnvVar("TRITON_INTERPRET", lambda v: (v or "0") not in ("", "0"))
_AUTOTUNE = EnvVar("FOLD_KERNELS_AUTOTUNE", lambda v: (v if v is not None else "1") != "0")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return _INTERPRET.get()


def require_device(op: str, x: torch.Tensor, cpu_path: str | None = None) -> None:
    """Refuse a tensor the Triton kernels cannot run on: CUDA/ROCm, or any tensor under the
    interpreter. ``cpu_path`` names what to call on CPU instead."""
    if not (x.is_cuda or interpreting()):
        hint = f"; {cpu_path} is the CPU path" if cpu_path else ""
        raise RuntimeError(f"fold_kernels.{op} needs CUDA/ROCm tensors (or TRITON_INTERPRET=1)"
                           f"{hint}")


_ARCH: dict[tuple[bool, int | None], str] = {}


def arch(device: torch.device | None = None) -> str:
    """A short name of the architecture that kernels will run on (memoised per device; the
    current device when ``device`` is None or has no index)."""
    interp = interpreting()
    index = device.index if isinstance(device, torch.device) else device
    if index is None and not interp and torch.cuda.is_available():
        # Memoised under the current device's index: reading the device's properties costs
        # tens of microseconds, and arch() is asked on every kernel launch of an eager step.
        index = torch.cuda.current_device()
    name = _ARCH.get((interp, index))
    if name is not None:
        return name
    if interp or not torch.cuda.is_available():
        name = "interpreter"
    else:
        props = torch.cuda.get_device_properties(index)
        if torch.version.hip:  # ROCm: CDNA / RDNA names like gfx90a, gfx942
            name = str(getattr(props, "gcnArchName", "gfx")).split(":")[0]
        else:
            name = f"sm{props.major}{props.minor}"
    _ARCH[(interp, index)] = name
    return name


_SMS: dict[int, int] = {}


def multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessor (compute unit) count, memoised per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    n = _SMS.get(index)
    if n is None:
        n = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def _is_amd(name: str) -> bool:
    return name.startswith("gfx")


def attention_configs(kernel: str, name: str, head_dim: int,
                      itemsize: int = 4) -> list[Config]:
    """Candidates for the EvoAttention kernels (memoised; see :func:`_attention_configs`)."""
    return list(_attention_configs(kernel, name, head_dim, itemsize))


# Forward tiles for head dims 17-32 in 2-byte dtypes (bf16, fp16): 128-query tiles halve the L2
# traffic of K and V per logit (4 D / BLOCK_M bytes). Their shared memory fits an H100's 227 KB
# in bf16, not always in fp32, hence the dtype filter. Of eleven such candidates timed on an
# H100 (benchmarks/results/kernels/kernels_attention_fwd_sweep.md: triangle N 256-1536, MSA
# rows) only these two were the fastest forward anywhere (triangle N 384: 0.381 ms against the
# base list's best 0.432); 8 warps, 128-key blocks and four rows per program lost everywhere,
# up to 2x, and each candidate costs every new shape a compile and a timing.
_FWD_HALF_D32 = [(128, 64, 4, 3, 1), (128, 64, 4, 3, 2)]


@functools.cache
def _attention_configs(kernel: str, name: str, head_dim: int,
                       itemsize: int = 4) -> tuple[Config, ...]:
    """Candidates for the EvoAttention kernels (``fwd``, ``dkdv``, ``dkdv_atomic``, ``dq``,
    ``dbias``; ``dkdv_dq`` and ``dkdv_atomic_dq``: dK/dV adding dQ by atomics too), for inputs
    of ``itemsize`` bytes (4: every candidate fits fp32).

    Tuples are (block_m, block_n, num_warps, num_stages, rows[, transpose]); the first is the
    default. The dK/dV kernels have query-major and key-major (``transpose``) candidates.
    """
    if name == "interpreter":
        # two rows per program in the interpreter too, so CPU tests cover that path (dK/dV:
        # key-major tiles; FOLD_EVO_DKDV=query makes them query-major)
        return (Config(16, 16, 1, 1, rows=1 if kernel == "dbias" else 2,
                       transpose=kernel.startswith("dkdv")),)
    table = {
        "fwd": [(64, 32, 4, 3, 1), (64, 32, 2, 3, 1), (64, 64, 4, 3, 1), (32, 32, 2, 3, 1),
                (64, 32, 4, 3, 2)],
        "dkdv": [(32, 128, 4, 3, 1), (64, 128, 4, 3, 1), (64, 64, 4, 3, 1), (64, 64, 4, 3, 2),
                 (32, 64, 2, 3, 1), (32, 128, 4, 3, 2)],
        # dK/dV with the bias gradient added by atomics (FOLD_EVO_DBIAS=atomic); the first
        # is dkdv's default, which fits in shared memory for every dtype and head dim <= 128
        "dkdv_atomic": [(32, 128, 4, 3, 1), (64, 64, 4, 3, 2), (64, 64, 4, 3, 1),
                        (64, 128, 4, 3, 1), (32, 64, 2, 3, 2), (32, 128, 4, 3, 2),
                        (128, 64, 8, 3, 2)],
        # dK/dV adding dQ by atomics as well (FOLD_EVO_DQ=atomic); the first fits every dtype
        # and head dim (an H100 picked 64 x 64 query-major tiles at D 32, 64 x 128 at D 8)
        "dkdv_dq": [(32, 128, 4, 3, 1), (64, 64, 4, 3, 2), (64, 64, 4, 3, 1), (64, 128, 4, 3, 1),
                    (64, 128, 8, 3, 1), (128, 128, 8, 3, 1), (32, 128, 4, 3, 2)],
        "dkdv_atomic_dq": [(32, 128, 4, 3, 1), (64, 64, 4, 3, 2), (64, 64, 4, 3, 1),
                           (64, 128, 4, 3, 1), (64, 128, 8, 3, 1), (128, 128, 8, 3, 1),
                           (32, 128, 4, 3, 2), (128, 64, 8, 3, 2)],
        "dq": [(64, 32, 4, 3, 2), (64, 32, 4, 3, 1), (64, 64, 4, 3, 1), (64, 32, 2, 3, 2),
               (32, 32, 2, 3, 2)],
        "dbias": [(64, 32, 4, 3, 1), (64, 64, 4, 3, 1), (64, 128, 4, 2, 1), (128, 128, 8, 2, 1),
                  (32, 64, 4, 3, 1), (64, 32, 2, 3, 1)],
        # the forward with its own key length (evo_attention_cross; AF3's atom windows: 32
        # queries, 128 keys, rows = the samples sharing a window's bias)
        "fwd_cross": [(32, 64, 4, 3, 1), (32, 128, 4, 3, 1), (32, 64, 4, 3, 2),
                      (32, 128, 4, 3, 2), (32, 32, 2, 3, 2), (64, 64, 4, 3, 1),
                      (16, 64, 2, 3, 1)],
    }[kernel]
    if kernel == "fwd" and head_dim <= 16:
        # head dims padded to 16 (extra MSA, D 8): the products are cheap, the per-tile row
        # statistics dominate, and 128-query tiles with a deeper pipeline won on an H100
        # (128 x 32, 4 warps, 4 stages: 7-9% faster forward at R 1024-5120, N 256-384). At D 32
        # they did not win (and a noisy pick cost 7% at N 768), so they are offered only here.
        table = [*table, (128, 32, 4, 4, 1), (128, 64, 4, 3, 1), (128, 64, 8, 3, 1),
                 (64, 64, 4, 4, 2), (128, 128, 8, 3, 1)]
    elif kernel == "fwd" and head_dim <= 32 and itemsize <= 2:
        table = [*table, *_FWD_HALF_D32]
    amd = _is_amd(name)
    out = []
    if kernel.startswith("dkdv"):
        # key-major tiles (block_n rows of keys) x (block_m queries), one or two rows of R
        # (query-major first: the default must fit every dtype and head dim; 64 x 64 two-row
        # key-major tiles need 264 KB of shared memory for fp32 at D 64)
        table = [*table[:1], (32, 128, 4, 3, 1, True), (64, 64, 4, 3, 2, True),
                 (64, 128, 4, 3, 1, True), (64, 64, 4, 3, 1, True), (128, 64, 8, 3, 2, True),
                 (64, 128, 8, 3, 2, True), *table[1:]]
    for bm, bn, w, s, rows, *t in table:
        if head_dim > 64 and bm * bn > 8192:
            continue  # large head dims: keep register pressure in check
        out.append(Config(bm, bn, w, min(s, 2) if amd else s, rows=rows,
                          transpose=bool(t and t[0])))
    return tuple(out)


def gemm_configs(name: str) -> list[Config]:
    """Candidates for the fused LayerNorm+Linear and SwiGLU matrix kernels."""
    return list(_gemm_configs(name))


@functools.cache
def _gemm_configs(name: str) -> tuple[Config, ...]:
    if name == "interpreter":
        return (Config(16, 16, 1, 1, 16),)
    stages = [2] if _is_amd(name) else [3, 4]
    out = []
    for bm, bn, bk, w in [(128, 128, 32, 8), (128, 64, 32, 4), (64, 128, 32, 4),
                          (128, 128, 64, 8), (64, 64, 64, 4)]:
        for s in stages:
            out.append(Config(bm, bn, w, s, bk))
    return tuple(out)


_LOCK = threading.Lock()
_MEMORY: dict[str, Config] = {}
_DISK_LOADED = False
# (kernel, arch, key) -> (choice, the candidates it was chosen from), this process
_PICKED: dict[tuple, tuple[Config, Sequence[Config]]] = {}


def cache_path() -> Path:
    env = os.environ.get("FOLD_KERNELS_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "fold_kernels" / "tuning.json"


def _load_disk() -> None:
    global _DISK_LOADED
    if _DISK_LOADED:
        return
    _DISK_LOADED = True
    try:
        data = json.loads(cache_path().read_text())
        loaded = {key: Config(**cfg) for key, cfg in data.items()}
    except FileNotFoundError:
        return  # no cache yet
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        import warnings

        # the file is rewritten whole by the next search; until then kernels are re-tuned
        warnings.warn(f"fold_kernels: ignoring the unreadable autotune cache {cache_path()} "
                      f"({type(exc).__name__}: {exc}); kernels will be tuned again",
                      RuntimeWarning, stacklevel=3)
        return
    for key, cfg in loaded.items():
        _MEMORY.setdefault(key, cfg)


def _save_disk() -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning.", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({k: asdict(v) for k, v in _MEMORY.items()}, f, indent=0, sort_keys=True)
        os.replace(tmp, path)  # atomic: readers see the old or the new file, never half
    except OSError:
        pass


def bucket(n: int) -> int:
    """The shape bucket of a size in an autotune key: ``n`` up to 64, else ``n`` rounded up to
    the next ``2^k`` or ``3 * 2^(k-1)`` (64, 96, 128, 192, 256, 384, 512, 768, ...). A crop of 300
    or 320 tokens reuses the choice timed for 384: the best tiles change with the order of
    magnitude of a size, not with every size, and a run with varying crops tunes a handful of
    keys instead of one per crop."""
    if n <= 64:
        return n
    p = next_power_of_2(n)
    return p * 3 // 4 if n <= p * 3 // 4 else p


def bucket_key(key: tuple) -> tuple:
    """``key`` with every int (sizes, strides) replaced by its :func:`bucket` (bools and
    other values unchanged)."""
    return tuple(bucket(v) if type(v) is int else v for v in key)


_PINNED: dict[str, Config] = {}


@contextlib.contextmanager
def pinned(kernel: str, cfg: Config):
    """Within the block, :func:`pick` returns ``cfg`` for ``kernel`` (for example
    ``"evo_fwd"``) without timing or caching anything: how a benchmark times each candidate of
    a kernel through the op itself, and how a test runs one candidate."""
    before = _PINNED.get(kernel)
    _PINNED[kernel] = cfg
    try:
        yield cfg
    finally:
        if before is None:
            del _PINNED[kernel]
        else:
            _PINNED[kernel] = before


def chosen(kernel: str) -> dict[tuple, Config]:
    """This process's choices for ``kernel`` (for example ``"evo_fwd"``): the key each launch
    was tuned under -> the configuration picked (for a benchmark's record)."""
    return {key: cfg for (k, _, key), (cfg, _) in list(_PICKED.items()) if k == kernel}


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def pick(kernel: str, key: tuple, candidates: Sequence[Config],
         launch: Callable[[Config], None]) -> Config:
    """The fastest of ``candidates`` for ``key``; ``launch(cfg)`` runs the kernel once.

    The launch must be idempotent (it is run repeatedly on the same buffers).
    """
    if _PINNED and kernel in _PINNED:
        return _PINNED[kernel]
    if len(candidates) == 1 or not _AUTOTUNE.get():
        return candidates[0]  # FOLD_KERNELS_AUTOTUNE=0: the first (default) configuration
    name = arch()
    hit = _PICKED.get((kernel, name, key))
    # this process already chose: no string key, lock or disk cache; the callers pass memoised
    # candidate tuples, so the identity test usually spares comparing configurations
    if hit is not None and (hit[1] is candidates or hit[0] in candidates):
        return hit[0]
    full_key = f"{kernel}|{name}|{'|'.join(map(str, bucket_key(key)))}"
    with _LOCK:
        _load_disk()
        if full_key in _MEMORY and _MEMORY[full_key] in candidates:
            _PICKED[(kernel, name, key)] = (_MEMORY[full_key], candidates)
            return _MEMORY[full_key]
    if _capturing():
        # Timing launches synchronizes, which invalidates a CUDA graph capture (and the error
        # would surface later, far from here): take the default, without caching it.
        return candidates[0]
    from triton.testing import do_bench

    best, best_ms = candidates[0], float("inf")
    for cfg in candidates:
        try:
            ms = do_bench(lambda cfg=cfg: launch(cfg), warmup=5, rep=20, return_mode="median")
        except Exception:  # a config that does not fit (shared memory, registers) is skipped
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    with _LOCK:
        _MEMORY[full_key] = best
        _PICKED[(kernel, name, key)] = (best, candidates)
        _save_disk()
    return best
