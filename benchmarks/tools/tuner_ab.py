"""The autotuner's timer: how good and how steady its picks are, ``do_bench`` against the queued
timer (``fold_kernels.tuning.time_ms``), in one process on one GPU.

fold-kernels tunes a kernel's launch configuration the first time it meets a shape
(``tuning.pick``), by timing every candidate. Whatever it picks is what users' steps run until
the cache is cleared, so a pick that a noisy timer got wrong costs every later step. Each trial
here forgets the op's choices (``tuning.forget``), runs the op once, which tunes it again with
the timer of that trial, and then times the op with those picks as a CUDA-graph replay of
``--calls`` back-to-back calls (no host time in it): the figure a user's graphed step would see.
Trials alternate the two timers. A steadier timer gives a narrower spread of replay times; a
better one, lower times.

    python -m benchmarks.tools.tuner_ab ln_bwd:256 ln_bwd:768 swiglu:256 attention:256,256,4,32 \\
        --out benchmarks/results/tools/tuner_ab_h200.json

Targets (bf16): ``ln_bwd:N`` (LayerNorm backward, pair N^2 x 128), ``swiglu:N`` (the fused
SwiGLU projection, pair N^2 x 128 -> 512, forward and backward), ``attention:R,N,H,D``
(EvoAttention forward and backward with a bias gradient and a key mask with holes). Timers:
``do_bench`` (``triton.testing.do_bench``, fold-kernels' timer until 2026-11-29) and ``queued``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from benchmarks.common.cli import device_arg
from benchmarks.common.graphs import capture
from benchmarks.common.machine import versions
from benchmarks.common.results import publish
from benchmarks.common.timing import median_ms

TIMERS = ("do_bench", "queued")


def _do_bench(run: Callable[[], None]) -> float:
    from triton.testing import do_bench

    return do_bench(run, warmup=5, rep=20, return_mode="median")


_EVO = tuple(f"evo_{k}" for k in ("fwd", "dkdv", "dkdv_atomic", "dkdv_dq", "dkdv_atomic_dq",
                                   "dq", "dbias"))


def target(spec: str, device: torch.device) -> tuple[tuple[str, ...], Callable[[], object]]:
    """``(the tuned kernels' names, the op's call)`` of a target string."""
    import fold_kernels as fk

    kind, _, dims = spec.partition(":")
    sizes = [int(v) for v in dims.split(",")]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, torch.bfloat16)

    if kind == "ln_bwd":
        ln = importlib.import_module("fold_kernels.layer_norm")  # the module, not the function
        (n,) = sizes
        x, dy, w = rand(n * n, 128, scale=2.0), rand(n * n, 128), rand(128)
        _, mean, rstd = ln.ln_forward(x, w, torch.zeros_like(w), 1e-5)
        return ("ln_bwd",), lambda: ln.ln_backward(dy, x, w, mean, rstd, torch.bfloat16,
                                                torch.bfloat16)
    if kind == "swiglu":
        (n,) = sizes
        x = rand(n * n, 128).requires_grad_()
        w = rand(1024, 128, scale=128 ** -0.5).requires_grad_()
        dout = rand(n * n, 512)
        return ("swiglu", "swiglu_bwd"), lambda: torch.autograd.grad(fk.swiglu(x, w), (x, w), dout)
    if kind == "attention":
        r, n, h, d = sizes
        q, k, v = (rand(1, r, h, n, d).requires_grad_() for _ in range(3))
        bias = rand(1, h, n, n).requires_grad_()
        mask = (torch.rand(1, r, n, generator=g) > 0.05).to(device)
        dout = rand(1, r, h, n, d)
        return _EVO, lambda: torch.autograd.grad(fk.evo_attention(q, k, v, bias, mask),
                                                   (q, k, v, bias), dout)
    raise SystemExit(f"tuner_ab: unknown target {spec!r} (ln_bwd:N, swiglu:N, "
                     "attention:R,N,H,D)")


def trial(kernels: tuple[str, ...], call: Callable[[], object], timer: str,
          device: torch.device, reps: int, calls: int) -> dict:
    """One search with ``timer``, then the op's replay time (us per call) with its picks."""
    from fold_kernels import tuning

    for kernel in kernels:
        tuning.forget(kernel)
    timed = _do_bench if timer == "do_bench" else tuning.time_ms
    with mock.patch.object(tuning, "time_ms", timed):
        call()  # tunes every kernel of the op that meets a new key
    picks = {kernel: str(cfg) for kernel in kernels for cfg in tuning.chosen(kernel).values()}

    def body():
        for _ in range(calls):
            call()
    replay, _ = capture(body, device)
    us = median_ms(replay, device, reps) / calls * 1e3
    del replay
    return {"timer": timer, "us": round(us, 2), "picks": picks}


def measure(spec: str, device: torch.device, trials: int, reps: int, calls: int) -> dict:
    kernels, call = target(spec, device)
    call()  # compile every candidate's kernel once, outside the trials
    runs = []
    for _ in range(trials):
        for timer in TIMERS:
            runs.append(trial(kernels, call, timer, device, reps, calls))
            print(spec, runs[-1], flush=True)
    row = {"target": spec, "trials": runs}
    for timer in TIMERS:
        us = [r["us"] for r in runs if r["timer"] == timer]
        row[timer] = {"us": us, "median": round(statistics.median(us), 2),
                      "spread": round(max(us) / min(us), 3),
                      "distinct_picks": len({tuple(sorted(r["picks"].items()))
                                             for r in runs if r["timer"] == timer})}
    return row


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# The autotuner's timer: do_bench against queued, {meta['device']}, {meta['date']}",
             "", f"torch {meta['torch']}, Triton {meta['triton']}; bf16. Each trial forgets the "
             "op's tuning choices, tunes it again with one timer, then times the op with its "
             f"picks as a CUDA-graph replay of {meta['calls']} back-to-back calls (median of "
             f"{meta['reps']}, us per call). {meta['trials']} trials per timer, alternating. "
             "Spread: slowest / fastest trial.", "",
             "| target | do_bench: us per trial | median | spread | picks | queued: us per "
             "trial | median | spread | picks |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for timer in TIMERS:
            t = r[timer]
            cells += [" / ".join(map(str, t["us"])), str(t["median"]), str(t["spread"]),
                      str(t["distinct_picks"])]
        lines.append(f"| {r['target']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+", help="ln_bwd:N, swiglu:N, attention:R,N,H,D")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--device", default="cuda",
                    help="cpu: a smoke run under TRITON_INTERPRET=1 (wall-clock, no graphs)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = device_arg(args.device, "tuner_ab")
    # the trials' searches must not read or overwrite the user's tuning cache
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(
            os.environ, {"FOLD_KERNELS_CACHE": str(Path(tmp) / "tuning.json")}):
        rows = [measure(t, device, args.trials, args.reps, args.calls) for t in args.targets]
    meta = {**versions(device), "trials": args.trials, "reps": args.reps, "calls": args.calls}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
