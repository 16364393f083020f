"""``fold-train predict`` with CUDA graphs on and off (issue 20 section 2): wall time per recycling
iteration (AF2, a 1024-residue chain) and per trunk pass / diffusion step (AF3, a 768-token
protein), in one process on one GPU.

Drives the functions ``fold-train predict`` calls: a checkpoint with random weights written by
fold-train's ``save_checkpoint`` and read back by ``load_trained_model`` (the CLI's loader), the
input featurized from files as the CLI does (AF2: a FASTA and an a3m MSA through
``make_raw_features``; AF3: an AlphaFold3 input JSON through ``make_af3_inputs``), then
``predict_structure`` / ``predict_af3`` with a predictor whose ``timing`` records each replayed
piece (device synchronized around it). Each configuration runs twice; the second run is timed
(the first captures the graphs and autotunes the kernels).

    source benchmarks/gpu_setup.sh
    python -m benchmarks.train.predict_graphs --out-dir benchmarks/results/train   # one H100
    python -m benchmarks.train.predict_graphs --tiny --device cpu --out-dir /tmp/pg  # smoke (CPU)

On CPU (``--tiny``) "graphs on" uses ``EagerCapture`` (fold-train's CPU stand-in for a capture):
the smoke test checks the plumbing, not the speed. Writes ``predict_graphs.json`` and
``predict_graphs.md`` (atomically) in ``--out-dir``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common.machine import versions
from benchmarks.common.predict_inputs import af2_query_files, af3_prediction, random_checkpoint
from benchmarks.common.results import RESULTS, write_result


def _summary(times: list[float]) -> dict:
    return {"n": len(times), "median_s": statistics.median(times), "min_s": min(times),
            "mean_s": statistics.fmean(times)}


def _predictor_kwargs(graphs: bool, device: torch.device, once: bool = True) -> dict:
    casts = {"cast_weights_once": once}
    if graphs and device.type != "cuda":
        from fold_train.cuda_graphs import EagerCapture

        return {"backend": EagerCapture(), **casts}  # CPU smoke: the capture's stand-in
    return {"cuda_graphs": graphs, **casts}


def _configs(precision: str, casts: str, graphs: str = "both") -> list[tuple[bool, bool]]:
    """``(graphs, weights cast once)`` to time: graphs off and on (or the one ``graphs``
    names); with ``casts`` "both" (bf16 only: fp32 casts nothing) the weights cast once and
    per call, beside each other."""
    onces = [casts != "per-call"] if casts != "both" or precision != "bf16" else [True, False]
    settings = {"off": (False,), "on": (True,), "both": (False, True)}[graphs]
    return [(g, once) for g in settings for once in onces]


def bench_af2(device: torch.device, tiny: bool, folder: Path, chunk_size: int | None,
              casts: str = "once", graph_modes: str = "both") -> list:
    from fold_train.predict import load_trained_model, make_raw_features, predict_structure
    from fold_train.predict_graphs import AF2Predictor

    if tiny:
        preset, overrides, n_res, n_msa = "tiny", ["data.n_res=24", "data.n_clust=6",
                                                   "data.n_extra=8"], 40, 16
    else:
        preset, overrides, n_res, n_msa = "af2_initial", [], 1024, 512
    ckpt = random_checkpoint(preset, overrides, folder / "af2.ckpt")
    model, cfg = load_trained_model(ckpt, device)
    if chunk_size:
        model.set_chunk_size(chunk_size)
    fasta, a3m = af2_query_files(n_res, n_msa, folder)
    _, raw, _ = make_raw_features(fasta=fasta, msas=[a3m])
    rows = []
    for graphs, once in _configs(cfg.system.precision, casts, graph_modes):
        predictor = AF2Predictor(model, device, precision=cfg.system.precision, timing=True,
                                 **_predictor_kwargs(graphs, device, once))
        t0 = time.perf_counter()
        predict_structure(model, raw, cfg.data_preset(), device=device,
                          precision=cfg.system.precision,
                          predictor=predictor)  # captures, autotunes
        first = time.perf_counter() - t0
        predictor.timings.clear()
        t0 = time.perf_counter()
        pred = predict_structure(model, raw, cfg.data_preset(), device=device,
                                 precision=cfg.system.precision, predictor=predictor)
        total = time.perf_counter() - t0
        if not np.isfinite(pred.positions).all():
            raise FloatingPointError("AF2 prediction is not finite")
        rows.append({"family": "af2", "preset": preset, "n_res": n_res, "graphs": graphs,
                     "weights_cast_once": once, "precision": cfg.system.precision,
                     "bucket": dict(predictor.buckets[-1][0]),
                     "first_call_s": first, "total_s": total,
                     "recycle": _summary(predictor.timings["recycle"]),
                     "mean_plddt": float(pred.plddt.mean())})
        del predictor
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_af3(device: torch.device, tiny: bool, folder: Path, steps: int,
              casts: str = "once", rounds: int = 1, graph_modes: str = "both") -> list:
    """Each configuration's first prediction captures and autotunes; then ``rounds`` timed
    predictions of every configuration in turn (alternating, so the host's drift between
    rounds, large for the host-bound eager steps, falls on every configuration alike)."""
    from fold_train.predict_af3 import predict_af3
    from fold_train.predict_graphs import AF3Predictor

    model, cfg, raw, preset, n_token, samples = af3_prediction(device, tiny, folder)
    runs = []
    for graphs, once in _configs(cfg.system.precision, casts, graph_modes):
        predictor = AF3Predictor(model, device, precision=cfg.system.precision, timing=True,
                                 **_predictor_kwargs(graphs, device, once))
        run = dict(seed=0, device=device, precision=cfg.system.precision, no_samples=samples,
                   no_steps=steps, predictor=predictor)
        t0 = time.perf_counter()
        predict_af3(model, raw, **run)
        runs.append({"graphs": graphs, "once": once, "run": run, "predictor": predictor,
                     "first": time.perf_counter() - t0, "totals": [], "trunk": [],
                     "step": [], "round_step_ms": []})
    for _ in range(rounds):
        for r in runs:
            r["predictor"].timings.clear()
            t0 = time.perf_counter()
            r["pred"] = predict_af3(model, raw, **r["run"])
            r["totals"].append(time.perf_counter() - t0)
            timings = r["predictor"].timings
            r["trunk"] += timings["trunk_cycle"]
            r["step"] += timings["sampler_step"]
            r["round_step_ms"].append(1e3 * statistics.median(timings["sampler_step"]))
    rows = [{"family": "af3", "preset": preset, "n_token": n_token,
             "n_atom": int(len(raw["atom_to_token"])), "samples": samples,
             "sampler_steps": steps, "graphs": r["graphs"], "weights_cast_once": r["once"],
             "precision": cfg.system.precision,
             "bucket": dict(r["predictor"].buckets[-1][0]), "first_call_s": r["first"],
             "total_s": statistics.median(r["totals"]), "rounds": rounds,
             "round_step_ms": r["round_step_ms"],
             "trunk_cycle": _summary(r["trunk"]), "sampler_step": _summary(r["step"]),
             "mean_plddt": float(r["pred"].plddt.mean())} for r in runs]
    runs.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def to_markdown(result: dict) -> str:
    lines = [f"# fold-train predict: CUDA graphs on / off ({result['device']})", "",
             f"torch {result['torch']}, triton {result['triton']}, {result['date']}. Median wall "
             "time of each replayed piece in the second (timed) prediction; the first "
             "prediction captures the graphs.", "",
             "| input | graphs | weights cast | bucket | per recycle / trunk pass (ms) | per "
             "diffusion step (ms) | whole prediction (s) | first call (s) |",
             "|---|---|---|---|---|---|---|---|"]
    rounds = max((r.get("rounds", 1) for r in result["rows"]), default=1)
    if rounds > 1:
        lines[2] += (f" AF3: {rounds} timed predictions of each configuration, in turn; "
                     "medians over all.")
    for r in result["rows"]:
        if r["family"] == "af2":
            what = f"AF2 {r['preset']}, {r['n_res']} residues"
            cyc, step = r["recycle"]["median_s"] * 1e3, None
        else:
            what = (f"AF3 {r['preset']}, {r['n_token']} tokens / {r['n_atom']} atoms, "
                    f"{r['samples']} samples x {r['sampler_steps']} steps")
            cyc, step = r["trunk_cycle"]["median_s"] * 1e3, r["sampler_step"]["median_s"] * 1e3
        bucket = ", ".join(f"{k} {v}" for k, v in r["bucket"].items())
        cast = {True: "once", False: "per call"}[r.get("weights_cast_once", True)]
        if r["precision"] != "bf16":
            cast = "- (fp32)"
        lines.append(f"| {what} | {'on' if r['graphs'] else 'off'} | {cast} | {bucket} | "
                     f"{cyc:.1f} | "
                     f"{'' if step is None else f'{step:.2f}'} | {r['total_s']:.2f} | "
                     f"{r['first_call_s']:.2f} |")
    for fam, key in (("af2", "recycle"), ("af3", "trunk_cycle"), ("af3", "sampler_step")):
        times = {(r["graphs"], r.get("weights_cast_once", True)): r[key]["median_s"]
                 for r in result["rows"] if r["family"] == fam}
        if (True, True) in times and (False, True) in times:
            lines.append(f"\n{fam.upper()} {key}: graphs on / off = "
                         f"{times[True, True] / times[False, True]:.3f}")
        for graphs in (False, True):
            if (graphs, False) in times and (graphs, True) in times:
                lines.append(f"\n{fam.upper()} {key}, graphs {'on' if graphs else 'off'}: "
                             f"weights cast per call / once = "
                             f"{times[graphs, False] / times[graphs, True]:.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny presets and inputs (CPU smoke)")
    p.add_argument("--out-dir", default=str(RESULTS / "train"))
    p.add_argument("--only", choices=("af2", "af3"), help="one family only")
    p.add_argument("--sampler-steps", type=int, default=None,
                   help="AF3 EDM steps (default 50; 3 with --tiny): the per-step time is the "
                        "measurement, the step count only scales the total")
    p.add_argument("--rounds", type=int, default=1,
                   help="AF3: timed predictions of every configuration, in turn (medians over "
                        "all of them; each round's step median is kept in the JSON)")
    p.add_argument("--weight-casts", choices=("once", "per-call", "both"), default="once",
                   help="bf16: the predictor's weight casts made once (fold-train predict's "
                        "default), in every call, or both beside each other")
    p.add_argument("--graphs", choices=("on", "off", "both"), default="both",
                   help="time predictions with CUDA graphs on, off, or both (default)")
    p.add_argument("--chunk-size", type=int, help="AF2 manual chunking (if 1024 residues do not "
                                                  "fit unchunked)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.tiny:
        torch.set_num_threads(1)
    out_dir = Path(args.out_dir)
    steps = args.sampler_steps or (3 if args.tiny else 50)
    result = {**versions(device), "tiny": args.tiny, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "af2"):
            result["rows"] += bench_af2(device, args.tiny, Path(tmp), args.chunk_size,
                                        args.weight_casts, args.graphs)
        if args.only in (None, "af3"):
            result["rows"] += bench_af3(device, args.tiny, Path(tmp), steps, args.weight_casts,
                                        args.rounds, args.graphs)
    md = to_markdown(result)
    write_result(out_dir / "predict_graphs.json", result, md, indent=2)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
