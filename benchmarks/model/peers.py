"""fold's blocks against its peers', in one process on one GPU (issues 20 and 21).

Rows (issue 20): the AF2 Evoformer block at (N_seq 128, N_res 256) and (512, 384) against
OpenFold; the AF3 Pairformer block at 256, 384, 512 and 768 tokens and the AF3 diffusion
transformer block with 48 samples at 384 and 768 tokens against Protenix and Boltz, each peer with
its kernel flags on and off (benchmarks/common/peer_blocks.py says how each is built and called).
Training mode (dropout on), batch 1, token masks with ~5% holes (``--mask padded``: the last
tenth of the tokens padded, as a prediction padded to its bucket; ``none``: all kept, as a
training crop of a longer chain).

Each contender is timed four ways: forward + backward from fixed random output gradients (the
same seeded values for every contender: ``torch.randn(numel)`` from seed 1, per output, in its
dtype), eagerly and as a CUDA-graph replay (benchmarks/common/graphs.py), and forward alone under
``no_grad``, eagerly and graphed. Each figure is the median of ``--reps`` (>= 20 on a GPU) calls
after ``--warmup`` calls (CUDA events). The table gives, per row and mode, fold's ms over the best
peer's (``fold/peer`` < 1: fold is faster). Every contender's eager modes run before any
contender's replays (:func:`phases`: a peer's host-bound eager step was slower after CUDA-graph
captures in the same process); for eager rows bound by host time, ``benchmarks.tools.peers_rounds``
alternates the contenders in rounds.

Precision, like with like: ``--fold-precision`` picks fold's (bf16 throughout, or fp32 streams
under bf16 autocast as fold-train runs them) and the peers' parameters and inputs follow it
(``--peer-weights match``): bf16 under autocast (issue 21's setting), or fp32 under autocast.
Until 2026-11-30 the default paired fold's bf16 streams with the peers' fp32 ones.

Peers are imported when installed (benchmarks/peer_setup.sh: wheels carried to the GPU machine,
their CUDA extensions built there) and their versions recorded; a peer that is not installed,
fails to build or fails a mode gets its error text in that place, never a number.

    source benchmarks/peer_setup.sh && source benchmarks/gpu_setup.sh && \\
      python3 -m benchmarks.model.peers --out benchmarks/results/model/model_peers.json
    python -m benchmarks.model.peers --device cpu --tiny --reps 1 --warmup 0   # smoke, fold only

Results (JSON and a markdown table beside it) are rewritten after every contender; ``--append``
keeps what ``--out`` already holds and measures only the rows missing or failed there (a run split
over several calls).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import peer_blocks as pb
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.blocks import MASKS
from benchmarks.common.graphs import capture
from benchmarks.common.kernel_time import kernel_ms
from benchmarks.common.machine import (
    add_pin_argument,
    device_name,
    pin_cpus,
    pin_note,
)
from benchmarks.common.peer_runs import (
    PARAMS,
    build,
    check_replay,
    contenders,
    error_text,
    forward_step,
    parse_rows,
    replay_verdict,
    settle_precision,
    train_step,
    versions,
)
from benchmarks.common.results import write_result
from benchmarks.common.timing import median_ms

ROWS = [pb.Shape("evoformer", 256, n_seq=128), pb.Shape("evoformer", 384, n_seq=512),
        pb.Shape("pairformer", 256), pb.Shape("pairformer", 384), pb.Shape("pairformer", 512),
        pb.Shape("pairformer", 768), pb.Shape("diffusion", 384, samples=48),
        pb.Shape("diffusion", 768, samples=48)]
TINY_ROWS = [pb.Shape("evoformer", 9, n_seq=4), pb.Shape("pairformer", 13),
             pb.Shape("diffusion", 13, samples=3)]
MODES = ("train_eager", "train_graph", "fwd_eager", "fwd_graph")  # the default set
# The summed kernel time of an eager step (every stream, no host gaps; median of KERNEL_REPS
# steps): what a replay holding all the work would take, for contenders whose replays do not
# (Protenix 2.0's fast LayerNorm). On request only: each step is profiled.
KERNEL_MODES = ("train_kernels", "fwd_kernels")
KERNEL_REPS = 5


# ---------------------------------------------------------------------------------------------
# Timing


def measure(case: pb.Case, device: torch.device, modes: tuple[str, ...], warmup: int,
            reps: int) -> dict[str, Any]:
    """``{mode}_ms`` for each mode that ran, ``errors[mode]`` for each that did not, and the
    activation peak of one eager training step (``train_peak_mib``, CUDA only)."""
    try:
        train = train_step(case)
    except Exception as e:  # noqa: BLE001  (a peer's failure is a result, not a crash)
        return {"error": f"forward failed: {error_text(e)}"}
    fwd = forward_step(case)
    res: dict[str, Any] = {"errors": {}}
    for mode in modes:
        body = train if mode.startswith("train") else fwd
        try:
            if mode.endswith("graph"):
                replay = capture(body, device, max(warmup, 2))[0]
                res[f"{mode}_ms"] = median_ms(replay, device, reps, warmup)
                del replay
            elif mode.endswith("kernels"):
                res[f"{mode}_ms"] = kernel_ms(body, device, min(reps, KERNEL_REPS), warmup)
            else:
                res[f"{mode}_ms"] = median_ms(body, device, reps, warmup)
                if mode == "train_eager" and device.type == "cuda":
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    base = torch.cuda.memory_allocated(device)
                    body()
                    torch.cuda.synchronize(device)
                    res["train_peak_mib"] = (torch.cuda.max_memory_allocated(device)
                                             - base) / 2**20
        except Exception as e:  # noqa: BLE001  (a peer's failure is a result, not a crash)
            res["errors"][mode] = error_text(e)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    if any(m.endswith("graph") for m in modes):
        res.update(check_replay(case, device))
    return res


# ---------------------------------------------------------------------------------------------
# Contenders


def run_one(name: str, kernels: bool | None, shape: pb.Shape, sizes, device,
            args, modes: tuple[str, ...]) -> dict[str, Any]:
    """One contender's row for ``shape``: its build, then ``modes`` (one of :func:`phases`)."""
    row: dict[str, Any] = {"block": shape.block, "n": shape.n, "n_seq": shape.n_seq,
                           "samples": shape.samples, "contender": name,
                           "kernels": "-" if kernels is None else ("on" if kernels else "off")}
    try:
        row["version"] = "this tree" if name == "fold" else pb.peer_version(pb.PEERS[name][0])
    except Exception as e:  # noqa: BLE001
        row["error"] = f"not installed: {error_text(e)}"
        return row
    row["weights"] = args.fold_precision if name == "fold" else str(args.peer_dtype)
    try:
        case = build(name, kernels, shape, sizes, pb.base_inputs(shape, sizes, args.mask), device,
                      args)
    except ImportError as e:
        row["error"] = f"not installed: {error_text(e)}"
        return row
    except Exception as e:  # noqa: BLE001
        row["error"] = f"build failed: {error_text(e)}"
        return row
    row["note"] = case.note
    row["params"] = sum(p.numel() for p in case.params)  # same sizes, peers' own layouts
    row.update(measure(case, device, modes, args.warmup, args.reps))
    del case
    return row


# ---------------------------------------------------------------------------------------------
# Results


def ratios(rows: list[dict[str, Any]], modes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per shape and mode: fold's ms, the best peer's ms and name, and fold/peer."""
    out = []
    shapes = dict.fromkeys((r["block"], r["n"], r["n_seq"], r["samples"]) for r in rows)
    for key in shapes:  # in the order measured
        same = [r for r in rows if (r["block"], r["n"], r["n_seq"], r["samples"]) == key]
        fold = next((r for r in same if r["contender"] == "fold"), None)
        for mode in modes:
            peers = [r for r in same if r["contender"] != "fold" and f"{mode}_ms" in r]
            best = min(peers, key=lambda r: r[f"{mode}_ms"]) if peers else None
            entry = {"block": key[0], "n": key[1], "n_seq": key[2], "samples": key[3],
                     "mode": mode, "fold_ms": fold.get(f"{mode}_ms") if fold else None,
                     "best_peer": None, "peer_ms": None, "fold_over_peer": None}
            if best is not None:
                entry["best_peer"] = f"{best['contender']} (kernels {best['kernels']})"
                if mode.endswith("graph") and best.get("replay_incomplete"):
                    entry["best_peer"] += ", replay incomplete"
                entry["peer_ms"] = best[f"{mode}_ms"]
                if entry["fold_ms"] is not None:
                    entry["fold_over_peer"] = entry["fold_ms"] / entry["peer_ms"]
            out.append(entry)
    return out


def _shape_label(r: dict[str, Any]) -> str:
    return pb.Shape(r["block"], r["n"], r["n_seq"], r["samples"]).label()


def _cell(r: dict[str, Any], mode: str) -> str:
    if f"{mode}_ms" in r:
        return f"{r[f'{mode}_ms']:.2f}"
    if r.get("error"):
        return "-"
    err = r.get("errors", {}).get(mode)
    return f"failed: {err[:60]}" if err else "-"


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], modes: tuple[str, ...]) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [f"Blocks against peers, {meta['device']}, {meta['date']}; {vers}. fold: "
             f"{_fold_setting(meta)}; peers: {meta['peer_weights']} weights and "
             "inputs under bf16 autocast (CUDA). Median ms of "
             f"{meta['reps']} after {meta['warmup']} warm-up; backward from fixed random output "
             f"gradients. Token mask: {meta.get('mask', 'holes')}. "
             + (f"{PARAMS[meta['params']].capitalize()}. " if meta.get("params") else "")
             + ("'kernels' modes: the summed kernel time of an eager step (profiler, every "
                f"stream), median of {min(meta['reps'], KERNEL_REPS)}. "
                if set(modes) & set(KERNEL_MODES) else "")
             + pin_note(meta.get("cpus_pinned")),
             "",
             "| row | contender | kernels | " + " | ".join(m.replace("_", " ") + " ms"
                                                          for m in modes)
             + " | train peak MiB | params | note / error |",
             "|---|---|---|" + "---|" * len(modes) + "---|---|---|"]
    for r in rows:
        peak = f"{r['train_peak_mib']:.0f}" if r.get("train_peak_mib") is not None else "-"
        note = r.get("error") or r.get("note") or ""
        if r.get("replay_incomplete"):
            note = f"{replay_verdict(r)}, its times leave it out; " + note
        lines.append(f"| {_shape_label(r)} | {r['contender']} {r.get('version', '')} | "
                     f"{r['kernels']} | " + " | ".join(_cell(r, m) for m in modes)
                     + f" | {peak} | {r.get('params', '-')} | {note[:160]} |")
    lines += ["", "fold / best peer (< 1: fold faster):", "",
              "| row | mode | fold ms | best peer | peer ms | fold/peer |",
              "|---|---|---|---|---|---|"]
    for e in ratios(rows, modes):
        def f(v):
            return "-" if v is None else f"{v:.2f}"
        lines.append(f"| {_shape_label(e)} | {e['mode']} | {f(e['fold_ms'])} | "
                     f"{e['best_peer'] or 'none measured'} | {f(e['peer_ms'])} | "
                     f"{f(e['fold_over_peer'])} |")
    return "\n".join(lines) + "\n"


def _fold_setting(meta: dict[str, Any]) -> str:
    precision = meta.get("fold_precision", "bf16")
    if precision == "bf16" or meta.get("device", "cpu") == "cpu":
        return f"{meta['fold_dtype']} weights and inputs"
    weights, dtype, _ = pb.FOLD_PRECISIONS[precision]
    return f"{weights} weights, {dtype} inputs under bf16 autocast ({precision})"


def save(out: Path, meta, rows, modes) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": rows, "ratios": ratios(rows, modes)}
    write_result(out, doc, markdown(meta, rows, modes), indent=1)


EAGER_MODES = ("train_eager", "fwd_eager")


def phases(modes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The modes in the order they run: every contender's eager modes, then every contender's
    others (replays, kernel sums, the replay check). On the H200, OpenFold's eager Evoformer
    step at (128, 256) took 21.3-23.3 ms in processes where no CUDA graph had been captured
    before it, and 26.5-38.5 ms after captures in the same process (its own or fold's;
    results/model/model_peers_h200_evoformer_order_*): the eager modes go first for everyone."""
    eager = tuple(m for m in modes if m in EAGER_MODES)
    rest = tuple(m for m in modes if m not in EAGER_MODES)
    return [p for p in (eager, rest) if p]


def merge(row: dict[str, Any], later: dict[str, Any]) -> None:
    """``later`` (the same contender and shape, a later phase's modes) into ``row``."""
    errors = {**row.get("errors", {}), **later.get("errors", {})}
    row.update(later)
    row["errors"] = errors


def _key(r: dict[str, Any]) -> tuple:
    return (r["block"], r["n"], r["n_seq"], r["samples"], r["contender"], r["kernels"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny presets and sizes (CPU smoke); contenders default to fold alone")
    ap.add_argument("--blocks", default=None,
                    help="rows, e.g. 'evoformer:128x256,pairformer:384,diffusion:384x48'")
    ap.add_argument("--contenders", default=None,
                    help="fold, protenix, boltz, openfold (default: all; with --tiny: fold)")
    ap.add_argument("--kernels", default="on,off", help="peer kernel flags to run: on, off or both")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"subset of {','.join(MODES + KERNEL_MODES)} (default: the first four)")
    ap.add_argument("--mask", choices=MASKS, default="holes",
                    help="the token mask's pattern (benchmarks.common.blocks.pattern_mask)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peer-weights", choices=["match", "fp32", "bf16"], default="match",
                    help="peers' parameter and input dtype under bf16 autocast. match (default): "
                         "like fold's, bf16 with --fold-precision bf16 (issue 21's setting), "
                         "fp32 with the mixed ones (bf16-mixed training and prediction); "
                         "Boltz's fp32 regions reject bf16 LayerNorm weights")
    ap.add_argument("--params", choices=sorted(PARAMS), default="noised",
                    help="every contender's parameters noised (default: seeded noise on every "
                         "parameter, as no layer of trained weights is zero) or as initialised "
                         "(the output layers are zeros, so no gradient reaches upstream of "
                         "them; the same kernels run: within 1%% of noised for fold and Protenix "
                         "on the H200, results/model/model_peers_h200_params_*)")
    ap.add_argument("--protenix-layernorm", choices=["fast_layernorm", "torch"], default=None,
                    help="Protenix's LAYERNORM_TYPE (default: fast_layernorm on CUDA, its "
                         "default, built by benchmarks/peer_setup.sh; torch on CPU)")
    ap.add_argument("--fold-precision", choices=sorted(pb.FOLD_PRECISIONS), default="bf16",
                    help="fold's parameters and inputs (CUDA): bf16 (default: bf16 throughout), "
                         "mixed (fp32 under bf16 autocast, as fold-train predict runs), "
                         "mixed-bf16-weights (bf16 parameters, fp32 streams, autocast: the AF3 "
                         "trunk under system.bf16_weights)")
    add_pin_argument(ap)
    ap.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside it)")
    ap.add_argument("--append", action="store_true",
                    help="keep --out's rows, measure only those missing or failed there (a run "
                         "split over several calls; meta is this call's)")
    args = ap.parse_args(argv)

    pinned = pin_cpus(args.pin_cpu)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("model_peers: --device cuda but CUDA is not available")
    if device.type == "cuda" and args.reps < 20:
        raise SystemExit("model_peers: issue 21 asks for the median of at least 20 replays")
    names = (args.contenders or ("fold" if args.tiny else "fold,protenix,boltz,openfold"))
    names = [n.strip() for n in names.split(",")]
    unknown = set(names) - {"fold", *pb.PEERS}
    if unknown:
        raise SystemExit(f"--contenders: unknown {sorted(unknown)}")
    args.modes = tuple(m.strip() for m in args.modes.split(","))
    if set(args.modes) - set(MODES + KERNEL_MODES):
        raise SystemExit(f"--modes: choose from {MODES + KERNEL_MODES}")
    kernel_settings = [{"on": True, "off": False}[k.strip()] for k in args.kernels.split(",")]
    settle_precision(args, device)
    shapes = parse_rows(args.blocks) if args.blocks else (TINY_ROWS if args.tiny else ROWS)

    backends = ensure_kernels(device, needed=device.type == "cuda")
    meta = {"device": device_name(device),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": versions(names), "fold_attention_backends": backends,
            "fold_dtype": str(args.fold_dtype), "fold_precision": args.fold_precision,
            "peer_weights": str(args.peer_dtype),
            "protenix_layernorm": args.protenix_layernorm, "params": args.params,
            "protenix_layernorm_build_error": os.environ.get("PEERS_PROTENIX_LAYERNORM_ERROR"),
            "warmup": args.warmup, "cpus_pinned": pinned, "mask": args.mask,
            "reps": args.reps, "modes": list(args.modes), "tiny": args.tiny,
            "graphs": "CUDA-graph replay" if device.type == "cuda"
            else "no graphs on CPU: the graph modes run the same step eagerly"}
    print(json.dumps(meta), flush=True)
    sizes = pb.fold_sizes(args.tiny)
    rows: list[dict[str, Any]] = []
    if args.append and args.out is not None and args.out.exists():
        rows = json.loads(args.out.read_text())["rows"]
        print(f"--append: {len(rows)} rows from {args.out}", flush=True)
    done = {_key(r) for r in rows if "error" not in r and not r.get("errors")}
    fresh: dict[tuple, dict[str, Any]] = {}  # this call's rows, by key
    for phase in phases(args.modes):
        for shape in shapes:
            for name, kernels in contenders(names, shape, kernel_settings):
                key = (shape.block, shape.n, shape.n_seq, shape.samples, name,
                       "-" if kernels is None else ("on" if kernels else "off"))
                if key in done or "error" in fresh.get(key, {}):
                    continue  # measured before, or not built in the first phase
                row = run_one(name, kernels, shape, sizes, device, args, phase)
                if key in fresh:
                    merge(fresh[key], row)
                else:
                    rows = [r for r in rows if _key(r) != key]  # a new try replaces a failed one
                    rows.append(row)
                    fresh[key] = row
                print(json.dumps(fresh[key]), flush=True)
                if args.out is not None:
                    save(args.out, meta, rows, args.modes)
    print(markdown(meta, rows, args.modes), flush=True)
    return rows


if __name__ == "__main__":
    main()
