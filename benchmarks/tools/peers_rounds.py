"""fold's eager block step against a peer's, in alternating rounds in one process.

``benchmarks.model.peers`` times each contender once: the median of ``--reps`` steps, one
contender after the other. An eager step bound by host time then carries the host's speed at
the moment it ran, and on the lent H200 host that moved fold's Evoformer (128, 256) step
between 14.7 and 23.5 ms in two processes while OpenFold's moved between 33.9 and 36.5 ms.
Here the contenders take turns: each round times every contender's step (the median of
``--reps`` calls, CUDA events around each call, so an eager step's span includes its host
time), so a drift of the host reaches all of them, and the table gives every round, the ratio
of each round and the ratio of the best rounds.

The blocks are built as ``benchmarks.model.peers`` builds them (``benchmarks.common.peer_runs``:
same inputs, noised parameters, fixed output gradients, the peer's kernel flag), and the step is
the same forward + backward to every input and parameter.

    python -m benchmarks.tools.peers_rounds evoformer:128x256 --peer openfold --kernels off \\
        --fold-precision mixed --pin-cpu 2 --out benchmarks/results/tools/peers_rounds.json
    python -m benchmarks.tools.peers_rounds evoformer:4x9 --tiny --peer fold --device cpu \\
        --rounds 2 --reps 2      # smoke: fold against itself on the CPU
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path

import torch

from benchmarks.common import peer_blocks as pb
from benchmarks.common.blocks import MASKS
from benchmarks.common.machine import add_pin_argument, device_name, pin_cpus, pin_note
from benchmarks.common.peer_runs import (
    PARAMS,
    build,
    forward_step,
    parse_rows,
    settle_precision,
    train_step,
    versions,
)
from benchmarks.common.results import publish, rounds_cell
from benchmarks.common.timing import alternating_rounds

MODES = {"train_eager": train_step, "fwd_eager": forward_step}
AGAIN = "fold, second block"  # --peer fold: the other contender's label


def steps(shape: pb.Shape, names: list[str], kernels: bool, device: torch.device,
          args) -> dict[str, dict]:
    """Per mode, ``{label: (enter, step)}`` for :func:`alternating_rounds`, in ``names``'
    order: fold, then the peer (``AGAIN``: a second fold block, for an A/A check)."""
    sizes = pb.fold_sizes(args.tiny)
    x = pb.base_inputs(shape, sizes, args.mask)
    out: dict[str, dict] = {mode: {} for mode in args.modes}
    for name in names:
        case = build("fold" if name == AGAIN else name, kernels, shape, sizes, x, device, args)
        for mode in args.modes:
            out[mode][name] = (lambda: None, MODES[mode](case))
    return out


def measure(shape: pb.Shape, names: list[str], kernels: bool, device: torch.device,
            args) -> dict:
    """``{mode: {contender: [ms per round]}}`` for one block shape."""
    built = steps(shape, names, kernels, device, args)
    res = {}
    for mode, settings in built.items():
        res[mode] = alternating_rounds(settings, device, args.rounds, args.reps,
                                       warmup=args.warmup)
        print({"block": shape.label(), "mode": mode, **res[mode]}, flush=True)
    return res


def summary(ms: dict[str, list[float]], peer: str) -> dict:
    """The peer's ms over fold's: of the best rounds, per round, and the median of those."""
    fold, other = ms["fold"], ms[peer]
    per_round = [o / f for f, o in zip(fold, other, strict=True)]
    return {"best_rounds": min(other) / min(fold), "per_round": per_round,
            "median_of_rounds": statistics.median(per_round)}


def markdown(meta: dict, rows: list[dict]) -> str:
    peer = AGAIN if meta["peer"] == "fold" else meta["peer"]
    lines = [f"# fold against {peer} (kernels {meta['kernels']}), eager steps in alternating "
             f"rounds, {meta['device']}, {meta['date']}", "",
             f"torch {meta['versions'].get('torch')}, Triton {meta['versions'].get('triton')}, "
             f"{peer} {meta['versions'].get(peer, '-')}. fold precision {meta['fold_precision']},"
             f" the peer's weights {meta['peer_weights']}; parameters {meta['params']}; token "
             f"mask {meta['mask']}. {meta['rounds']} rounds, each the median of {meta['reps']} "
             f"steps per contender (CUDA events around each step: an eager step's span includes "
             f"its host time). {pin_note(meta['cpus_pinned'])} Ratio: {peer}'s ms over fold's "
             "(above 1: fold faster).", "",
             f"| block | mode | fold ms per round | {peer} ms per round | ratio per round | "
             "ratio, best rounds | median of the rounds' ratios |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["ratio"]
        lines.append(f"| {r['block']} | {r['mode']} | {rounds_cell(r['ms']['fold'], '.2f')} | "
                     f"{rounds_cell(r['ms'][peer], '.2f')} | "
                     f"{rounds_cell(s['per_round'], '.2f')} | {s['best_rounds']:.2f}x | "
                     f"{s['median_of_rounds']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("blocks", help="rows as benchmarks.model.peers takes them, e.g. "
                                   "'evoformer:128x256,diffusion:384x48'")
    ap.add_argument("--peer", required=True, choices=["fold", *pb.PEERS],
                    help="the other contender (fold: fold against itself, an A/A check)")
    ap.add_argument("--kernels", choices=["on", "off"], default="on",
                    help="the peer's kernel flag")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny presets and sizes (CPU smoke)")
    ap.add_argument("--modes", default="train_eager",
                    help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each round")
    ap.add_argument("--mask", choices=MASKS, default="holes")
    ap.add_argument("--params", choices=sorted(PARAMS), default="noised")
    ap.add_argument("--peer-weights", choices=["match", "fp32", "bf16"], default="match")
    ap.add_argument("--fold-precision", choices=sorted(pb.FOLD_PRECISIONS), default="mixed")
    add_pin_argument(ap)
    ap.add_argument("--out", default=None, help="JSON path (markdown beside it)")
    args = ap.parse_args(argv)

    pinned = pin_cpus(args.pin_cpu)
    device = torch.device(args.device)
    args.modes = tuple(m.strip() for m in args.modes.split(","))
    if set(args.modes) - set(MODES):
        raise SystemExit(f"--modes: choose from {list(MODES)}")
    args.protenix_layernorm = None
    settle_precision(args, device)
    names = ["fold", AGAIN if args.peer == "fold" else args.peer]
    meta = {"device": device_name(device),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": versions(["fold", args.peer]), "peer": args.peer,
            "kernels": args.kernels,
            "fold_precision": args.fold_precision, "peer_weights": str(args.peer_dtype),
            "params": args.params, "mask": args.mask, "rounds": args.rounds, "reps": args.reps,
            "warmup": args.warmup, "cpus_pinned": pinned}
    rows = []
    for shape in parse_rows(args.blocks):
        for mode, ms in measure(shape, names, args.kernels == "on", device, args).items():
            rows.append({"block": shape.label(), "mode": mode, "ms": ms,
                         "ratio": summary(ms, names[1])})
    publish(None if args.out is None else Path(args.out), meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
