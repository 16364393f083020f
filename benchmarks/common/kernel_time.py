"""A step's GPU kernels from ``torch.profiler``, whatever stream launched them: per kernel name
(:func:`kernel_times`, ``tools.profile_peers``), their count (:func:`kernel_counts`, the replay
census of :mod:`benchmarks.common.graphs`) and their summed time (:func:`kernel_ms`, the
``*_kernels`` modes of ``model.peers``).

A CUDA-graph replay holds only the kernels launched on the capturing stream; an eager step's
kernels, summed without the host's gaps between them, are the time a complete replay would take
(on the H200 fold's Pairformer step: 2.551 ms summed eagerly, 2.55 ms as a replay). That is the
like-for-like figure for a contender whose replays miss work (Protenix 2.0's fast LayerNorm). On
CPU (smoke runs) there are no kernels: operators by self CPU time stand in.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def activity_name(name: str) -> str:
    """A GPU activity's name as an eager call and a replay both report it: the profiler names a
    memset ``Memset (Device)`` in an eager call and ``Memset (Unknown)`` in a replay (H200,
    2026-12-01), so copies and sets lose the memory kind in parentheses; kernels keep theirs."""
    if name.startswith(("Memset", "Memcpy")):
        return name.split(" (")[0]
    return name


def kernel_times(step: Callable[[], object], device: torch.device,
                 warmup: int = 0) -> list[dict[str, Any]]:
    """``[{name, count, ms}]`` of one call of ``step`` after ``warmup`` unprofiled calls, largest
    first: its GPU kernels, copies and sets (CUDA), or its operators by self CPU time (CPU)."""
    for _ in range(warmup):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize(device)
    out: dict[str, dict[str, Any]] = {}
    for e in prof.key_averages():
        if cuda:
            if e.device_type.name != "CUDA" or e.self_device_time_total <= 0:
                continue
            ms = e.self_device_time_total / 1e3
        else:
            if e.self_cpu_time_total <= 0:
                continue
            ms = e.self_cpu_time_total / 1e3
        k = out.setdefault(activity_name(e.key), {"name": activity_name(e.key), "count": 0,
                                                 "ms": 0.0})
        k["count"] += e.count
        k["ms"] += ms
    return sorted(out.values(), key=lambda k: -k["ms"])


def kernel_counts(step: Callable[[], object], device: torch.device) -> Counter[str]:
    """How often one call of ``step`` launches each kernel (and copy, set), by name."""
    return Counter({k["name"]: k["count"] for k in kernel_times(step, device)})


def kernel_ms(step: Callable[[], object], device: torch.device, reps: int = 5,
              warmup: int = 1) -> float:
    """Median over ``reps`` calls of ``step`` of the summed time of each call's kernels."""
    for _ in range(warmup):
        step()
    return statistics.median(sum(k["ms"] for k in kernel_times(step, device))
                             for _ in range(reps))
