"""The AF3 training iteration as users run it, on real data with alignments: ``fold-train train
--preset af3`` (384-token crops, 1024 MSA rows, 4 template slots, weighted chain / interface
sampling, the loader, the Trainer) eager and with CUDA graphs, in one process on one GPU.

Where ``benchmarks/train/af3.py`` times the Trainer on a synthesized batch, this one runs the
product end to end on a real AF3 cache (fold-data's featurisation: tokens, CCD conformers, real
MSAs and templates), built beforehand on a CPU machine (gemmi, RDKit and biotite are needed to
build it, only numpy to train from it: the GPU image has none of the three)::

    python -m benchmarks.train.af3_msa --prepare .fold_cache/af3_msa         # CPU, ~1 minute
    python -m benchmarks.train.af3_msa --cache .fold_cache/af3_msa --out $OUT/train_af3_msa.json
    python -m benchmarks.train.af3_msa --device cpu --tiny --out /tmp/af3_msa.json  # smoke

The training directory (assembled from the bundled demo, ``data/demo``, by ``--prepare``):

* 3U8V, SmbP homodimer with a nickel ion (187 tokens): 1350 real MSA rows (UniRef90, BFD,
  MGnify; the homomer's chains share one alignment), so every sample has 1024 real rows; its
  template hits name structures not bundled: no template;
* 4ZEY, NRBF2 MIT domain (84 tokens; its two sulfates are crystallization aids, which AF3's
  training filters remove): 850 real MSA rows and one real
  template (2CRB, released before it).

Both are smaller than the crop, so a sample is the whole complex padded to the preset's sizes
(384 tokens, 4608 atoms, 1024 MSA rows, 4 templates); every stack runs on the padded shapes
(masks, no data-dependent skipping), so a step costs what a 384-token crop of a larger complex
costs. Rows (the same command but for ``cuda_graphs``):

==========  ==================================================================================
eager       ``fold-train train --preset af3 --cache DIR`` (bf16 autocast, fused kernels where
            supported, flat buffers + fused Adam, the preset's checkpointing, GC off)
graphed     ``... cuda_graphs=true``: forward + losses + backward replayed from one CUDA graph
            per N_cycle (captured the first time each N_cycle is drawn)
==========  ==================================================================================

N_cycle is drawn from 1..4 each step, as in training. Reported per row: the median step time
per N_cycle over the steps after the first one of that N_cycle (the first includes kernel
autotuning and, graphed, the capture), the mean over those steady steps (the expected step time
of training), data wait time, peak allocated memory, the losses (finite); graphed / eager per
N_cycle and for the mean. JSON and Markdown (``write_result``) after each row.

One H100, default 12 steps per row: about 5 minutes (a cold fold-kernels tuning cache adds up
to 3 minutes to the first row's first step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.cli import device_arg, rows_arg
from benchmarks.common.machine import versions
from benchmarks.common.results import write_result

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "demo"
ENTRIES = {"3u8v": "3u8v_A", "4zey": "4zey_A"}  # entry -> its alignment folder in the demo
ROWS = {"eager": [], "graphed": ["cuda_graphs=true"]}
# the tiny CPU smoke run: af3_tiny's model and sample sizes
TINY = ["data.n_token=48", "data.n_atom=384", "data.n_msa=32", "data.n_templ=4",
        "data.sampling=weighted", "data.max_release_date=2021-09-30"]


def prepare(cache_dir: Path, log=print) -> list[tuple[str, str]]:
    """Build the AF3 cache of the training directory (module docstring) into ``cache_dir``
    (fold-train's layout: ``<cache_dir>/af3``). Needs gemmi, RDKit and biotite."""
    from fold_train.af3_data import open_af3_cache

    with tempfile.TemporaryDirectory(prefix="af3_msa_data_") as tmp:
        data = Path(tmp)
        (data / "mmcifs").mkdir()
        (data / "alignments").mkdir()
        for entry, folder in ENTRIES.items():
            (data / "mmcifs" / f"{entry}.cif").symlink_to(DEMO / "mmcifs" / f"{entry}.cif")
            (data / "alignments" / folder).symlink_to(DEMO / "alignments" / folder)
        (data / "template_mmcifs").symlink_to(DEMO / "template_mmcifs")
        entries = open_af3_cache(data, cache_dir, progress=True)
    report = json.loads((cache_dir / "af3" / "cache_report.json").read_text())
    for r in report["entries"]:
        log(f"{r['name']}: {r['msa_rows']} MSA rows, {r['templates']} templates")
    return entries


def _steady(records: list[dict]) -> dict[str, Any]:
    """Median step time per N_cycle without the first step of each N_cycle, and their mean."""
    seen: set[int] = set()
    per: dict[int, list[float]] = {}
    waits = []
    for r in records:
        n = int(r["n_cycle"])
        if n in seen:
            per.setdefault(n, []).append(r["step_time"])
            waits.append(r.get("data_time") or 0.0)
        seen.add(n)
    steady = [t for ts in per.values() for t in ts]
    return {"median_step_s_by_n_cycle": {n: statistics.median(ts) for n, ts in sorted(per.items())},
            "steady_steps": len(steady),
            "mean_step_s": statistics.fmean(steady) if steady else None,
            "mean_data_wait_s": statistics.fmean(waits) if waits else None}


def run_row(name: str, cache_dir: Path, device: torch.device, steps: int, tiny: bool,
            seed: int) -> dict[str, Any]:
    """One ``fold-train train`` run of ``steps`` steps; its records and summary."""
    from fold_train.cli import main as fold_train

    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory(prefix=f"af3_msa_{name}_") as run:
        args = ["train", "--preset", "af3_tiny" if tiny else "af3", "--cache", str(cache_dir),
                "--run-dir", run, "--device", str(device), "--no-progress", f"steps={steps}",
                f"checkpoint_every={steps}", "log_every=1", f"seed={seed}", *ROWS[name],
                *(TINY if tiny else [])]
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        error = None
        try:
            code = fold_train(args)
        except Exception as e:  # after the steps (e.g. the end-of-run plot): keep the steps
            code, error = None, f"{type(e).__name__}: {e}"[:500]
        metrics = Path(run) / "metrics.jsonl"
        records = ([json.loads(x) for x in metrics.read_text().splitlines()]
                   if metrics.is_file() else [])
        records = [r for r in records if "step_time" in r]
    if not records:
        raise RuntimeError(error or "fold-train train wrote no step")
    row: dict[str, Any] = {
        "row": name, "command": "fold-train " + " ".join("RUN" if a == run else a for a in args),
        **({"note": error} if error else {}),
        "exit_code": code, "steps": [{k: r.get(k) for k in ("step", "n_cycle", "step_time",
                                                           "data_time", "loss", "chains")}
                                     for r in records],
        **_steady(records),
        "peak_alloc_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "losses_finite": all(r["loss"] == r["loss"] and abs(r["loss"]) != float("inf")
                             for r in records),
    }
    return row


def to_markdown(result: dict) -> str:
    lines = ["# AF3 training through `fold-train train` on real data with alignments", "",
             f"Device: {result['device']}, PyTorch {result['torch']}, Triton {result['triton']}, "
             f"{result['date']}. Preset `{result['preset']}`; cache: {result['data']}. "
             f"{result['steps']} steps per row, N_cycle drawn from 1..4.", "",
             "Step time (s, median per N_cycle; includes the wait for data, shown apart):", "",
             "| row | N_cycle 1 | 2 | 3 | 4 | mean | data wait | steady steps | peak MiB | loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['row']} | error: {r['error']} ||||||||| ")
            continue
        by = r["median_step_s_by_n_cycle"]
        cells = [f"{by[n]:.3f}" if n in by else "-" for n in (1, 2, 3, 4)]
        mean = "-" if r["mean_step_s"] is None else f"{r['mean_step_s']:.3f}"
        peak = "-" if r["peak_alloc_mib"] is None else f"{r['peak_alloc_mib']:.0f}"
        wait = "-" if r["mean_data_wait_s"] is None else f"{r['mean_data_wait_s']:.3f}"
        lines.append(f"| {r['row']} | {' | '.join(cells)} | {mean} | {wait} | "
                     f"{r['steady_steps']} | {peak} | "
                     f"{'finite' if r['losses_finite'] else 'NOT finite'} |")
    if "graphed_speedup" in result:
        ratio = result["graphed_speedup"]
        lines += ["", "Eager / graphed step time: " + ", ".join(
            f"N_cycle {n}: {v:.2f}x" for n, v in ratio["by_n_cycle"].items())
            + (f"; mean: **{ratio['mean']:.2f}x**" if ratio.get("mean") else "") + "."]
    lines += ["", "Commands (RUN: a temporary run directory):", ""]
    lines += [f"- {r['row']}: `{r['command']}`" for r in result["rows"] if "command" in r]
    return "\n".join(lines) + "\n"


def _ratio(rows: dict[str, dict]) -> dict[str, Any] | None:
    e, g = rows.get("eager"), rows.get("graphed")
    if not e or not g or "error" in e or "error" in g:
        return None
    be, bg = e["median_step_s_by_n_cycle"], g["median_step_s_by_n_cycle"]
    out = {"by_n_cycle": {n: be[n] / bg[n] for n in be if n in bg}}
    if e["mean_step_s"] and g["mean_step_s"]:
        out["mean"] = e["mean_step_s"] / g["mean_step_s"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path, default=None,
                        help="build the AF3 cache here (CPU, gemmi/RDKit/biotite) and stop")
    parser.add_argument("--cache", type=Path, default=None, help="the cache --prepare built")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="af3_tiny on small samples (smoke)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per row")
    parser.add_argument("--rows", default="eager,graphed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON here, Markdown beside it")
    args = parser.parse_args(argv)
    if args.prepare is not None:
        prepare(args.prepare)
        return {}
    device = device_arg(args.device, "train_af3_msa")
    rows = rows_arg(args.rows, ROWS, "train_af3_msa")
    tmp = None
    cache = args.cache
    if cache is None:  # the smoke run builds its own (on a machine with the parsers)
        tmp = tempfile.TemporaryDirectory(prefix="af3_msa_cache_")
        cache = Path(tmp.name)
        prepare(cache)
    index = json.loads((cache / "af3" / "cache_report.json").read_text())
    result: dict[str, Any] = {
        **versions(device), "preset": "af3_tiny" if args.tiny else "af3", "steps": args.steps,
        "data": ", ".join(f"{r['name']} ({r['msa_rows']} MSA rows, {r['templates']} templates)"
                          for r in index["entries"]),
        "rows": []}
    done: dict[str, dict] = {}
    for name in rows:
        if name == "graphed" and device.type != "cuda":
            row = {"row": name, "error": "CUDA graphs need a CUDA device"}
        else:
            try:
                row = run_row(name, cache, device, args.steps, args.tiny, args.seed)
            except Exception as e:  # recorded: the other row still runs
                row = {"row": name, "error": f"{type(e).__name__}: {e}"[:500]}
        done[name] = row
        result["rows"].append(row)
        ratio = _ratio(done)
        if ratio:
            result["graphed_speedup"] = ratio
        if args.out is not None:
            write_result(args.out, result, to_markdown(result), indent=1)
    if tmp is not None:
        tmp.cleanup()
    print(to_markdown(result))
    return result


if __name__ == "__main__":
    main()
