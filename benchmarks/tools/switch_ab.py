"""One of fold's switches off against on, in one process: block steps as CUDA-graph replays and
eagerly, in alternating rounds.

A kernel-path change behind an environment variable that is read at launch
(``FOLD_KERNELS_PDL``, ``FOLD_KERNELS_FAST_LAUNCH``, ...) is measured here, not by a private
driver. For each setting, each target is built and captured with the variable set, and the
variable stays set while its rounds run. A replay keeps the kernels of its capture; an eager step
launches under the setting of its round. Rounds alternate the settings, so the host's drift
reaches both. Each cell is the median of ``--reps`` calls (``benchmarks.common.timing``: CUDA
events around each call, then a synchronization; an eager step's events span its host time), and
the table compares the best rounds.

    python -m benchmarks.tools.switch_ab FOLD_KERNELS_PDL=0,1 pairformer:256 evoformer:128,256 \\
        "fwd pairformer:256" "fwd diffusion:384,48" --out benchmarks/results/tools/pdl_ab.json

Targets are those of ``benchmarks.common.targets``: training steps from the fp32 loss, e.g.
``pairformer:256``, ``diffusion:384,48``, ``evoformer:128,256``, ``attention:R,N,H,D``. With the
prefix ``fwd``, an AF3 block's eval-mode forward under ``no_grad``, which is what prediction runs:
``fwd pairformer:N``, ``fwd diffusion:N,samples``. bf16 (a target with the suffix ``@mixed``: fp32
parameters and streams under bf16 autocast, as fold-train's ``precision=bf16``). On a machine
without CUDA, a "replay" is the eager step and times are wall-clock: a smoke run, not a
measurement.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable

import torch

from benchmarks.common.cli import add_ab_options, parse_switch, switch_restored
from benchmarks.common.results import rounds_cell
from benchmarks.common.targets import build
from benchmarks.common.timing import alternating_rounds


def steps(target: str, device: torch.device) -> tuple[Callable[[], object], Callable[[], object]]:
    """``(replay, eager)`` of a target, built under the current environment."""
    return (build(target, device, torch.bfloat16, graphs=True),
            build(target, device, torch.bfloat16))


def measure(switch: str, values: tuple[str, str], targets: list[str], device: torch.device,
            rounds: int, reps: int) -> list[dict]:
    """One row per target: each setting's rounds (ms) for replays and eager steps, and
    ``off / on`` of the best rounds (above 1: the second setting is faster)."""
    rows = []
    with switch_restored(switch):
        for target in targets:
            built = {}
            for value in values:
                os.environ[switch] = value
                built[value] = steps(target, device)
                built[value][0]()  # warm-up: compilation and autotuning of this setting
                built[value][1]()
            row = {"target": target}
            for mode, index in (("replay_ms", 0), ("eager_ms", 1)):
                row[mode] = alternating_rounds(
                    {v: (functools.partial(os.environ.__setitem__, switch, v), built[v][index])
                     for v in values}, device, rounds, reps)
            off, on = values
            for mode in ("replay_ms", "eager_ms"):
                row[mode.replace("_ms", "_off_over_on")] = round(
                    min(row[mode][off]) / min(row[mode][on]), 4)
            rows.append(row)
            print(row, flush=True)
            del built
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    off, on = meta["values"]
    name = meta["switch"]

    def rounds(xs):
        return rounds_cell(xs, ".3f")

    lines = [f"# {name}={off} against {name}={on}, {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16 (a target with @mixed: fp32 "
             f"under bf16 autocast); {meta['rounds']} alternating rounds, each the median of "
             f"{meta['reps']} calls (CUDA events around each call; an eager step's span "
             "includes its host time). Ratio: best rounds, off / on (above 1: on is faster).", "",
             f"| target | replay ms, {off} | replay ms, {on} | replay off/on | eager ms, {off} | "
             f"eager ms, {on} | eager off/on |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} | {rounds(r['replay_ms'][off])} | "
                     f"{rounds(r['replay_ms'][on])} | {r['replay_off_over_on']:.3f} | "
                     f"{rounds(r['eager_ms'][off])} | {rounds(r['eager_ms'][on])} | "
                     f"{r['eager_off_over_on']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("switch", help="NAME=OFF,ON, e.g. FOLD_KERNELS_PDL=0,1")
    ap.add_argument("targets", nargs="+")
    add_ab_options(ap, reps=20)
    args = ap.parse_args(argv)
    name, values = parse_switch(args.switch)

    from benchmarks.common.backends import ensure_kernels
    from benchmarks.common.machine import versions
    from benchmarks.common.results import publish

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        ensure_kernels(device)
    rows = measure(name, values, args.targets, device, args.rounds, args.reps)
    meta = {**versions(device), "switch": name, "values": list(values), "rounds": args.rounds,
            "reps": args.reps}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
