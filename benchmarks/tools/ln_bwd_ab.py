"""LayerNorm's backward under two settings of a switch, in one process on one GPU (bf16), beside
the floor of the bytes it moves.

Each setting is entered by setting its environment variable (read at launch; the tuner tunes
each setting on its own, its key includes it); the timed body is ``--calls`` back-to-back
``fold_kernels.layer_norm.ln_backward`` calls captured in one CUDA graph, so the figure is
microseconds per call without the graph's own launch. Rounds alternate the settings. The floor
is ``torch.add(x, dy, out=dx)`` captured the same way: the same three tensors' bytes with no
arithmetic to speak of. The two settings' gradients are compared (largest absolute
difference).

    python -m benchmarks.tools.ln_bwd_ab FOLD_KERNELS_LN_DENSE=0,1 \\
        --out benchmarks/results/tools/ln_dense_ab_h200.json
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

from benchmarks.common.cli import add_ab_options, device_arg, parse_switch, switch_restored
from benchmarks.common.graphs import capture_calls
from benchmarks.common.machine import versions
from benchmarks.common.results import publish, rounds_cell
from benchmarks.common.timing import alternating_rounds, median_ms

SIZES = (256, 384, 768)  # pair N^2 x 128


def measure(switch: str, values: tuple[str, str], n: int, device: torch.device, rounds: int,
            reps: int, calls: int) -> dict:
    ln = importlib.import_module("fold_kernels.layer_norm")  # the module, not the function
    rows, c = n * n, 128
    g = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, c, generator=g) * 2 + 1).to(device, torch.bfloat16)
    dy = torch.randn(rows, c, generator=g).to(device, torch.bfloat16)
    w = torch.randn(c, generator=g).to(device, torch.bfloat16)
    _, mean, rstd = ln.ln_forward(x, w, torch.zeros_like(w), 1e-5)

    def backward():
        return ln.ln_backward(dy, x, w, mean, rstd, torch.bfloat16, torch.bfloat16)

    settings, grads = {}, {}
    for v in values:
        os.environ[switch] = v
        grads[v] = [t.float() for t in backward()]  # tuned under this setting
        settings[v] = (lambda v=v: os.environ.__setitem__(switch, v),
                       capture_calls(backward, calls, device))
    times = alternating_rounds(settings, device, rounds, reps)
    dx = torch.empty_like(x)
    floor = capture_calls(lambda: torch.add(x, dy, out=dx), calls, device)
    floor_ms = median_ms(floor, device, reps)
    gbytes = 3 * rows * c * 2 / 1e9
    per_call = {v: [round(t / calls * 1e3, 2) for t in ts] for v, ts in times.items()}
    row = {"shape": f"pair {n}^2 x {c}", "rows": rows, "C": c, "us_per_call": per_call,
           "floor_us": round(floor_ms / calls * 1e3, 2),
           "TB_s_best": {v: round(gbytes / (min(ts) * 1e-6) / 1e3, 2)
                         for v, ts in per_call.items()},
           "floor_TB_s": round(gbytes / (floor_ms / calls * 1e-3) / 1e3, 2),
           "off_over_on": round(min(per_call[values[0]]) / min(per_call[values[1]]), 3),
           "max_abs_diff": max(float((a - b).abs().max())
                               for a, b in zip(grads[values[0]], grads[values[1]]))}
    print(row, flush=True)
    return row


def markdown(meta: dict, rows: list[dict]) -> str:
    a, b = meta["values"]
    lines = [f"# LayerNorm backward, {meta['switch']}={a} against {b}, {meta['device']}, "
             f"{meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16; each figure: one CUDA-graph "
             f"replay of {meta['calls']} back-to-back calls, median of {meta['reps']}, per call; "
             f"{meta['rounds']} alternating rounds. TB/s counts x and dy read and dx written; "
             "floor: `torch.add(x, dy, out=dx)`. Ratio: best rounds, off / on (above 1: on is "
             "faster).", "",
             f"| shape | {a} (us) | {b} (us) | off/on | TB/s {a} / {b} | floor us (TB/s) | "
             "max abs diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        us = r["us_per_call"]
        lines.append(f"| {r['shape']} | {rounds_cell(us[a])} | {rounds_cell(us[b])} | "
                     f"{r['off_over_on']} | "
                     f"{r['TB_s_best'][a]} / {r['TB_s_best'][b]} | {r['floor_us']} "
                     f"({r['floor_TB_s']}) | {r['max_abs_diff']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("switch", help="NAME=OFF,ON, e.g. FOLD_KERNELS_LN_DENSE=0,1")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    add_ab_options(ap, reps=30, calls=20, smoke=True)
    args = ap.parse_args(argv)
    switch, values = parse_switch(args.switch)
    device = device_arg(args.device, "ln_bwd_ab")
    with switch_restored(switch):
        rows = [measure(switch, values, n, device, args.rounds, args.reps, args.calls)
                for n in args.sizes]
    meta = {**versions(device), "switch": switch, "values": list(values),
            "rounds": args.rounds, "reps": args.reps, "calls": args.calls}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
