"""How the single-GPU benchmarks time a call: the median of several, measured with CUDA events on
a GPU (device time between two events, no host synchronisation inside the call) and with
``time.perf_counter`` on CPU (smoke runs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], device: torch.device, reps: int,
              warmup: int = 1) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after ``warmup`` untimed calls (kernel
    compilation, autotuning, allocator)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def alternating_rounds(settings: dict[str, tuple[Callable[[], object], Callable[[], object]]],
                       device: torch.device, rounds: int, reps: int,
                       warmup: int = 0) -> dict[str, list[float]]:
    """Settings compared in one process: ``settings`` maps a name to ``(enter, step)``. Each of
    ``rounds`` rounds enters every setting in turn and takes the median ms of ``reps`` calls
    of its step (:func:`median_ms`), so the host's drift reaches all of them. Returns each
    setting's rounds, in order."""
    out: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, (enter, step) in settings.items():
            enter()
            out[name].append(round(median_ms(step, device, reps, warmup=warmup), 4))
    return out
