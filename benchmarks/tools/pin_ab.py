"""Eager steps under several CPU pinnings of this process's threads, in one process, in
alternating rounds; and which threads run a training step's backward.

An eager step bound by host time moved by 1.5x between runs on the H200 host, and pinned to one
core it was fast and steady (results/model/model_peers_h200_pinning.md). This tool measures where
that comes from without restarting the process: each round sets the affinity of every thread of
the process (``/proc/self/task``), then times the eager steps. A setting is

- ``all``: the CPUs the process was started with;
- a CPU list, ``2`` or ``2,3`` (taskset's form): every thread on those CPUs;
- ``MAIN/OTHERS``, e.g. ``2/3``: the main (Python) thread on MAIN, every other thread (the
  autograd engine's device thread, which runs the backward on CUDA, and the driver's) on OTHERS.

The census (``--census``) hooks every node of one training step's backward graph and counts the
nodes each thread runs and how often execution passes from one thread to another: PyTorch's
engine runs a node whose incoming gradients are all on the CPU (or undefined) on the calling
thread, and every other node on the device thread.

    python -m benchmarks.tools.pin_ab all 2 2,3 2/3 diffusion:384,48 "fwd diffusion:384,48" \\
        --census --out benchmarks/results/tools/pin_ab_h200.json

Targets are those of ``benchmarks.common.targets.build`` (training steps from the fp32 loss, and
``fwd`` forwards under ``no_grad``); bf16. On a machine without CUDA the times are wall-clock:
a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
from collections import Counter
from pathlib import Path

import torch

from benchmarks.common.cli import add_ab_options
from benchmarks.common.machine import parse_cpus
from benchmarks.common.results import rounds_cell
from benchmarks.common.targets import build, loss_and_tensors
from benchmarks.common.timing import alternating_rounds


def parse_setting(text: str, start: set[int]) -> tuple[set[int], set[int]]:
    """``(main thread's CPUs, other threads' CPUs)`` of a setting (see the module docstring);
    ``start`` is the process's CPUs at start, which every CPU named must be among."""
    if text == "all":
        return set(start), set(start)
    main, sep, others = text.partition("/")
    cpus = (set(parse_cpus(main)), set(parse_cpus(others if sep else main)))
    for part in cpus:
        if not part <= start:
            raise SystemExit(f"pin_ab: setting {text!r} names CPUs outside {sorted(start)}, "
                             "the CPUs this process may run on")
    return cpus


def thread_ids() -> list[int]:
    """Native ids of this process's threads."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:  # no procfs: only this thread is known
        return [threading.get_native_id()]


def thread_name(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def apply(setting: tuple[set[int], set[int]]) -> None:
    """Set every thread's affinity: the main thread's to ``setting[0]``, the others' to
    ``setting[1]``. Threads started later inherit their creator's."""
    main = threading.main_thread().native_id
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, setting[0] if tid == main else setting[1])
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def census(target: str, device: torch.device) -> dict:
    """The threads that run one backward of a training ``target``: nodes per thread name and
    the number of hand-overs between threads, in execution order."""
    loss_fn, tensors = loss_and_tensors(target, device, torch.bfloat16)
    loss_fn()  # warm-up: compilation
    loss = loss_fn()
    order: list[int] = []
    seen, stack, handles = set(), [loss.grad_fn], []
    while stack:  # every node reachable from the loss
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        handles.append(node.register_prehook(
            lambda grads: order.append(threading.get_native_id())))
        stack.extend(fn for fn, _ in node.next_functions)
    torch.autograd.grad(loss, [t for t in tensors if t.requires_grad], allow_unused=True)
    for h in handles:
        h.remove()
    main = threading.main_thread().native_id
    names = {tid: ("main" if tid == main else thread_name(tid)) for tid in set(order)}
    return {"target": target, "nodes": len(order),
            "nodes_per_thread": dict(Counter(names[t] for t in order)),
            "handovers": sum(a != b for a, b in zip(order, order[1:]))}


def measure(settings: list[str], targets: list[str], device: torch.device, rounds: int,
            reps: int) -> list[dict]:
    """One row per target: each setting's rounds (ms) and the best round's ratio to the first
    setting's best (above 1: faster than the first setting)."""
    start = os.sched_getaffinity(0)
    parsed = {s: parse_setting(s, start) for s in settings}
    rows = []
    try:
        for target in targets:
            step = build(target, device, torch.bfloat16)
            step()  # warm-up: compilation, autotuning, the autograd device thread
            row = {"target": target, "eager_ms": alternating_rounds(
                {s: (functools.partial(apply, parsed[s]), step) for s in settings},
                device, rounds, reps, warmup=2)}
            first = min(row["eager_ms"][settings[0]])
            row["speedup_over_first"] = {s: round(first / min(v), 4)
                                         for s, v in row["eager_ms"].items()}
            rows.append(row)
            print(row, flush=True)
            del step
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        apply((start, start))
    return rows


def markdown(meta: dict, rows: list[dict], censuses: list[dict]) -> str:
    settings = meta["settings"]
    lines = [f"# Eager steps by CPU pinning, {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16; the process started on CPUs "
             f"{meta['start_cpus']}. {meta['rounds']} alternating rounds, each the median of "
             f"{meta['reps']} eager calls (CUDA events around each call, which span its host "
             "time). `a/b`: main thread on a, every other thread on b. Speedup: best round "
             f"against the best round of `{settings[0]}`.", "",
             "| target | " + " | ".join(f"`{s}` ms" for s in settings) + " | "
             + " | ".join(f"`{s}` speedup" for s in settings[1:]) + " |",
             "|---" * (2 * len(settings)) + "|"]
    for r in rows:
        cells = [rounds_cell(r["eager_ms"][s], ".2f") for s in settings]
        ups = [f"{r['speedup_over_first'][s]:.2f}x" for s in settings[1:]]
        lines.append(f"| {r['target']} | " + " | ".join(cells + ups) + " |")
    if censuses:
        lines += ["", "Backward census (one training step, every graph node hooked):", "",
                  "| target | nodes | nodes per thread | hand-overs between threads |",
                  "|---|---|---|---|"]
        for c in censuses:
            per = ", ".join(f"{k} {v}" for k, v in c["nodes_per_thread"].items())
            lines.append(f"| {c['target']} | {c['nodes']} | {per} | {c['handovers']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("items", nargs="+",
                    help="settings (all, CPU lists, MAIN/OTHERS), then targets (they hold ':')")
    ap.add_argument("--census", action="store_true",
                    help="also count the threads that run each training target's backward")
    add_ab_options(ap, reps=20)
    args = ap.parse_args(argv)
    settings = [x for x in args.items if ":" not in x]
    targets = [x for x in args.items if ":" in x]
    if not settings or not targets:
        raise SystemExit("pin_ab: give at least one setting and one target")

    from benchmarks.common.backends import ensure_kernels
    from benchmarks.common.machine import versions
    from benchmarks.common.results import publish

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        ensure_kernels(device)
    censuses = ([census(t, device) for t in targets if not t.startswith("fwd ")]
                if args.census else [])
    for c in censuses:
        print(c, flush=True)
    rows = measure(settings, targets, device, args.rounds, args.reps)
    meta = {**versions(device), "settings": settings, "rounds": args.rounds, "reps": args.reps,
            "start_cpus": sorted(os.sched_getaffinity(0)), "census": censuses}
    publish(args.out, meta, rows, markdown(meta, rows, censuses))
    return rows


if __name__ == "__main__":
    main()
