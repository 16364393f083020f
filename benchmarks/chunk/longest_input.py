"""The longest input ``fold-train predict --autochunk auto`` predicts on the GPU at hand (issue 23,
"Long inputs"), AF2 and AF3, with time and peak memory; and the dry run's estimated peak against
the measured one at a few real sizes (``--estimate``).

Each trial is one prediction through the product's CLI (``fold_train.cli.main(["predict",
...])``) in a subprocess of its own (``--trial``), so an out-of-memory error, a CUDA error or a
hang (``--trial-timeout``) ends that trial only; a trial that timed out is undecided (it may fit
and need more time) and ends the search without a failure. Inputs are written as a user gives them:

* AF2: a FASTA of N random residues (uniform over the 20 amino acids, seeded) and an a3m of
  ``--msa-depth`` rows mutated from it (30% substitutions, 5% gaps); the ``af2_finetune`` preset
  (AF2's 48-block Evoformer, 4-block extra MSA stack, 5120 extra / 512 clustered rows) with
  random weights, ``--autochunk auto``, ``--recycles 1`` (one pass; every pass needs the same
  memory), optionally ``--msa-offload`` (``--af2-flags``);
* AF3: an AlphaFold3 input JSON of one protein chain of N random residues with the same a3m as
  its ``unpairedMsa``; the ``af3`` preset (48-block Pairformer, 24-block diffusion transformer)
  with random weights, ``--autochunk auto --sample-group 1``, 5 samples, ``--recycles 1`` and
  ``--sampler-steps`` (default 20: every step needs the same memory, time scales linearly).

The search per family: a geometric ladder of lengths (``--af2-ladder``, ``--af3-ladder``) until
the first failure, then bisection between the last success and that failure to ``--resolution``
residues. A trial is not started when the time left (``--budget-seconds``, counted from the
start) is less than the last trial's time times 1.5 plus the start-up; the result says so.

Peak memory is ``torch.cuda.max_memory_allocated()`` over the whole CLI call (weights and
features included) and ``torch.cuda.mem_get_info`` total for the device. Times: the CLI call's
wall time (model load and featurisation included) and the predictor's part.

``--estimate``: for each size of ``--estimate-af2`` / ``--estimate-af3`` one subprocess runs
``predict --dry-run`` (the FakeTensor plan, :mod:`fold_train.predict_plan`; on a GPU machine on
FakeTensors of the GPU, so the kernels' memory is what is counted) and the
real prediction with the same (unchunked) settings and ``--no-cuda-graphs`` (the plan estimates
the eager predictor), and reports estimate / measured.

Measured times (benchmarks/results/chunk/longest_input.md, one H100 80GB / H200 141GB, start-up
included): AF2 `--autochunk auto` 2048 residues 85 s, 4096 180 s, 4608 268 s (H100); AF2
`--chunk-size 64` 6144 residues 549 s (H200); AF3 2048 / 3072 / 4096 tokens 162 / 252 / 389 s
(H100, before the structure checks' areas moved to the GPU). A trial's start-up is 20-40 s
(imports, CUDA, checkpoint load) plus AutoChunk's planning of each stack and the kernels'
autotuning at new shapes. Each family gets ``--budget-seconds`` (default 450 s: a trial is not
started when it would not finish), so run the families as separate calls, each under the device
tool's 10-minute limit; on an H200 raise ``--af2-ladder`` to ``6144,8192,10240`` to spend the
time where it is informative:

    source benchmarks/gpu_setup.sh
    python -m benchmarks.chunk.longest_input --families af2 --budget-seconds 450 \\
        --out benchmarks/results/chunk/longest_input_af2_h100.json
    python -m benchmarks.chunk.longest_input --families af3 --budget-seconds 450 \\
        --out benchmarks/results/chunk/longest_input_af3_h100.json
    python -m benchmarks.chunk.longest_input --estimate --budget-seconds 450 \\
        --out benchmarks/results/chunk/estimate_vs_measured_h100.json
    python -m benchmarks.chunk.longest_input --device cpu --tiny --out /tmp/longest.json  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.common.machine import device_name, versions
from benchmarks.common.predict_inputs import a3m_text, random_checkpoint, random_sequence
from benchmarks.common.results import REPO, RESULTS, write_result

CCD = REPO / "data" / "demo" / "af3" / "ccd.cif"
PRESETS = {("af2", False): ("af2_finetune", []), ("af3", False): ("af3", []),
           ("af2", True): ("tiny", ["data.n_res=16", "data.n_clust=6", "data.n_extra=8"]),
           ("af3", True): ("af3_tiny", [])}


# -- inputs ---------------------------------------------------------------------------------------
def write_inputs(family: str, n: int, depth: int, folder: Path) -> list[str]:
    """The input files of an ``n``-residue query and the CLI arguments that name them."""
    query = random_sequence(n)
    msa = a3m_text(query, depth)
    if family == "af2":
        (folder / "query.fasta").write_text(f">query\n{query}\n")
        (folder / "query.a3m").write_text(msa)
        return ["--fasta", str(folder / "query.fasta"), "--msa", str(folder / "query.a3m")]
    doc = {"name": f"random_{n}", "modelSeeds": [0], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": query, "unpairedMsa": msa,
                                      "pairedMsa": "", "templates": []}}]}
    (folder / "query.json").write_text(json.dumps(doc))
    return ["--json", str(folder / "query.json"), "--ccd", str(CCD)]


def write_checkpoint(family: str, tiny: bool, path: Path) -> Path:
    """A fold-train checkpoint of the family's preset with random (seeded) weights."""
    name, overrides = PRESETS[(family, tiny)]
    return random_checkpoint(name, overrides, path)


# -- one trial (a subprocess) ---------------------------------------------------------------------
def run_trial(args) -> dict:
    """One ``fold-train predict`` (or ``--dry-run`` then predict, for ``--estimate``) in this
    process, its files in a temporary folder removed after; returns the trial's record
    (printed as the last line by ``--trial``)."""
    with tempfile.TemporaryDirectory(prefix=f"longest_{args.trial}_{args.n}_") as tmp:
        return _run_trial(args, Path(tmp))


def _run_trial(args, folder: Path) -> dict:
    import torch
    from fold_train.allocator import prefer_expandable_segments
    from fold_train.cli import main as cli

    # the CLI sets its allocator before CUDA starts; this process starts CUDA first (to measure)
    prefer_expandable_segments()

    device = args.device
    inputs = write_inputs(args.trial, args.n, args.msa_depth, folder)
    base = ["predict", "--checkpoint", args.checkpoint, *inputs, "--device", device,
            "--out", str(folder / "out.cif"), "--recycles", "1"]
    if args.trial == "af3":
        base += ["--samples", str(args.samples), "--sampler-steps", str(args.sampler_steps)]
    record: dict = {"family": args.trial, "n_res": args.n, "msa_depth": args.msa_depth}
    cuda = device.startswith("cuda")
    if args.estimate_trial:  # the dry run's estimate, then the measured eager prediction
        flags = ["--no-cuda-graphs"]
        total = torch.cuda.mem_get_info()[1] if cuda else 10**12
        out, err, rc = _cli(cli, [*base, *flags, "--dry-run", "--memory-limit", str(total)])
        if rc != 0:
            return {**record, "ok": False, "error": err[-2000:]}
        plan = json.loads(out.strip().splitlines()[-1])
        record.update(estimated_peak_bytes=plan["peak_bytes"],
                      estimated_stages={k: v["bytes"] for k, v in plan["stages"].items()},
                      weights_bytes=plan["weights_bytes"], features_bytes=plan["features_bytes"])
        run_flags = flags
    else:
        chunking = (["--autochunk", "auto"] if args.chunking == "auto"
                    else ["--chunk-size", str(int(args.chunking))])
        run_flags = chunking + (["--sample-group", "1"] if args.trial == "af3"
                                else []) + args.extra_flags.split()
    record["flags"] = run_flags
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        out, err, rc = _cli(cli, [*base, *run_flags])
    except torch.cuda.OutOfMemoryError as e:  # not caught by the CLI: a real OOM
        return {**record, "ok": False, "error": f"OOM: {str(e)[:300]}",
                "wall_s": time.perf_counter() - t0}
    record["wall_s"] = time.perf_counter() - t0
    if cuda:
        record["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        record["device_total_bytes"] = int(torch.cuda.mem_get_info()[1])
    if rc != 0:
        return {**record, "ok": False, "error": err[-2000:]}
    summary = json.loads(out.strip().splitlines()[-1])
    record.update(ok=True, mean_plddt=summary.get("mean_plddt"), seconds=summary.get("seconds"),
                  autochunk=summary.get("autochunk") or summary.get("chunking", {}).get(
                      "autochunk"))
    if args.estimate_trial and "peak_bytes" in record:
        record["estimate_over_measured"] = record["estimated_peak_bytes"] / record["peak_bytes"]
    return record


def _cli(cli, argv: list[str]) -> tuple[str, str, int]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(argv)
    return out.getvalue(), err.getvalue(), rc


def trial(args, family: str, n: int, checkpoint: Path, *, estimate: bool = False,
          timeout: float | None = None) -> dict:
    """Run one trial in a subprocess; a crash is a failed trial (``ok`` False), a timeout
    (``timeout``, default ``--trial-timeout``) an undecided one (``ok`` None: the length may fit
    the memory and need more time than the call had)."""
    cmd = [sys.executable, "-m", "benchmarks.chunk.longest_input", "--trial", family,
           "--n", str(n), "--checkpoint", str(checkpoint), "--device", args.device,
           "--msa-depth", str(args.msa_depth), "--samples", str(args.samples),
           "--sampler-steps", str(args.sampler_steps), "--chunking", args.chunking,
           "--extra-flags", args.af2_flags if family == "af2" else ""]
    if estimate:
        cmd.append("--estimate-trial")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                              timeout=timeout or args.trial_timeout)
    except subprocess.TimeoutExpired:
        limit = timeout or args.trial_timeout
        return {"family": family, "n_res": n, "ok": None,
                "error": f"timeout: no result within {limit:.0f} s (undecided, not a failure)",
                "trial_s": time.perf_counter() - t0}
    elapsed = time.perf_counter() - t0
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-1500:]
        error = "OOM" if "out of memory" in tail.lower() else f"exit {proc.returncode}: {tail}"
        return {"family": family, "n_res": n, "ok": False, "error": error, "trial_s": elapsed}
    return {**json.loads(lines[-1]), "trial_s": elapsed}


# -- the search -----------------------------------------------------------------------------------
STARTUP_S = 30.0  # imports, CUDA, checkpoint load: the part of a trial that N does not change


def predicted_seconds(n: int, n_last: int, seconds_last: float) -> float:
    """A trial's time at ``n`` from the last successful one: the start-up, plus the rest scaled
    by ``(n / n_last)^2``. Measured on an H100 (AF2 ``--autochunk auto``, af2_finetune) 2048 ->
    4096 residues went 85 s -> 180 s: the MSA stacks' ``N_extra x N^2`` work dominates there,
    not the triangle updates' ``N^3`` (the cube predicted 680 s and refused trials that fit)."""
    work = max(seconds_last - STARTUP_S, 0.0)
    return STARTUP_S + work * (n / n_last) ** 2


def longest(args, family: str, checkpoint: Path, ladder: list[int], deadline: float,
            emit, fam: dict, known_ok: int = 0) -> dict:
    """Ladder up to the first failure, then bisection to ``--resolution`` (from ``known_ok``,
    a length an earlier run predicted, else from 0). A trial is not started when its predicted
    time would pass ``deadline`` (:func:`predicted_seconds`); a started one is stopped there."""
    trials: list[dict] = fam.setdefault("trials", [])  # filled as they finish (saved by emit)
    good, bad = known_ok, None
    last: tuple[int, float] | None = None  # (N, seconds) of the last successful trial

    def attempt(n: int) -> bool | None:
        nonlocal last
        left = deadline - time.perf_counter()
        predicted = 0.0 if last is None else predicted_seconds(n, *last)
        if left < 30 or predicted > left:
            trials.append({"family": family, "n_res": n, "ok": None,
                           "error": f"not run: {left:.0f} s left, about {predicted:.0f} s "
                                    "predicted"})
            emit(trials[-1])
            return None
        rec = trial(args, family, n, checkpoint, timeout=min(args.trial_timeout, left))
        if rec["ok"]:
            last = (n, rec.get("trial_s", 0.0))
        trials.append(rec)
        emit(rec)
        return None if rec["ok"] is None else bool(rec["ok"])  # None: timed out, stop

    for n in (n for n in ladder if n > known_ok):
        ok = attempt(n)
        if ok is None:
            break
        if not ok:
            bad = n
            break
        good = n
    while bad is not None and bad - good > args.resolution:
        mid = (good + bad) // 2
        ok = attempt(mid)
        if ok is None:
            break
        good, bad = (mid, bad) if ok else (good, mid)
    best = max((t for t in trials if t.get("ok")), key=lambda t: t["n_res"], default=None)
    fam.update(longest_ok=good or None, first_failure=bad, best=best)
    return fam


def to_markdown(result: dict) -> str:
    head = (f"# Longest input of `fold-train predict` ({result['device']})\n\n"
            f"{result['date']}; torch {result['versions'].get('torch')}; MSA depth "
            f"{result['msa_depth']}; {result['mode']}\n\n")
    lines = [head]
    if result["mode"] == "longest":
        lines += ["| family | longest that ran | first failure | wall s | peak GiB | flags |",
                  "|---|---|---|---|---|---|"]
        for fam in result["families"]:
            b = fam["best"] or {}
            peak = b.get("peak_bytes")
            lines.append(f"| {fam['family']} | {fam['longest_ok']} | {fam['first_failure']} | "
                         f"{b.get('wall_s', float('nan')):.1f} | "
                         f"{'-' if peak is None else f'{peak / 2**30:.1f}'} | "
                         f"{' '.join(b.get('flags', []))} |")
        lines += ["", "| family | N | ok | wall s | peak GiB | error |",
                  "|---|---|---|---|---|---|"]
        for fam in result["families"]:
            for t in fam["trials"]:
                peak = t.get("peak_bytes")
                lines.append(f"| {t['family']} | {t['n_res']} | {t.get('ok')} | "
                             f"{t.get('wall_s', float('nan')):.1f} | "
                             f"{'-' if peak is None else f'{peak / 2**30:.2f}'} | "
                             f"{str(t.get('error', ''))[:80]} |")
    else:
        lines += ["| family | N | estimated GiB | measured GiB | estimate / measured |",
                  "|---|---|---|---|---|"]
        for t in result["estimates"]:
            est, meas = t.get("estimated_peak_bytes"), t.get("peak_bytes")
            ratio = t.get("estimate_over_measured")
            lines.append(f"| {t['family']} | {t['n_res']} | "
                         f"{'-' if est is None else f'{est / 2**30:.2f}'} | "
                         f"{'-' if meas is None else f'{meas / 2**30:.2f}'} | "
                         f"{'-' if ratio is None else f'{ratio:.3f}'} |")
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--families", default="af2,af3")
    p.add_argument("--tiny", action="store_true", help="CPU smoke: tiny presets and sizes")
    p.add_argument("--msa-depth", type=int, default=128)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--sampler-steps", type=int, default=20)
    p.add_argument("--af2-ladder", type=_ints, default=[4096, 6144, 8192, 10240])
    p.add_argument("--af3-ladder", type=_ints, default=[1024, 2048, 3072, 4096])
    p.add_argument("--af2-flags", default="", help="extra predict flags for AF2 (--msa-offload)")
    p.add_argument("--chunking", default="auto",
                   help="'auto' (predict --autochunk auto) or a row chunk (predict --chunk-size N)")
    p.add_argument("--resolution", type=int, default=256)
    p.add_argument("--known-ok", type=int, default=0,
                   help="a length an earlier run predicted: the bisection's lower end")
    p.add_argument("--budget-seconds", type=float, default=450.0)
    p.add_argument("--trial-timeout", type=float, default=300.0)
    p.add_argument("--estimate", action="store_true",
                   help="dry-run estimate vs measured peak at --estimate-af2/--estimate-af3")
    p.add_argument("--estimate-af2", type=_ints, default=[256, 512, 1024])
    p.add_argument("--estimate-af3", type=_ints, default=[256, 512])
    p.add_argument("--out", type=Path, default=RESULTS / "chunk" / "longest_input.json")
    # a trial (internal: the subprocess)
    p.add_argument("--trial", choices=["af2", "af3"], help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--extra-flags", default="", help=argparse.SUPPRESS)
    p.add_argument("--estimate-trial", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trial:
        print(json.dumps(run_trial(args)), flush=True)
        return 0

    import torch

    start = time.perf_counter()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if args.tiny:
        args.af2_ladder, args.af3_ladder = [8, 16], [8, 16]
        args.estimate_af2, args.estimate_af3 = [12], [10]
        args.resolution, args.msa_depth, args.samples, args.sampler_steps = 4, 4, 2, 2
    result = {"device": device_name(args.device), "versions": versions(torch.device(args.device)),
              "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "msa_depth": args.msa_depth, "mode": "estimate" if args.estimate else "longest",
              "settings": {k: v for k, v in vars(args).items()
                           if k not in ("trial", "n", "checkpoint", "out", "estimate_trial")
                           and not isinstance(v, Path)},
              "families": [], "estimates": []}

    def save() -> None:
        write_result(args.out, result, to_markdown(result), indent=2)

    def emit(rec: dict) -> None:
        print(json.dumps(rec)[:400], flush=True)
        save()  # whatever finished survives a kill

    with tempfile.TemporaryDirectory(prefix="longest_ckpt_") as tmp:
        for family in families:
            ckpt = write_checkpoint(family, args.tiny, Path(tmp) / f"{family}.ckpt")
            if args.estimate:
                for n in (args.estimate_af2 if family == "af2" else args.estimate_af3):
                    if time.perf_counter() - start > args.budget_seconds:
                        result["estimates"].append({"family": family, "n_res": n,
                                                    "ok": None, "error": "not run: budget"})
                        continue
                    rec = trial(args, family, n, ckpt, estimate=True, timeout=max(
                        30.0, args.budget_seconds - (time.perf_counter() - start)))
                    result["estimates"].append(rec)
                    emit(rec)
                continue
            share = (args.budget_seconds - (time.perf_counter() - start)) / max(
                1, len(families) - families.index(family))
            ladder = args.af2_ladder if family == "af2" else args.af3_ladder
            fam = {"family": family, "longest_ok": None, "first_failure": None, "best": None,
                   "trials": []}
            result["families"].append(fam)
            longest(args, family, ckpt, ladder, time.perf_counter() + share, emit, fam,
                    known_ok=args.known_ok)
            save()
    save()
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
