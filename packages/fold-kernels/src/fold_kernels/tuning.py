"""Per-architecture launch configurations and a small cached autotuner.

One Triton source serves NVIDIA and AMD; what differs per architecture is the list of candidate
launch configurations (block sizes, ``num_warps``, ``num_stages``). :func:`arch` names the device
(``sm80``, ``sm90``, ``gfx942``, ...; ``interpreter`` under ``TRITON_INTERPRET=1``), and
:func:`pick` times each candidate once per (kernel, architecture, shape key) and remembers the
fastest, in memory and in a JSON file (``$FOLD_KERNELS_CACHE`` or
``~/.cache/fold_kernels/tuning.json``) written atomically, so later processes skip the search.
``FOLD_KERNELS_AUTOTUNE=0`` skips the search and takes the first (default) candidate.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = [
    "Config", "arch", "interpreting", "pick", "attention_configs", "gemm_configs", "cache_path",
]


@dataclass(frozen=True)
class Config:
    """A launch configuration: tile sizes plus Triton's ``num_warps`` / ``num_stages``."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    block_k: int = 32
    rows: int = 1  # EvoAttention: rows of R per program (sharing each bias tile)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def arch(device: torch.device | None = None) -> str:
    """A short name of the architecture that kernels will run on."""
    if interpreting() or not torch.cuda.is_available():
        return "interpreter"
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    if torch.version.hip:  # ROCm: CDNA / RDNA names like gfx90a, gfx942
        return str(getattr(props, "gcnArchName", "gfx")).split(":")[0]
    return f"sm{props.major}{props.minor}"


def _is_amd(name: str) -> bool:
    return name.startswith("gfx")


def attention_configs(kernel: str, name: str, head_dim: int) -> list[Config]:
    """Candidates for the EvoAttention kernels (``fwd``, ``dkdv``, ``dq``, ``dbias``).

    Tuples are (block_m, block_n, num_warps, num_stages, rows); the first is the default.
    """
    if name == "interpreter":
        # two rows per program in the interpreter too, so CPU tests cover that path
        return [Config(16, 16, 1, 1, rows=1 if kernel == "dbias" else 2)]
    table = {
        "fwd": [(64, 32, 4, 3, 1), (64, 32, 2, 3, 1), (64, 64, 4, 3, 1), (32, 32, 2, 3, 1),
                (64, 32, 4, 3, 2)],
        "dkdv": [(32, 128, 4, 3, 1), (64, 64, 4, 3, 1), (64, 64, 4, 3, 2), (32, 64, 2, 3, 1),
                 (32, 128, 4, 3, 2)],
        "dq": [(64, 32, 4, 3, 2), (64, 32, 4, 3, 1), (64, 64, 4, 3, 1), (64, 32, 2, 3, 2),
               (32, 32, 2, 3, 2)],
        "dbias": [(64, 64, 4, 3, 1), (64, 32, 4, 3, 1), (128, 128, 8, 2, 1), (32, 64, 4, 3, 1),
                  (64, 32, 2, 3, 1)],
    }[kernel]
    amd = _is_amd(name)
    out = []
    for bm, bn, w, s, rows in table:
        if head_dim > 64 and bm * bn > 8192:
            continue  # large head dims: keep register pressure in check
        out.append(Config(bm, bn, w, min(s, 2) if amd else s, rows=rows))
    return out


def gemm_configs(name: str) -> list[Config]:
    """Candidates for the fused LayerNorm+Linear and SwiGLU matrix kernels."""
    if name == "interpreter":
        return [Config(16, 16, 1, 1, 16)]
    stages = [2] if _is_amd(name) else [3, 4]
    out = []
    for bm, bn, bk, w in [(128, 128, 32, 8), (128, 64, 32, 4), (64, 128, 32, 4),
                          (128, 128, 64, 8), (64, 64, 64, 4)]:
        for s in stages:
            out.append(Config(bm, bn, w, s, bk))
    return out


_LOCK = threading.Lock()
_MEMORY: dict[str, Config] = {}
_DISK_LOADED = False


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
        for key, cfg in data.items():
            _MEMORY.setdefault(key, Config(**cfg))
    except (OSError, ValueError, TypeError):
        pass  # a missing or unreadable cache only costs a re-tune


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


def pick(kernel: str, key: tuple, candidates: Sequence[Config],
         launch: Callable[[Config], None]) -> Config:
    """The fastest of ``candidates`` for ``key``; ``launch(cfg)`` runs the kernel once.

    The launch must be idempotent (it is run repeatedly on the same buffers).
    """
    if len(candidates) == 1 or os.environ.get("FOLD_KERNELS_AUTOTUNE", "1") == "0":
        return candidates[0]  # FOLD_KERNELS_AUTOTUNE=0: the first (default) configuration
    full_key = f"{kernel}|{arch()}|{'|'.join(map(str, key))}"
    with _LOCK:
        _load_disk()
        if full_key in _MEMORY and _MEMORY[full_key] in candidates:
            return _MEMORY[full_key]
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
        _save_disk()
    return best
