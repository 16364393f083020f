"""``fold-train predict`` of one long chain split over the GPUs of a host with Dynamic Axial
Parallelism (issue 28; FastFold section 6.2, Table 5): wall time per recycling pass and of the
whole prediction, and peak memory per rank, for each DAP degree (the world size of the run).

    source benchmarks/gpu_setup.sh
    # one GPU, DAP 1, the baseline: AF2 3072 residues (2 passes) and 4096 (1 pass; skipped if
    # 3072 projects it past the budget), about 6 minutes on one H100; then AF3 1024 tokens
    # (5 samples x 50 steps, 1 trunk cycle), about 2 minutes
    python -m benchmarks.parallel.predict_dap --n-res 3072 4096 --recycles 2 1 \\
        --chunk-size 64 --budget-s 420 --out benchmarks/results/parallel/predict_dap_1gpu.json
    python -m benchmarks.parallel.predict_dap --n-res --af3-tokens 1024 \\
        --out benchmarks/results/parallel/predict_dap_1gpu_af3.json
    # N GPUs of one host, DAP N (N = 2, 4, 8)
    torchrun --nproc-per-node N -m benchmarks.parallel.predict_dap --n-res 3072 4096 \\
        --recycles 2 --chunk-size 64 --af3-tokens 1024 \\
        --out benchmarks/results/parallel/predict_dap_Ngpu.json
    # every degree in one table, FastFold's figures beside
    python -m benchmarks.parallel.predict_dap \\
        --merge benchmarks/results/parallel/predict_dap_*gpu.json \\
        --out benchmarks/results/parallel/predict_dap.json
    # CPU smoke (gloo)
    torchrun --nproc-per-node 2 -m benchmarks.parallel.predict_dap --tiny --device cpu \\
        --af3-tokens 15 --out /tmp/p.json

What runs is what ``torchrun ... fold-train predict --dap N`` runs: a checkpoint with random
(seeded) weights of the ``af2_initial`` model written by fold-train's ``save_checkpoint`` and read
by ``load_trained_model``; the rank's :class:`fold_train.predict_dap.PredictParallel` applied
through ``parallelize`` (DAP of the Evoformer, extra MSA and template stacks, DAO on, CUDA graphs
off, ``--chunk-size`` per rank); the pre-flight memory check with the per-rank plan; the input
featurized from files (a FASTA and an a3m MSA of ``--msa-rows`` rows) by ``make_raw_features``;
``predict_structure`` with a predictor that times each recycling pass (device synchronized around
it). The first pass includes the kernels' autotuning at the new shape; the later passes are warm,
so 2 passes (``--recycles``, one value per size) give one warm pass, and the whole 4-pass
prediction of AF2 is estimated as first + 3 x warm. AF3 (``--af3-tokens``, run first): a protein
of that many residues as an AlphaFold3 JSON, ``predict_af3`` with the trunk under DAP and the
diffusion samples split over the ranks (unchunked: sizes that fit one GPU's share).

``--budget-s`` skips an AF2 size whose projected time (the previous size's per-pass time scaled
by N^3, the triangle attention's growth, x 1.25 for the autotuning of the first pass) would pass
the budget; skipped and out-of-memory rows are recorded as such. Rank 0 writes the JSON and a
Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.common.machine import versions
from benchmarks.common.predict_inputs import af2_query_files, random_checkpoint, random_sequence
from benchmarks.common.results import REPO, RESULTS, merged_rows, write_result

# FastFold (Cheng et al. 2024) Table 5: inference latency (s) of AF2 on A100s, DAP + AutoChunk;
# AlphaFold and OpenFold (one GPU, chunked) are out of memory from 3072 residues.
FASTFOLD = {2560: {4: 154.422, 8: 133.381}, 3072: {4: 238.51, 8: 201.916},
            3584: {4: 414.185, 8: 388.691}, 4096: {4: "OOM", 8: 547.955}}
AF2_PASSES = 4  # af2_initial: 3 recycling iterations + the final pass (AF2 inference default)


def _context(device: str | None):
    """This rank's ``DistContext`` and ``PredictParallel`` (DAP over the whole world)."""
    from fold_train.distributed import DistContext, model_parallel, setup
    from fold_train.predict_dap import PredictParallel

    if dist.is_initialized():  # started by a test harness
        dev = torch.device(device or "cpu")
        ctx = DistContext(dist.get_rank(), dist.get_world_size(), dev, None)
    else:
        ctx = setup(device)
    ctx = model_parallel(ctx, dap=ctx.world_size)
    groups = ctx.groups
    return ctx, PredictParallel(ctx.rank, groups.dap_index if groups else 0, ctx.world_size,
                                groups)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _everyone(obj: Any, ctx) -> list[Any]:
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _shared_folder(ctx) -> Path:
    """One temporary folder for the checkpoint and inputs, made by rank 0 (one host)."""
    folder = tempfile.mkdtemp(prefix="fold_predict_dap_") if ctx.rank == 0 else None
    return Path(_everyone(folder, ctx)[0])


def bench_af2(args, ctx, parallel, folder: Path, deadline: float | None) -> list[dict]:
    from fold_data.limits import InputTooLarge
    from fold_train.families import make_family
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model, make_raw_features, predict_structure
    from fold_train.predict_graphs import AF2Predictor
    from fold_train.predict_size import check_af2_input

    preset, overrides = ("tiny", ["data.n_clust=5", "data.n_extra=7"]) if args.tiny \
        else ("af2_initial", [])
    if args.templates is not None:  # template slots of the inference sample (no hits: masked)
        overrides.append(f"data.n_templ={args.templates}")
    ckpt = folder / "af2.ckpt"
    if ctx.rank == 0:
        random_checkpoint(preset, overrides, ckpt)
    _everyone(None, ctx)  # written before the others read it
    model, cfg = load_trained_model(ckpt, ctx.device)
    done = parallelize(model, make_family("af2", cfg.model_config()),
                       parallel.adjust(Techniques(chunk_size=args.chunk_size)))
    rows, last = [], None
    for i, n_res in enumerate(args.n_res):
        passes_wanted = args.recycles[min(i, len(args.recycles) - 1)]
        row: dict[str, Any] = {"family": "af2", "preset": preset, "n_res": n_res,
                               "dap": parallel.dap, "chunk_size": args.chunk_size,
                               "recycles": passes_wanted, "precision": cfg.system.precision,
                               "dap_stacks": len(done.parallel_handles)}
        if deadline is not None and last is not None:
            per_pass, n_prev = last
            projected = per_pass * (n_res / n_prev) ** 3 * passes_wanted * 1.25
            if time.perf_counter() + projected > deadline:
                rows.append({**row, "status": f"skipped (projected {projected:.0f} s passes the "
                                              f"--budget-s)"})
                continue
        if ctx.rank == 0:
            af2_query_files(n_res, args.msa_rows, folder, stem=f"query{n_res}")
        _everyone(None, ctx)
        fasta, a3m = folder / f"query{n_res}.fasta", folder / f"query{n_res}.a3m"
        if ctx.device.type == "cuda":  # the last size's cached blocks count as used otherwise
            torch.cuda.empty_cache()
        try:
            check_af2_input(fasta=fasta, msas=[a3m], model_config=cfg.model_config(),
                            data_preset=cfg.data_preset(), precision=cfg.system.precision,
                            device=ctx.device, chunk_size=args.chunk_size, dap=parallel.dap)
        except InputTooLarge as e:
            rows.append({**row, "status": f"refused by the pre-flight check: {e}"})
            continue
        _, raw, _ = make_raw_features(fasta=fasta, msas=[a3m])
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
        predictor = AF2Predictor(model, ctx.device, precision=cfg.system.precision,
                                 cuda_graphs=False, timing=True)
        status, pred = "ok", None
        t0 = time.perf_counter()
        try:
            pred = predict_structure(model, raw, cfg.data_preset(), device=ctx.device,
                                     precision=cfg.system.precision,
                                     num_recycles=passes_wanted, predictor=predictor)
        except RuntimeError as e:
            if not _is_oom(e):
                raise
            status = "OOM"
        total = time.perf_counter() - t0
        status = "OOM" if "OOM" in _everyone(status, ctx) else status  # every rank agrees
        passes = predictor.timings.get("recycle", [])
        row.update(status=status, total_s=total, passes_s=passes,
                   peak_gib_per_rank=_everyone(_peak_gib(ctx.device), ctx))
        if status == "ok" and passes:
            warm = statistics.median(passes[1:]) if len(passes) > 1 else None
            row.update(first_pass_s=passes[0], warm_pass_s=warm,
                       whole_prediction_estimate_s=(passes[0] + (AF2_PASSES - 1) * warm
                                                    if warm is not None else None),
                       mean_plddt=float(pred.plddt.mean()),
                       finite=bool(np.isfinite(pred.positions).all()))
            last = (warm or passes[0], n_res)
        rows.append(row)
        del predictor, pred, raw
    return rows


def bench_af3(args, ctx, parallel, folder: Path) -> list[dict]:
    from fold_data.af3 import Ccd
    from fold_train.families import make_family
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model
    from fold_train.predict_af3 import make_af3_inputs, predict_af3
    from fold_train.predict_graphs import AF3Predictor

    preset = "af3_tiny" if args.tiny else "af3"
    ckpt = folder / "af3.ckpt"
    if ctx.rank == 0:
        random_checkpoint(preset, [], ckpt)
    _everyone(None, ctx)
    model, cfg = load_trained_model(ckpt, ctx.device, family="af3")
    done = parallelize(model, make_family("af3", cfg.model_config()),
                       parallel.adjust(Techniques()))
    ccd = Ccd([REPO / "data" / "demo" / "af3" / "ccd.cif"], use_biotite=False)
    rows = []
    for n_token in args.af3_tokens:
        source = folder / f"af3_{n_token}.json"
        if ctx.rank == 0:
            chain = {"protein": {"id": "A", "sequence": random_sequence(n_token, 2)}}
            source.write_text(json.dumps({
                "name": f"bench{n_token}", "modelSeeds": [0], "dialect": "alphafold3",
                "version": 4, "sequences": [chain]}))
        _everyone(None, ctx)
        _, raw = make_af3_inputs(source, ccd)
        row: dict[str, Any] = {"family": "af3", "preset": preset, "n_token": n_token,
                               "n_atom": int(len(raw["atom_to_token"])), "dap": parallel.dap,
                               "samples": args.samples, "sampler_steps": args.sampler_steps,
                               "cycles": args.af3_cycles, "precision": cfg.system.precision,
                               "dap_stacks": len(done.parallel_handles)}
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
        predictor = AF3Predictor(model, ctx.device, precision=cfg.system.precision,
                                 cuda_graphs=False, timing=True)
        status = "ok"
        t0 = time.perf_counter()
        try:
            predict_af3(model, raw, seed=0, device=ctx.device, precision=cfg.system.precision,
                        no_samples=args.samples, no_steps=args.sampler_steps,
                        no_cycles=args.af3_cycles, predictor=predictor, parallel=parallel)
        except RuntimeError as e:
            if not _is_oom(e):
                raise
            status = "OOM"
        total = time.perf_counter() - t0
        status = "OOM" if "OOM" in _everyone(status, ctx) else status
        row.update(status=status, total_s=total,
                   trunk_cycle_s=predictor.timings.get("trunk_cycle", []),
                   sampler_step_median_s=(statistics.median(predictor.timings["sampler_step"])
                                          if predictor.timings.get("sampler_step") else None),
                   peak_gib_per_rank=_everyone(_peak_gib(ctx.device), ctx))
        rows.append(row)
        del predictor
    return rows


def _fmt(x: Any, digits: int = 1) -> str:
    return "" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def to_markdown(result: dict) -> str:
    presets = ", ".join(sorted({f"{r['family'].upper()} `{r['preset']}`" for r in result["rows"]}))
    lines = [f"# fold-train predict under DAP ({result['device']})", "",
             f"torch {result['torch']}, triton {result['triton']}, {result['date']}. One process "
             f"per GPU; models ({presets}) with random weights, the preset's precision, "
             "`--chunk-size` per rank (AF2), DAO on, CUDA graphs off. The first pass includes "
             "the kernels' autotuning; the 4-pass estimate is first + 3 x warm pass.", "",
             "| family | size | DAP (GPUs) | status | first pass (s) | warm pass (s) | whole "
             "prediction (s) | 4-pass estimate (s) | peak GiB per rank (max) | FastFold A100 "
             "(4 / 8 GPUs, s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        peaks = [p for p in r.get("peak_gib_per_rank") or [] if p is not None]
        peak = f"{max(peaks):.1f}" if peaks else ""
        status = r["status"] if len(r["status"]) < 40 else r["status"][:37] + "..."
        if r["family"] == "af2":
            ff = FASTFOLD.get(r["n_res"])
            anchor = f"{_fmt(ff[4])} / {_fmt(ff[8])}" if ff else ""
            lines.append(f"| AF2 | {r['n_res']} res, {r['recycles']} passes | {r['dap']} | "
                         f"{status} | {_fmt(r.get('first_pass_s'))} | "
                         f"{_fmt(r.get('warm_pass_s'))} | {_fmt(r.get('total_s'))} | "
                         f"{_fmt(r.get('whole_prediction_estimate_s'))} | {peak} | {anchor} |")
        else:
            lines.append(f"| AF3 | {r['n_token']} tokens, {r['samples']} samples x "
                         f"{r['sampler_steps']} steps, {r['cycles']} cycles | {r['dap']} | "
                         f"{status} | {_fmt((r.get('trunk_cycle_s') or [None])[0])} | | "
                         f"{_fmt(r.get('total_s'))} | | {peak} | |")
    lines += ["", "FastFold anchor (Cheng et al., Table 5): AF2 inference latency with DAP and "
              "AutoChunk on A100s: 3072 residues 238.5 s on 4 GPUs, 201.9 s on 8; 4096 residues "
              "out of memory on 4, 548.0 s on 8 (AlphaFold and OpenFold: out of memory on one "
              "GPU from 3072). Their MSA depths are not stated; here 128 clusters + 4 template "
              "rows, 1024 extra sequences (`af2_initial`).", ""]
    remaining = sorted({1, 2, 4, 8} - {r["dap"] for r in result["rows"]})
    if remaining:
        lines += [f"Not run yet: DAP {', '.join(map(str, remaining))} (needs that many GPUs of "
                  "one host: `torchrun --nproc-per-node N -m benchmarks.parallel.predict_dap "
                  "...`, then `--merge`).", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parallel.predict_dap",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n-res", type=int, nargs="*", default=[3072, 4096], help="AF2 chain lengths")
    p.add_argument("--af3-tokens", type=int, nargs="*", default=[],
                   help="AF3 protein lengths (tokens); none by default")
    p.add_argument("--recycles", type=int, nargs="+", default=[2],
                   help="AF2 passes to run, one value per --n-res (the last repeats); the first "
                        "pass is cold (default 2)")
    p.add_argument("--af3-cycles", type=int, default=1, help="AF3 trunk cycles (default 1)")
    p.add_argument("--chunk-size", type=int, default=64, help="AF2 chunk size per rank")
    p.add_argument("--templates", type=int,
                   help="AF2 template slots (default: the preset's, 4; no hits, so masked, "
                        "but the template pair stack runs on them as in a prediction)")
    p.add_argument("--msa-rows", type=int, default=1152,
                   help="rows of the a3m (128 clusters + 1024 extra sequences)")
    p.add_argument("--samples", type=int, default=5, help="AF3 diffusion samples")
    p.add_argument("--sampler-steps", type=int, default=50, help="AF3 sampler steps")
    p.add_argument("--budget-s", type=float, help="skip sizes projected to pass this wall time")
    p.add_argument("--device", help="cpu or cuda (default: the rank's GPU when present)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke: tiny models and sizes")
    p.add_argument("--merge", nargs="*", metavar="JSON",
                   help="write one table of these runs' rows (no prediction)")
    p.add_argument("--out", help="the JSON result, Markdown beside it (default: "
                                 "benchmarks/results/parallel/predict_dap_<N>gpu.json)")
    args = p.parse_args(argv)
    if args.tiny and args.n_res == [3072, 4096]:
        args.n_res, args.msa_rows = [21, 27], 12
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        if args.out is None:
            raise SystemExit("--merge needs --out")
        rows, devices = merged_rows(args.merge)
        first = json.loads(Path(args.merge[0]).read_text())
        result = {**{k: first[k] for k in ("device", "torch", "triton", "date")},
                  "devices": sorted(devices), "rows": sorted(
                      rows, key=lambda r: (r["family"], r.get("n_res", r.get("n_token")),
                                           r["dap"]))}
        write_result(Path(args.out), result, to_markdown(result))
        return 0
    started_by_harness = dist.is_initialized()
    ctx, parallel = _context(args.device)
    start = time.perf_counter()
    deadline = start + args.budget_s if args.budget_s else None
    folder = _shared_folder(ctx)
    rows = bench_af3(args, ctx, parallel, folder) if args.af3_tokens else []
    if args.n_res:
        rows += bench_af2(args, ctx, parallel, folder, deadline)
    if ctx.rank == 0:
        result = {**versions(ctx.device), "world_size": ctx.world_size,
                  "wall_s": time.perf_counter() - start, "rows": rows}
        out = args.out or RESULTS / "parallel" / f"predict_dap_{ctx.world_size}gpu.json"
        write_result(Path(out), result, to_markdown(result))
        print(to_markdown(result))
    _everyone(None, ctx)
    if ctx.rank == 0:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    if not started_by_harness:
        from fold_train.distributed import teardown

        teardown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
