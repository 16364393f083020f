"""Host time of one cached Triton launch, four ways, in one process (A/B of fold_kernels.launch).

A development measurement beside ``host_overhead``: each variant launches fold-kernels' real
kernels (LayerNorm forward: 15 arguments, 6 of them tensors; LayerNorm backward: 37 arguments, 12
tensors) on tiny tensors in a host-bound loop (the GPU syncs once per round), and the variants
alternate round by round so that the machine's drift falls on all of them alike:

* ``triton``: Triton's own launch path (``FOLD_KERNELS_FAST_LAUNCH=0``);
* ``tensors``: fold's cached launch handing the tensors to the launcher object's ``__call__``
  (fold-kernels before 2026-11-29's sixth session);
* ``pointers``: the same with each tensor handed over as its data pointer (an int: the C
  launcher then neither calls ``data_ptr`` nor asks the driver ``cuPointerGetAttribute``);
* ``direct``: pointers, and the launcher's C function called directly where
  :func:`fold_kernels.launch.direct_launch` allows it (what fold-kernels does now).

    python -m benchmarks.tools.launch_ab --out benchmarks/results/tools/launch_ab_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

VARIANTS = ("triton", "tensors", "pointers", "direct")


COUNTS = {"hit": 0, "miss": 0}  # the cached path's lookups, counted by the patched methods


def _patch(variant: str) -> None:
    """Make ``FastKernel``'s cache hits take ``variant``'s route (see the module doc) and count
    hits and misses, so that a variant that missed the cache cannot pass for fast."""
    import os

    from fold_kernels import launch as L

    os.environ["FOLD_KERNELS_FAST_LAUNCH"] = "0" if variant == "triton" else "1"
    if not hasattr(L.FastKernel, "_ab_originals"):
        L.FastKernel._ab_originals = (L.FastKernel._launch_cached, L.FastKernel._miss)
    cached, miss = L.FastKernel._ab_originals

    def launch_cached(self, entry, grid, args, ptrs, device):
        COUNTS["hit"] += 1
        if variant == "tensors":  # the tensors themselves, as before pointers were handed over
            ptrs = list(args)
        if variant in ("tensors", "pointers") and entry.direct is not None:
            direct, entry.direct = entry.direct, None  # the launcher object's __call__
            try:
                return cached(self, entry, grid, args, ptrs, device)
            finally:
                entry.direct = direct
        return cached(self, entry, grid, args, ptrs, device)

    def count_miss(self, *a):
        COUNTS["miss"] += 1
        return miss(self, *a)

    L.FastKernel._launch_cached = launch_cached
    L.FastKernel._miss = count_miss


def cases(device):
    """``{name: call}``: the LayerNorm forward and backward launches on tiny bf16 tensors."""
    import torch
    from fold_kernels.layer_norm import ln_backward, ln_forward

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 32, generator=g).to(device, torch.bfloat16)
    w, b = (torch.randn(32, generator=g).to(device, torch.bfloat16) for _ in range(2))
    dy = torch.randn_like(x)
    _, mean, rstd = ln_forward(x, w, b, 1e-5)
    return {"ln_forward (1 launch)": lambda: ln_forward(x, w, b, 1e-5),
            "ln_backward (1 launch)": lambda: ln_backward(dy, x, w, mean, rstd,
                                                          torch.bfloat16, torch.bfloat16)}


def measure(calls: int, rounds: int) -> list[dict]:
    import torch

    device = torch.device("cuda")
    fns = cases(device)
    times = {(n, v): [] for n in fns for v in VARIANTS}
    counts = {(n, v): {"hit": 0, "miss": 0} for n in fns for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            _patch(variant)
            for name, fn in fns.items():
                fn()
                fn()  # compiled and cached before the timed calls
                torch.cuda.synchronize()
                before = dict(COUNTS)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                times[name, variant].append((time.perf_counter() - t0) / calls * 1e6)
                for k in ("hit", "miss"):
                    counts[name, variant][k] += COUNTS[k] - before[k]
    rows = []
    for name in fns:
        base = statistics.median(times[name, "tensors"])
        for variant in VARIANTS:
            t = times[name, variant]
            rows.append({"call": name, "variant": variant, "median_us": round(
                statistics.median(t), 2), "min_us": round(min(t), 2),
                "rounds_us": [round(x, 2) for x in t],
                "vs_tensors": round(base / statistics.median(t), 3), **counts[name, variant]})
            print(rows[-1], flush=True)
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Cached launch A/B, {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; {meta['rounds']} alternating "
             f"rounds of {meta['calls']} host-bound calls per variant; microseconds per call "
             "(one launch each). hits/misses: the cached path's lookups in the timed calls.", "",
             "| call | variant | median us | min us | tensors / variant | hits | misses |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['call']} | {r['variant']} | {r['median_us']} | {r['min_us']} | "
                     f"{r['vs_tensors']}x | {r['hit']} | {r['miss']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside it)")
    args = ap.parse_args(argv)
    import torch

    from benchmarks.common.backends import ensure_kernels
    from benchmarks.common.machine import versions
    from benchmarks.common.results import publish

    if not torch.cuda.is_available():
        raise SystemExit("launch_ab: no CUDA device")
    ensure_kernels(torch.device("cuda"))
    rows = measure(args.calls, args.rounds)
    meta = {**versions(torch.device("cuda")), "calls": args.calls, "rounds": args.rounds}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
