"""Helpers shared by the multi-GPU benchmarks (``parallel/dap_bp.py``, ``parallel/scaling.py``):
timing with peak memory, the out-of-memory guard, Evoformer inputs and the BP-block test (the
full training step is ``fold_train.Trainer``'s, driven by ``parallel/scaling.py``)."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast_bf16(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA; a no-op context on CPU (gloo smoke runs stay fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def timed(
    fn: Callable[[], Any],
    device: torch.device,
    reps: int,
    count_syncs: bool = True,
    warmup: bool = True,
) -> tuple[float, float | None, float, int | None]:
    """(median ms, peak MiB, median host ms, host syncs) of ``fn`` after one warm-up call.

    Host ms is the time until ``fn`` returns, before the device synchronisation: close to the
    wall time means the CPU (Python, launches, host synchronisations) bounds the step, well below
    means the GPU does. Host syncs: the synchronising CUDA calls of one more step, counted with
    ``torch.cuda.set_sync_debug_mode("warn")`` (None on CPU or without ``count_syncs``).
    ``warmup=False`` when the caller has already warmed up (peak memory still restarts here).
    """
    if warmup:
        fn()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, host = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    peak = peak_mib(device)
    syncs = None
    if device.type == "cuda" and count_syncs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        sync(device)
    return statistics.median(times), peak, statistics.median(host), syncs


def guard_oom(fn: Callable[[], Any], device: torch.device) -> Any:
    """``fn()``, or ``"OOM"`` when the GPU runs out of memory (cache emptied for the next run)."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"


def evoformer_inputs(cfg, n_res: int, n_seq: int, device: torch.device, grad: bool):
    """Random ``m [1, N_seq, N_res, C_m]``, ``z [1, N_res, N_res, C_z]`` and all-ones masks."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(1, n_seq, n_res, cfg.c_m, generator=g).to(device).requires_grad_(grad)
    z = torch.randn(1, n_res, n_res, cfg.c_z, generator=g).to(device).requires_grad_(grad)
    msa_mask = torch.ones(1, n_seq, n_res, device=device)
    pair_mask = torch.ones(1, n_res, n_res, device=device)
    return m, z, msa_mask, pair_mask


def has_branches(stack: torch.nn.Module) -> bool:
    """Whether ``stack``'s blocks are Parallel Evoformer blocks (what BP splits)."""
    return hasattr(stack, "blocks") and hasattr(stack.blocks[0], "msa_branch")

