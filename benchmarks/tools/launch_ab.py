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


def _patch(variant: str) -> None:
    """Make ``FastKernel``'s cached launches take ``variant``'s route (see the module doc)."""
    import os

    from fold_kernels import launch as L

    os.environ["FOLD_KERNELS_FAST_LAUNCH"] = "0" if variant == "triton" else "1"
    pointers, direct = variant in ("pointers", "direct"), variant == "direct"

    def hit(self, entry, grid, args, ptrs, device):
        n = len(grid)
        stream = L.raw_stream(device)
        rt = entry.knobs
        enter, exit_ = L.active_hook(rt.launch_enter_hook), L.active_hook(rt.launch_exit_hook)
        meta = (entry.compiled.launch_metadata(grid, stream, *args, *entry.tail)
                if enter is not None or exit_ is not None else None)
        launched = ptrs if pointers else args
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        if direct and entry.direct is not None:
            entry.direct(gx, gy, gz, stream, entry.function, *entry.flags, None, None,
                         entry.metadata, meta, enter, exit_, *launched, *entry.tail)
        else:
            entry.run(gx, gy, gz, stream, entry.function, entry.metadata, meta, enter, exit_,
                      *launched, *entry.tail)
        return entry.compiled

    L.FastKernel._hit = hit


def _install_hook() -> None:
    """Route FastKernel.launch's cache hits through ``FastKernel._hit`` (set by :func:`_patch`),
    counting hits and misses, so that a variant that missed the cache cannot pass for fast."""
    from fold_kernels import launch as L
    from fold_kernels import pdl
    from fold_kernels.tuning import interpreting

    L.COUNTS = {"hit": 0, "miss": 0}

    def launch(self, grid, args, kwargs):
        if interpreting():
            return self.jit[grid](*args, **kwargs)
        device = L.torch.cuda.current_device()
        if self._pdl:
            kwargs = ({**kwargs, pdl.PARAM: True, "launch_pdl": True} if pdl.on(device)
                      else {**kwargs, pdl.PARAM: False})
        if callable(grid) or not L._ENABLED.get():
            return self.jit[grid](*args, **kwargs)
        keys, ptrs = L.launch_args(args)
        key = (device, tuple(kwargs.items()), *keys)
        entry = self._cache.get(key)
        if entry is None:
            L.COUNTS["miss"] += 1
            return self._miss(key, grid, args, kwargs)
        L.COUNTS["hit"] += 1
        return self._hit(entry, grid, args, ptrs, device)

    L.FastKernel.launch = launch


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
    from fold_kernels import launch as L

    device = torch.device("cuda")
    _install_hook()
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
                before = dict(L.COUNTS)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                times[name, variant].append((time.perf_counter() - t0) / calls * 1e6)
                for k in ("hit", "miss"):
                    counts[name, variant][k] += L.COUNTS[k] - before[k]
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
    from benchmarks.common.results import write_result

    if not torch.cuda.is_available():
        raise SystemExit("launch_ab: no CUDA device")
    ensure_kernels(torch.device("cuda"))
    rows = measure(args.calls, args.rounds)
    meta = {**versions(torch.device("cuda")), "calls": args.calls, "rounds": args.rounds}
    text = markdown(meta, rows)
    print(text)
    if args.out is not None:
        write_result(args.out, {**meta, "rows": rows}, text)
    return rows


if __name__ == "__main__":
    main()
