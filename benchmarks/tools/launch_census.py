"""Launch census of a block's training step: GPU launches and host time, eager and replayed.

For each block (AF2 Evoformer, AF3 Pairformer; bf16, training mode, forward + backward from a
scalar loss) and each launch path of fold-kernels (``FOLD_KERNELS_FAST_LAUNCH=0``: Triton's own
JIT launch path, the state before issue 20; ``1``: the cached launchers), in one process:

* launches per step, split into fold-kernels' Triton kernels and everything else (cuBLAS GEMMs,
  PyTorch elementwise ops, copies), counted by ``torch.profiler``;
* the eager step's wall time (median of ``--reps`` steps, each synchronized) and the CUDA-graph
  replay of the same step (kernels only, no host work), and their ratio (issue 20's goal: eager
  within 1.25x of replay);
* host microseconds per launch: (eager - replay) / launches, the host cost a launch carries on
  average (Python around it, the autograd engine, the driver call).

    python -m benchmarks.tools.launch_census --out benchmarks/results/tools/launch_census.json

The graph replay does not depend on the launch path; it is measured once per block.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.machine import versions
from benchmarks.common.results import write_result
from benchmarks.common.targets import build

TARGETS = ("evoformer:128,256", "pairformer:256", "pairformer:384")
# Triton kernels are named by their @triton.jit functions (fold-kernels: a leading underscore).
_TRITON_PREFIX = "_"


def _median_ms(step, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _launches(step) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    triton = other = 0
    for e in prof.key_averages():
        if e.device_type.name != "CUDA" or e.key.startswith("Memcpy") or e.key.startswith(
                "Memset"):
            continue
        if e.key.startswith(_TRITON_PREFIX):
            triton += e.count
        else:
            other += e.count
    return {"launches": triton + other, "triton_launches": triton, "other_launches": other}


def census(target: str, reps: int, warmup: int) -> list[dict]:
    device, dtype = torch.device("cuda"), torch.bfloat16
    replay = build(target, device, dtype, graphs=True)
    for _ in range(warmup):
        replay()
    replay_ms = _median_ms(replay, reps)
    del replay
    rows = []
    for fast in ("0", "1"):
        os.environ["FOLD_KERNELS_FAST_LAUNCH"] = fast
        step = build(target, device, dtype)
        for _ in range(warmup):
            step()
        eager_ms = _median_ms(step, reps)
        counts = _launches(step)
        rows.append({
            "target": target, "fast_launch": fast == "1", **counts,
            "eager_ms": eager_ms, "replay_ms": replay_ms, "eager_over_replay": eager_ms / replay_ms,
            "host_us_per_launch": 1e3 * (eager_ms - replay_ms) / counts["launches"],
        })
        print(rows[-1], flush=True)
        del step
        torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    v = result["versions"]
    lines = [f"# Launch census, {v.get('device')}, {result['date']}", "",
             f"torch {v.get('torch')}, Triton {v.get('triton')}; bf16, training step (forward + "
             f"backward), median of {result['reps']} steps. `fast launch` off = Triton's own "
             "launch path (before issue 20), on = fold-kernels' cached launchers.", "",
             "| block | fast launch | launches (Triton + other) | eager ms | replay ms | "
             "eager / replay | host us per launch |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['target']} | {'on' if r['fast_launch'] else 'off'} | {r['launches']} "
                     f"({r['triton_launches']} + {r['other_launches']}) | {r['eager_ms']:.2f} | "
                     f"{r['replay_ms']:.2f} | {r['eager_over_replay']:.2f}x | "
                     f"{r['host_us_per_launch']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="*", default=list(TARGETS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ensure_kernels(torch.device("cuda"), needed=True)
    rows = [row for t in args.targets for row in census(t, args.reps, args.warmup)]
    result = {"date": time.strftime("%Y-%m-%d"), "versions": versions(torch.device("cuda")),
              "reps": args.reps,
              "rows": rows}
    text = markdown(result)
    print(text)
    if args.out:
        write_result(args.out, result, text, indent=1)
    return result


if __name__ == "__main__":
    main()
