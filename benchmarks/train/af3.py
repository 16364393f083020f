"""The full AlphaFold3 training iteration (issue 10's last benchmark): trunk with recycling, the
48-sample diffusion batch, the confidence head's mini-rollout, ``AlphaFold3.loss``, backward and
the optimizer step, eager against optimized in one process on one GPU; then the longest crop each
can train on that GPU.

Batch (``benchmarks/common/af3_batch.py``): fold-data's ``SAMPLE_FEATURES`` layout (names,
dtypes, shapes; the CPU smoke test validates it against ``fold_data.af3.schema``), synthesized
directly because fold-data's AF3 featurisation imports RDKit, which the GPU image lacks. Shapes
are the ``af3_initial`` data preset's (AF3 supplement Table 6, initial training): 384 tokens
padded to 4608 atoms (12 per token), 1024 MSA rows, 4 templates (all real), 48 diffusion
samples. Content: two protein chains, a DNA duplex, a 16-atom ligand (one-atom tokens bonded in
a chain), about 3100 real atoms and the rest padding; a random walk of residues as the ground
truth with ~3% unresolved atoms; MSA rows that mutate the query with gaps and deletions, profile
and deletion mean computed from them; templates are the ground truth with noise.

One iteration = ``model(batch, no_cycles=R)`` (R - 1 trunk passes without gradients, the last
with; R = ``--cycles``, default 4, the preset's maximum: training draws R from 1..4), the loss
(diffusion with smooth lDDT, distogram, confidence), backward, global-norm clipping at 10, Adam
(AF3 supplement 5.4: beta 0.9 / 0.95, eps 1e-8, lr 1.8e-3 schedule) and an EMA of the weights
(0.999). Every step reseeds the RNG the same way, so all rows train on the same noise and losses
are comparable. Rows, cumulative (each adds its switch to the rows above):

==========  ===========================================================================
eager       ops backend ``torch``, fp32 weights + bf16 autocast, the preset's activation
            checkpointing (every trunk sub-layer, every diffusion transformer block),
            ``torch.optim.Adam`` + ``clip_grad_norm_`` + an EMA loop over the parameters
kernels     ops backend ``auto``: fold-kernels' Triton EvoAttention, LayerNorm(+Linear),
            SwiGLU, gating and dropout-residual kernels where they support the call
flat_adam   ``FlatParams`` (parameters/gradients in flat buffers) + ``FlatAdam`` with the
            fused Adam + clipping + EMA kernel (``fold_train.optim``)
bf16        bf16 weights for the Pairformer, MSA module, template embedder and diffusion
            transformer (fp32 master in FlatAdam); embedders, atom encoder/decoder,
            conditioning and heads keep fp32 weights so that the single/pair streams and
            every coordinate stay fp32 (as the AF2 ablation keeps its structure module)
lean_ckpt   whole-block checkpointing: trunk blocks recomputed whole (one saved pair per
            block instead of one per sub-layer), diffusion atom transformer blocks too
ckpt_plan   checkpointing only where needed: the peak of a fully checkpointed step gives
            the headroom, the saved-activation bytes and recompute time of one Pairformer
            block and one diffusion transformer block (measured at this size) choose how
            many blocks run without recompute (halved and retried on out-of-memory)
gc_off      Python garbage collection off during steps
graphs      forward + losses + backward captured in one CUDA graph per N_cycle (fold-train's
            GraphedStep) and replayed; the loss's pair lists built before the step and padded;
            without ckpt_plan (see ROWS)
==========  ===========================================================================

"optimized" is the last row that ran. Reported per row: median step ms over ``--reps`` after
``--warmup`` steps, peak allocated / reserved memory, the loss (finite), speedup over eager and
over the previous row.

Longest trainable crop: for eager and for optimized (its memory-lean form: every switch but
``ckpt_plan`` and ``graphs``; ``--crop-only`` also offers ``eager_lean``, eager with the
optimized path's checkpointing), the largest N_token (N_atom = 12 N_token)
whose iteration (one trunk pass: the no-gradient passes free their activations, so R does not
change the peak) fits: doubling from ``--crop-start`` until one fails, then bisection to
``--crop-resolution`` (32) tokens; each probe after ``gc.collect`` + ``empty_cache`` + a peak reset,
``torch.cuda.OutOfMemoryError`` caught, fold-kernels' autotuning off (default configs: a probe
only asks whether the step fits). Every probe is recorded. Ratio optimized / eager.

Order, so that a short window keeps what matters: eager row, eager crop search, optimized row
(all switches), optimized crop search, then the intermediate rows while ``--budget-seconds``
lasts (a search stops early with its bracket when its share of the budget is spent). JSON and
Markdown are rewritten atomically after every row and probe.

    python -m benchmarks.train.af3 --out $OUT/train_af3.json --budget-seconds 500   # one H100
    python -m benchmarks.train.af3 --device cpu --tiny --out /tmp/train_af3.json      # smoke

Memory note (measured on CPU with saved-tensor hooks): ``AlphaFold3.loss``'s smooth lDDT is dense
over all atom pairs of every sample and saves about 7 fp32 tensors of ``S x A x A`` for backward,
26.6 GiB at 48 samples x 4608 atoms, growing with N_token squared; it, not the trunk, is likely to
set the longest crop of both paths (a sample-chunked, recomputed smooth lDDT would lift it).

Goals (issue 10): optimized at least 2x eager (MegaFold: 1.73x on an H200) and a crop at least
1.5x eager's (MegaFold: 1.35x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fold_train.config import preset as train_preset

from benchmarks.common.af3_batch import ATOMS_PER_TOKEN, make_batch
from benchmarks.common.af3_training import (
    FULL,
    ROWS,
    TINY,
    Switches,
    cumulative,
    free,
    make_trainer,
    overrides,
    sync,
    train_iteration,
)
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.cli import device_arg, rows_arg
from benchmarks.common.machine import versions
from benchmarks.common.results import write_result

GOALS = {"speedup": 2.0, "crop_ratio": 1.5}
MEGAFOLD = {"speedup": 1.73, "crop_ratio": 1.35}  # H200, MegaFold paper (shared/papers)


# -- one row -----------------------------------------------------------------------------------
def _mib(x: int | None) -> float | None:
    return None if x is None else x / 2**20


def time_row(sw: Switches, batch: dict, sizes: dict, device: torch.device, warmup: int,
             reps: int, tiny: bool) -> dict[str, Any]:
    """``warmup`` iterations (the first plans the checkpointing with ``ckpt_plan`` and captures
    the graphs with ``graphs``), then ``reps`` timed iterations at ``sizes['cycles']`` trunk
    passes, through a fresh Trainer."""
    cuda = device.type == "cuda"
    r = sizes["cycles"]
    with tempfile.TemporaryDirectory(prefix="train_af3_") as run_dir:
        trainer, notes = make_trainer(sw, tiny, device, run_dir, r)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(max(warmup, 1)):
            loss = train_iteration(trainer, batch, r, seed=0)
        sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            loss = train_iteration(trainer, batch, r, seed=i + 1)
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        row = {"step_ms": statistics.median(times), "times_ms": times, "loss": loss,
               "peak_alloc_mib": _mib(torch.cuda.max_memory_allocated(device)) if cuda
               else None,
               "reserved_mib": _mib(torch.cuda.max_memory_reserved(device)) if cuda else None,
               "overrides": overrides(sw, cuda, r),
               "params": sum(p.numel() for p in trainer.model.parameters())}
        if trainer.ckpt_plan is not None:
            row["ckpt_plan"] = trainer.ckpt_plan.to_dict()
            row["ckpt_plan"]["full_ckpt_peak_mib"] = row["ckpt_plan"]["base_mib"]
        if sw.graphs:
            row["graphs_captured"] = trainer.captured_graphs
    if not math.isfinite(loss):
        notes.append(f"non-finite loss {loss}")
    if notes:
        row["note"] = "; ".join(notes)
    return row



# -- longest trainable crop --------------------------------------------------------------------
def longest_crop(probe: Callable[[int], bool], start: int, resolution: int, cap: int,
                 out_of_time: Callable[[], bool]) -> dict[str, Any]:
    """Largest ``n`` (a multiple of ``resolution``) with ``probe(n)`` true: doubling from
    ``start`` until a probe fails (halving instead when ``start`` fails), then bisection down to
    ``resolution``. ``cap``: never probe above it. Stops early (``complete`` False) when
    ``out_of_time()``. Returns ``{"longest", "first_fail", "complete"}``."""
    lo, hi = None, None  # largest fit, smallest failure
    n = start
    while True:  # doubling (or halving) to a bracket
        if out_of_time():
            return {"longest": lo, "first_fail": hi, "complete": False}
        if probe(n):
            lo = n
            if hi is not None:
                break
            if n * 2 > cap:
                return {"longest": lo, "first_fail": None, "complete": True, "capped": True}
            n *= 2
        else:
            hi = n
            if lo is not None:
                break
            if n <= resolution:
                return {"longest": None, "first_fail": hi, "complete": True}
            n = max(resolution, n // 2 // resolution * resolution)
    while hi - lo > resolution:  # bisection on multiples of the resolution
        if out_of_time():
            return {"longest": lo, "first_fail": hi, "complete": False}
        mid = (lo + hi) // 2 // resolution * resolution
        if mid <= lo:
            mid = lo + resolution
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return {"longest": lo, "first_fail": hi, "complete": True}


def crop_switches(sw: Switches) -> Switches:
    """The memory-lean form of a row for the crop search: no checkpointing plan (the preset's
    checkpointing) and no CUDA graphs (a probe only asks whether the step fits)."""
    return dataclasses.replace(sw, ckpt_plan=False, graphs=False)


def crop_search(sw: Switches, tiny: bool, sizes: dict, device: torch.device, deadline: float,
                on_probe: Callable[[dict], None]) -> dict[str, Any]:
    """:func:`longest_crop` with real training iterations (one trunk pass) of a Trainer with
    switches ``sw`` as probes."""
    cuda = device.type == "cuda"
    probes: list[dict[str, Any]] = []
    run_dir = tempfile.TemporaryDirectory(prefix="train_af3_crop_")
    trainer, _ = make_trainer(sw, tiny, device, run_dir.name, sizes["cycles"])

    def probe(n: int) -> bool:
        free(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        entry: dict[str, Any] = {"n_token": n, "n_atom": ATOMS_PER_TOKEN * n}
        t0 = time.perf_counter()
        error = None
        try:
            batch = make_batch(n, sizes, device, seed=n)
            loss = train_iteration(trainer, batch, 1, seed=0)
            sync(device)
            entry["loss"] = loss
            fits = math.isfinite(loss)
            if not fits:
                error = f"non-finite loss {loss}"
        except torch.cuda.OutOfMemoryError:
            fits, error = False, "out of memory"
        except ValueError as e:  # the synthetic batch cannot be built at this size
            fits, error = False, str(e)
        batch = None
        trainer.flat.zero_grad()
        entry["fits"] = fits
        if error:
            entry["error"] = error
        entry["seconds"] = time.perf_counter() - t0
        if cuda:
            entry["peak_alloc_mib"] = _mib(torch.cuda.max_memory_allocated(device))
        probes.append(entry)
        free(device)
        on_probe(entry)
        return fits

    def out_of_time() -> bool:
        last = probes[-1]["seconds"] if probes else 0.0
        return time.perf_counter() + 2 * last > deadline

    # Probes only ask whether the step fits: fold-kernels' autotuning (every new size compiles
    # and times each candidate config, with its own allocations) is off for them.
    old = os.environ.get("FOLD_KERNELS_AUTOTUNE")
    os.environ["FOLD_KERNELS_AUTOTUNE"] = "0"
    try:
        result = longest_crop(probe, sizes["crop_start"], sizes["crop_resolution"],
                              sizes["max_tokens"], out_of_time)
    finally:
        if old is None:
            os.environ.pop("FOLD_KERNELS_AUTOTUNE", None)
        else:
            os.environ["FOLD_KERNELS_AUTOTUNE"] = old
    result["probes"] = probes
    trainer.model = trainer.opt = trainer.flat = None  # released before the next search
    run_dir.cleanup()
    return result


# -- output ------------------------------------------------------------------------------------




def summarize(result: dict) -> dict:
    """Speed ratio optimized / eager and crop ratio, against the goals and MegaFold."""
    rows = {r["row"]: r for r in result["rows"] if "step_ms" in r}
    order = [k for k, _, _ in ROWS if k in rows]
    s: dict[str, Any] = {"goal_speedup": GOALS["speedup"], "megafold_speedup":
                         MEGAFOLD["speedup"], "goal_crop_ratio": GOALS["crop_ratio"],
                         "megafold_crop_ratio": MEGAFOLD["crop_ratio"]}
    if "eager" in rows and result.get("optimized_row") in rows:
        opt = rows[result["optimized_row"]]
        s["speedup"] = rows["eager"]["step_ms"] / opt["step_ms"]
        s["speedup_goal_met"] = s["speedup"] >= GOALS["speedup"]
    s["rows_ran"] = order
    crop = result.get("crop", {})
    e, o = crop.get("eager", {}), crop.get("optimized", {})
    if e.get("longest") and o.get("longest"):
        s["crop_ratio"] = o["longest"] / e["longest"]
        s["crop_ratio_is_bound"] = not (e.get("complete") and o.get("complete"))
        s["crop_goal_met"] = s["crop_ratio"] >= GOALS["crop_ratio"]
    return s


def to_markdown(result: dict) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    sz = result["sizes"]
    lines = [
        "# AF3 training iteration: eager vs optimized",
        "",
        f"Device: {result['device']}, PyTorch {result['torch']}, Triton {result['triton']}, "
        f"{result['date']}. Preset `{result['preset']}`, N_token {sz['n_token']}, N_atom "
        f"{sz['n_token'] * ATOMS_PER_TOKEN}, N_msa {sz['n_msa']}, {sz['n_templ']} templates, "
        f"{result['samples']} diffusion samples, N_cycle {sz['cycles']} (timed), median of "
        f"{result['reps']} iterations after {result['warmup']} warm-up; batch: "
        f"{result['batch']}. Each row adds its switch to the rows above.",
        "",
        "| row | step ms | speedup vs eager | vs previous | peak alloc MiB | reserved MiB | loss "
        "| note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result["rows"]:
        note = e.get("skipped") or e.get("error") or e.get("note") or ""
        plan = e.get("ckpt_plan")
        if plan:
            note = (note + f" no recompute: {plan.get('no_ckpt_pairformer', 0)} Pairformer, "
                    f"{plan.get('no_ckpt_diffusion', 0)} diffusion blocks (headroom "
                    f"{plan['headroom_mib']:.0f} MiB)").strip()
        lines.append(
            f"| {e['label']} | {num(e.get('step_ms'), '.1f')} | "
            f"{num(e.get('speedup_vs_eager'), '.2f')} | "
            f"{num(e.get('speedup_vs_previous'), '.2f')} | "
            f"{num(e.get('peak_alloc_mib'), '.0f')} | {num(e.get('reserved_mib'), '.0f')} | "
            f"{num(e.get('loss'), '.4f')} | {note.replace('|', '/')} |")
    lines += ["", "## Longest trainable crop (N_atom = 12 N_token, one trunk pass)", "",
              "| path | longest N_token | first failing | complete | probes (N_token: fit?) |",
              "|---|---|---|---|---|"]
    for name, c in result.get("crop", {}).items():
        probes = ", ".join(f"{p['n_token']}:{'y' if p['fits'] else 'n'}" for p in c["probes"])
        done = ("capped at --max-tokens" if c.get("capped") else
                "yes" if c.get("complete") else "no (budget)")
        lines.append(f"| {name} | {num(c.get('longest'), 'd')} | {num(c.get('first_fail'), 'd')}"
                     f" | {done} | {probes} |")
    s = result.get("summary", {})
    lines += ["", "## Against the goals", ""]
    if "speedup" in s:
        lines.append(f"- Speed, optimized ({result['optimized_row']}) / eager: "
                     f"**{s['speedup']:.2f}x**; goal {GOALS['speedup']}x: "
                     f"{'met' if s['speedup_goal_met'] else 'not met'}; MegaFold "
                     f"{MEGAFOLD['speedup']}x (H200).")
    else:
        lines.append("- Speed ratio: not measured (a row is missing).")
    if "crop_ratio" in s:
        bound = " (a bound: a search stopped early)" if s["crop_ratio_is_bound"] else ""
        lines.append(f"- Longest crop, optimized / eager: **{s['crop_ratio']:.2f}x**{bound}; "
                     f"goal {GOALS['crop_ratio']}x: {'met' if s['crop_goal_met'] else 'not met'}"
                     f"; MegaFold {MEGAFOLD['crop_ratio']}x.")
    else:
        lines.append("- Crop ratio: not measured (a search found no fitting size or did not run).")
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------------
def run(device: torch.device, tiny: bool, reps: int, warmup: int, rows: list[str],
        budget_s: float, sizes: dict, out: Path | None, crop: bool = True,
        log: Callable[[str], None] = print) -> dict:
    t_start = time.perf_counter()
    if device.type == "cuda":
        ensure_kernels(device)
    preset = "tiny" if tiny else "af3"
    train_cfg = train_preset("af3_tiny" if tiny else "af3")
    cfg = train_cfg.model_config()
    batch = make_batch(sizes["n_token"], sizes, device)
    result: dict[str, Any] = {
        **versions(device), "preset": preset, "sizes": sizes, "reps": reps, "warmup": warmup,
        "samples": cfg.diffusion.no_samples, "params": None, "path": "fold_train.loop.Trainer",
        "adam": dataclasses.asdict(train_cfg.optim), "budget_s": budget_s,
        "batch": "synthetic SAMPLE_FEATURES (fold-data schema), 4 templates"
                 if sizes["n_templ"] == 4 else f"synthetic, {sizes['n_templ']} templates",
        "rows": [], "crop": {}, "optimized_row": None,
    }
    result["batch"] += ", schema-checked" if _schema_check(batch, sizes) else ""

    def save() -> None:
        result["summary"] = summarize(result)
        if out is not None:
            write_result(out, result, to_markdown(result), indent=2)

    switches = cumulative(rows)
    labels = {k: label for k, label, _ in ROWS}
    opt_key = [k for k in switches if k != "eager"][-1] if len(switches) > 1 else None
    entries: dict[str, dict] = {}

    def do_row(key: str, search_until: float | None) -> None:
        sw = switches[key]
        entry: dict[str, Any] = {"row": key, "label": labels[key],
                                 "switches": dataclasses.asdict(sw)}
        t0 = time.perf_counter()
        try:
            entry.update(time_row(sw, batch, sizes, device, warmup, reps, tiny))
            result["params"] = entry.pop("params")
        except torch.cuda.OutOfMemoryError:
            entry["error"] = "out of memory"
        except Exception as e:  # a failing row is reported; the others go on
            entry["error"] = f"{type(e).__name__}: {e}"[:500]
        entry["row_s"] = time.perf_counter() - t0
        entries[key] = entry
        _order_rows()
        save()
        log(json.dumps({k: v for k, v in entry.items() if k not in ("switches", "times_ms")}))
        usable = "step_ms" in entry or entry.get("error") == "out of memory"
        free(device)
        if search_until is not None and crop and usable:
            name = "eager" if key == "eager" else "optimized"
            try:
                res = crop_search(crop_switches(sw), tiny, sizes, device, search_until,
                                  lambda p: (log(json.dumps({"probe": name, **p})), save()))
            except Exception as e:
                res = {"longest": None, "error": f"{type(e).__name__}: {e}"[:500], "probes": []}
            res["switches"] = dataclasses.asdict(crop_switches(sw))
            result["crop"][name] = res  # replaces the partial record that on_probe keeps
            save()
        free(device)

    def _order_rows() -> None:
        prev, base_ms = None, None
        ordered = []
        for k, _, _ in ROWS:
            if k not in entries:
                continue
            e = entries[k]
            if "step_ms" in e:
                if k == "eager":
                    base_ms = e["step_ms"]
                e["speedup_vs_eager"] = base_ms / e["step_ms"] if base_ms else None
                e["speedup_vs_previous"] = prev / e["step_ms"] if prev else None
                prev = e["step_ms"]
            ordered.append(e)
        result["rows"] = ordered
        ran = [k for k in switches if k != "eager" and "step_ms" in entries.get(k, {})]
        result["optimized_row"] = opt_key if opt_key in ran else (ran[-1] if ran else None)

    def at(frac: float) -> float:
        return t_start + frac * budget_s

    if "eager" in switches:
        do_row("eager", at(0.42))
        longest = result["crop"].get("eager", {}).get("longest")
        if entries["eager"].get("error") == "out of memory" and longest:
            # Eager cannot train the preset's crop on this GPU: time every row at the longest
            # crop eager fits instead (the crop search above found it), and say so.
            result["timed_n_token_requested"] = sizes["n_token"]
            sizes["n_token"] = longest
            batch = make_batch(longest, sizes, device)
            entries.pop("eager")
            do_row("eager", None)
            entries["eager"]["note"] = "; ".join(
                filter(None, [entries["eager"].get("note"),
                              f"all rows timed at N_token {longest}: eager ran out of memory at "
                              f"{result['timed_n_token_requested']}"]))
    if opt_key is not None and crop:
        do_row(opt_key, at(0.82))  # early: its crop search needs the budget
    for key in switches:
        if key in entries:
            continue
        spent = [e["row_s"] for e in entries.values() if "row_s" in e]  # skipped: none
        need = max(spent) if spent else 0.0
        if time.perf_counter() + need > t_start + budget_s:
            entries[key] = {"row": key, "label": labels[key],
                            "switches": dataclasses.asdict(switches[key]),
                            "skipped": "out of --budget-seconds"}
            _order_rows()
            save()
            continue
        do_row(key, None)
    _order_rows()
    save()
    result["total_s"] = time.perf_counter() - t_start
    save()
    return result


CROP_PATHS = {  # the configurations a --crop-only run can search
    "eager": Switches(),
    "eager_lean": Switches(lean_ckpt=True),  # eager with the optimized path's checkpointing
    # every switch but ckpt_plan (no recompute where memory allows) and graphs (a probe asks
    # whether one step fits, not how fast it is)
    "optimized": Switches(backend="auto", flat_adam=True, bf16_params=True, lean_ckpt=True,
                          gc_off=True),
}


def run_crops(device: torch.device, tiny: bool, paths: list[str], budget_s: float,
              sizes: dict, out: Path | None, log: Callable[[str], None] = print) -> dict:
    """Only the longest-crop searches, of ``paths`` (keys of :data:`CROP_PATHS`), the budget
    split evenly."""
    t_start = time.perf_counter()
    if device.type == "cuda":
        ensure_kernels(device)
    preset = "tiny" if tiny else "af3"
    result: dict[str, Any] = {**versions(device), "preset": preset, "sizes": sizes,
                              "budget_s": budget_s, "crop": {}}

    def save() -> None:
        e, o = result["crop"].get("eager", {}), result["crop"].get("optimized", {})
        if e.get("longest") and o.get("longest"):
            result["crop_ratio"] = o["longest"] / e["longest"]
        if out is not None:
            write_result(out, result, crop_markdown(result), indent=2)

    for i, name in enumerate(paths):
        deadline = t_start + budget_s * (i + 1) / len(paths)
        try:
            res = crop_search(CROP_PATHS[name], tiny, sizes, device, deadline,
                              lambda p, name=name: log(json.dumps({"probe": name, **p})))
        except Exception as e:
            res = {"longest": None, "error": f"{type(e).__name__}: {e}"[:500], "probes": []}
        res["switches"] = dataclasses.asdict(CROP_PATHS[name])
        result["crop"][name] = res
        save()
        free(device)
    result["total_s"] = time.perf_counter() - t_start
    save()
    return result


def crop_markdown(result: dict) -> str:
    lines = ["# AF3: the longest trainable crop on one GPU", "",
             f"Device: {result['device']}, PyTorch {result['torch']}, Triton {result['triton']}, "
             f"{result['date']}. Preset `{result['preset']}`, N_atom = 12 N_token, one trunk "
             "pass, 48 diffusion samples; a probe is one training iteration (forward, losses, "
             "backward, optimizer step) after freeing the cache.", "",
             "| path | switches | longest N_token | first failing | complete | probes "
             "(N_token: fit?) |", "|---|---|---|---|---|---|"]
    for name, c in result["crop"].items():
        sw = ", ".join(k for k, v in c.get("switches", {}).items()
                       if v and k != "backend") or "-"
        sw = f"backend {c.get('switches', {}).get('backend', '?')}; {sw}"
        probes = ", ".join(f"{p['n_token']}:{'y' if p['fits'] else 'n'}" for p in c["probes"])
        done = ("capped at --max-tokens" if c.get("capped") else
                "yes" if c.get("complete") else "no (budget)")
        longest = "-" if c.get("longest") is None else c["longest"]
        first = "-" if c.get("first_fail") is None else c["first_fail"]
        lines.append(f"| {name} | {sw} | {longest} | {first} | {done} | {probes} |")
    if "crop_ratio" in result:
        lines += ["", f"Optimized / eager: **{result['crop_ratio']:.2f}x** (goal "
                  f"{GOALS['crop_ratio']}x, MegaFold {MEGAFOLD['crop_ratio']}x)."]
    return "\n".join(lines) + "\n"


def _schema_check(batch: dict[str, torch.Tensor], sizes: dict) -> bool:
    """Validate the batch against fold-data's AF3 SAMPLE_FEATURES where fold-data's AF3 package
    imports (it needs RDKit); False where it cannot be checked, raises where it is wrong."""
    try:
        from fold_data.af3.schema import SAMPLE_FEATURES
        from fold_data.schema import validate
    except ImportError:
        return False
    n = sizes["n_token"]
    validate({k: v[0].cpu().numpy() for k, v in batch.items()}, SAMPLE_FEATURES,
             where="train_af3 synthetic sample", allow_extra=False,
             sizes={"N_token": n, "N_atom": ATOMS_PER_TOKEN * n, "N_msa": sizes["n_msa"],
                    "N_templ": sizes["n_templ"]})
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shapes (smoke test)")
    parser.add_argument("--reps", type=int, default=3, help="timed iterations per row")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations per row")
    parser.add_argument("--rows", default=",".join(k for k, _, _ in ROWS),
                        help="comma-separated subset of rows (default all): "
                             + ", ".join(k for k, _, _ in ROWS))
    parser.add_argument("--n-token", type=int, default=None, help="crop size of the timed rows")
    parser.add_argument("--cycles", type=int, default=None, help="trunk passes per timed step")
    parser.add_argument("--no-crop", action="store_true", help="skip the longest-crop searches")
    parser.add_argument("--crop-only", default=None,
                        help="only crop searches, of these comma-separated paths: "
                             + ", ".join(CROP_PATHS))
    parser.add_argument("--crop-start", type=int, default=None)
    parser.add_argument("--crop-resolution", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None, help="largest crop probed")
    parser.add_argument("--budget-seconds", type=float, default=500.0,
                        help="wall-time budget of the whole run (rows and searches)")
    parser.add_argument("--out", type=Path, default=None, help="JSON here, Markdown beside it")
    args = parser.parse_args(argv)
    device = device_arg(args.device, "train_af3")
    rows = rows_arg(args.rows, [k for k, _, _ in ROWS], "train_af3")
    sizes = dict(TINY if args.tiny else FULL)
    for key in ("n_token", "cycles", "crop_start", "crop_resolution", "max_tokens"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    if args.crop_only:
        paths = [p.strip() for p in args.crop_only.split(",") if p.strip()]
        unknown = sorted(set(paths) - set(CROP_PATHS))
        if unknown:
            raise SystemExit(f"train_af3: unknown crop paths {unknown}")
        result = run_crops(device, args.tiny, paths, args.budget_seconds, sizes, args.out)
        print(crop_markdown(result))
        return result
    result = run(device, args.tiny, args.reps, args.warmup, rows, args.budget_seconds, sizes,
                 args.out, crop=not args.no_crop)
    print(to_markdown(result))
    return result


if __name__ == "__main__":
    main()
