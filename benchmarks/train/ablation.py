"""Ablation of the training-step optimizations (as ScaleFold's figure 8): the full ``af2_initial``
training step (N_res 256, N_clust 128, N_extra 1024, 4 templates, R = 4 recycling copies), first
with everything off, then adding one optimization per row, cumulatively:

====  ==========================  =============================================================
row   switch                      what changes
====  ==========================  =============================================================
0     baseline                    ops backend ``torch``, fp32 weights + bf16 autocast, per-block
                                  activation checkpointing, ``torch.optim.Adam`` +
                                  ``clip_grad_norm_`` + an EMA loop over the parameter list
1     fused kernels               ops backend ``triton`` (fold-kernels: EvoAttention, LayerNorm,
                                  gating / dropout-residual fusions), forward and recompute
2     tensor fusion               ``FlatParams``: parameters and gradients are views of one flat
                                  buffer; ``FlatAdam``'s PyTorch path over it
3     fused Adam+EMA              ``FlatAdam`` with fold-kernels' one-launch Adam + clip + EMA
4     bf16 parameters             weights of the embedders and the Evoformer / extra MSA /
                                  template stacks in bf16 with an fp32 master copy in
                                  ``FlatAdam``; the structure module and heads keep fp32
                                  weights (fold-model runs them in fp32)
5     no checkpointing            activation checkpointing off; if that runs out of memory or
                                  peaks over 60% of the device (the CUDA-graph rows need the
                                  rest), ``activation_checkpointing=auto`` with
                                  ``ckpt_memory_fraction=0.6``: the last blocks of the Evoformer
                                  (and extra MSA stack) that fit run without it, planned by
                                  ``fold_train.ckpt_plan`` from the measured memory of one step;
                                  the later rows keep the counts it found
6     CUDA Graphs                 forward + loss + backward replayed from one graph per N_cycle
                                  (``fold_train.cuda_graphs``; every N_cycle in 1..R captured)
7     torch.compile SM            ``torch.compile`` of the structure module
8     GC off                      Python garbage collection off during steps
====  ==========================  =============================================================

Every row is a ``fold_train.TrainConfig`` (the ``af2_initial`` training preset with
``key=value`` overrides, listed per row in the JSON as ``overrides``: ``fold-train train
--preset af2_initial <overrides>`` trains with the same switches) and its timed steps are
``fold_train.loop.Trainer`` steps (``Trainer.run_steps``, the steps of ``fit`` on batches given
by the caller): the product's step, no private copy. The switches are the options
``ops_backend``, ``tensor_fusion``, ``use_kernels``, ``bf16_weights``,
``activation_checkpointing`` (true / false / auto), ``model.uncheckpointed_blocks``,
``cuda_graphs``, ``compile_structure_module`` and ``gc_off``. Every row times steps of N_cycle = R
(R - 1 passes without gradients, one with, as ``model/full.py``) on the same synthetic batch
(``benchmarks/common/af2_batch.py`` with its ground truth copied over the R passes: needs numpy and
fold-data's ground-truth builder, not gemmi/RDKit), after warm-up steps (with CUDA Graphs: one
per N_cycle, which captures the whole cache); the RNG is reseeded before every step so that the
rows draw the same dropout. Reported per row: median step time, peak allocated
and reserved memory (the graphs' private pool shows in the latter), the loss, speedup over the
baseline and over the previous row. A row that fails (out of memory, a capture error) is
recorded with its error and its switch is left off for the rows after it.

    python -m benchmarks.train.ablation --out benchmarks/results/train/train_ablation.json  # CUDA
    python -m benchmarks.train.ablation --device cpu --tiny                             # smoke
    python -m benchmarks.train.ablation --rows baseline,graphs \
        --assume kernels,flat,fused_adam,bf16,no_ckpt --out $OUT/ablation.json
        # the eager baseline and the graphed step; the assumed no_ckpt is
        # activation_checkpointing=auto unless --uncheckpointed K fixes the plan

One H100: about 5-7 minutes with the default 3 timed steps per row (a step is 2-5 s; the
compile row compiles for about a minute). The CPU smoke mode runs the tiny model and skips the
CUDA-only rows (CUDA Graphs) and torch.compile (minutes on CPU), saying so in the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from fold_train.config import apply_overrides, preset
from fold_train.loop import Trainer

from benchmarks.common.af2_batch import FULL, TINY, training_batch
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.cli import device_arg, rows_arg
from benchmarks.common.machine import versions
from benchmarks.common.results import write_result


@dataclasses.dataclass(frozen=True)
class Switches:
    """One row's switches; :func:`overrides` turns them into fold-train options."""

    backend: str = "torch"  # ops_backend
    flat: bool = False  # tensor_fusion
    fused_adam: bool = False  # use_kernels
    bf16_params: bool = False  # bf16_weights
    checkpointing: bool | str = True  # activation_checkpointing: true / false / "auto"
    uncheckpointed: int = 0  # with checkpointing: model.uncheckpointed_blocks (Evoformer)
    uncheckpointed_extra: int = 0  # model.uncheckpointed_extra_msa_blocks
    cuda_graphs: bool = False
    compile_sm: bool = False  # compile_structure_module
    gc_off: bool = False


ROWS: list[tuple[str, str, dict]] = [
    ("baseline", "eager baseline", {}),
    ("kernels", "+ fused kernels (Triton where supported)", {"backend": "auto"}),
    ("flat", "+ tensor fusion (flat buffers)", {"flat": True}),
    ("fused_adam", "+ fused Adam+EMA", {"fused_adam": True}),
    ("bf16", "+ bf16 parameters (fp32 master)", {"bf16_params": True}),
    ("no_ckpt", "- activation checkpointing", {"checkpointing": False}),
    ("graphs", "+ CUDA Graphs (per N_cycle)", {"cuda_graphs": True}),
    ("compile", "+ torch.compile structure module", {"compile_sm": True}),
    ("gc_off", "+ GC off", {"gc_off": True}),
]
PLAN_FILL = 0.6  # ckpt_memory_fraction: of the device's memory, for the step; graphs need the rest


class RowSkipped(Exception):
    """The row cannot run on this device (said in the table)."""


def _flag(x: bool | str) -> str:
    return x if isinstance(x, str) else str(x).lower()


def overrides(sw: Switches, cuda: bool) -> list[str]:
    """The ``key=value`` options of fold-train's ``af2_initial`` (or ``tiny``) preset that make
    ``sw``'s training step. bf16 autocast on every row (the preset's precision); the fused Adam
    is fold-kernels' on CUDA and the PyTorch path on CPU."""
    backend = sw.backend if cuda or sw.backend == "torch" else "auto"  # CPU: the reference
    return ["precision=bf16", f"ops_backend={backend}", f"tensor_fusion={_flag(sw.flat)}",
            "use_kernels=" + (("true" if cuda else "none") if sw.fused_adam else "false"),
            f"bf16_weights={_flag(sw.bf16_params)}",
            f"activation_checkpointing={_flag(sw.checkpointing)}",
            "model.checkpoint_blocks=true",  # what auto plans from (tiny: off in the preset)
            f"ckpt_memory_fraction={PLAN_FILL}",
            f"model.uncheckpointed_blocks={sw.uncheckpointed}",
            f"model.uncheckpointed_extra_msa_blocks={sw.uncheckpointed_extra}",
            f"cuda_graphs={_flag(sw.cuda_graphs)}",
            f"compile_structure_module={_flag(sw.compile_sm)}", f"gc_off={_flag(sw.gc_off)}",
            "loader_workers=0"]


def make_trainer(sw: Switches, tiny: bool, device: torch.device, run_dir: str) -> Trainer:
    """The fold-train Trainer of a row (no data stream: the benchmark gives the batch)."""
    cuda = device.type == "cuda"
    if sw.cuda_graphs and not cuda:
        raise RowSkipped("CUDA Graphs need a CUDA device")
    if sw.compile_sm and not cuda:
        raise RowSkipped("torch.compile takes minutes on CPU; GPU only")
    cfg = apply_overrides(preset("tiny" if tiny else "af2_initial"), overrides(sw, cuda))
    from fold_train.distributed import DistContext

    return Trainer(cfg, run_dir, None, ctx=DistContext(device=device), progress=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(sw: Switches, batch: dict, device: torch.device, tiny: bool, r: int,
            reps: int) -> dict:
    cuda = device.type == "cuda"
    notes = []
    if sw.backend != "torch" and not cuda:
        notes.append("kernels: torch reference on CPU")
    if sw.fused_adam and not cuda:
        notes.append("Adam: PyTorch path on CPU")
    with tempfile.TemporaryDirectory(prefix="train_ablation_") as run_dir:
        trainer = make_trainer(sw, tiny, device, run_dir)
        step = 0

        def one(n_cycle: int) -> dict:
            nonlocal step
            torch.manual_seed(1000 + step)  # the same dropout in every row
            step += 1
            return trainer.run_steps([batch], n_cycle=n_cycle)[0]

        warm = list(range(1, r + 1)) if sw.cuda_graphs else [r]  # graphs: the whole cache
        for n in warm:
            record = one(n)
        _sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            record = one(r)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        loss = record["loss"]
        row = {"step_ms": statistics.median(times), "times_ms": times, "loss": loss,
               "peak_alloc_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda
               else None,
               "reserved_mib": torch.cuda.memory_reserved(device) / 2**20 if cuda else None,
               "overrides": overrides(sw, cuda)}
        if sw.cuda_graphs:
            row["graphs_captured"] = trainer.captured_graphs
        if trainer.ckpt_plan is not None:
            row["plan"] = trainer.ckpt_plan.to_dict()
        row["uncheckpointed"] = trainer.model.uncheckpointed_blocks()
        if record.get("skipped") or not torch.isfinite(torch.tensor(loss)):
            notes.append(f"non-finite loss {loss}")
        if notes:
            row["note"] = "; ".join(notes)
    return row  # the trainer (model, optimizer, graphs) is released with this frame


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()




def _planned(sw: Switches, row: dict) -> Switches:
    """The switches with an auto plan's counts fixed (the rows after it reuse them)."""
    k = row.get("uncheckpointed", {})
    return dataclasses.replace(sw, checkpointing=True, uncheckpointed=k.get("evoformer", 0),
                               uncheckpointed_extra=k.get("extra_msa", 0))


def ablate(device: torch.device, tiny: bool, reps: int, rows: list[str],
           log: Callable[[str], None] = print,
           on_row: Callable[[dict], None] | None = None,
           assume: tuple[str, ...] = (), uncheckpointed: int | None = None,
           uncheckpointed_extra: int = 0) -> dict:
    """Time ``rows`` cumulatively. ``assume``: rows whose switches are applied without timing
    them (a sweep continued in another process); an assumed ``no_ckpt`` is
    ``activation_checkpointing=auto`` (planned by the first timed row), or, with
    ``uncheckpointed`` (the k an earlier plan found), checkpointing on all but the last k
    Evoformer blocks (and ``uncheckpointed_extra`` extra MSA blocks)."""
    sizes = TINY if tiny else FULL
    found = ensure_kernels(device, needed="kernels" in rows)
    batch = training_batch(sizes, device)
    sw = Switches()
    results, base_ms, prev_ms = [], None, None
    header = {**versions(device), "preset": "tiny" if tiny else "af2_initial", **sizes,
              "n_cycle": sizes["r"], "reps": reps, "path": "fold_train.loop.Trainer",
              "attention_backends": found, "assumed": list(assume)}
    for key, label, change in ROWS:
        if key in assume and key not in rows:
            if key == "no_ckpt":
                change = ({"checkpointing": "auto"} if uncheckpointed is None else
                          {"uncheckpointed": uncheckpointed,
                           "uncheckpointed_extra": uncheckpointed_extra})
            sw = dataclasses.replace(sw, **change)
            continue
        if key not in rows:
            continue
        trial = dataclasses.replace(sw, **change)
        entry = {"row": key, "label": label, "switches": dataclasses.asdict(trial)}
        t0 = time.perf_counter()
        try:
            why = None
            try:
                entry.update(run_row(trial, batch, device, tiny, sizes["r"], reps))
            except torch.cuda.OutOfMemoryError:
                if key != "no_ckpt":
                    raise
                why = "ran out of memory"  # planned below, once the failed step is released
            if key == "no_ckpt" and why is None and device.type == "cuda":
                limit = PLAN_FILL * torch.cuda.get_device_properties(device).total_memory
                if entry["peak_alloc_mib"] * 2**20 > limit:  # no room for the graphs' pools
                    why = (f"peaked at {entry['peak_alloc_mib']:.0f} MiB, over {PLAN_FILL:.0%} "
                           f"of the device")
            if why is not None:
                _free(device)
                trial = dataclasses.replace(sw, checkpointing="auto")
                entry.update(label="- activation checkpointing (partly: auto, memory)",
                             switches=dataclasses.asdict(trial))
                entry.update(run_row(trial, batch, device, tiny, sizes["r"], reps))
                k = entry["uncheckpointed"]
                entry["note"] = (f"all blocks uncheckpointed {why}; activation_checkpointing="
                                 f"auto: the last {k.get('evoformer', 0)} Evoformer and "
                                 f"{k.get('extra_msa', 0)} extra MSA blocks without it")
            if trial.checkpointing == "auto":
                trial = _planned(trial, entry)  # the following rows reuse the plan
            sw = trial  # kept for the following rows
        except RowSkipped as e:
            entry["skipped"] = str(e)
        except torch.cuda.OutOfMemoryError:
            entry["error"] = "out of memory"
        except Exception as e:  # a row that fails is reported; the sweep goes on without it
            entry["error"] = f"{type(e).__name__}: {e}"[:500]
        _free(device)
        entry["row_s"] = time.perf_counter() - t0
        if "step_ms" in entry:
            base_ms = base_ms or entry["step_ms"]
            entry["speedup_vs_baseline"] = base_ms / entry["step_ms"]
            entry["speedup_vs_previous"] = (prev_ms or entry["step_ms"]) / entry["step_ms"]
            prev_ms = entry["step_ms"]
        results.append(entry)
        log(json.dumps({k: v for k, v in entry.items() if k not in ("switches", "overrides")}))
        if on_row is not None:  # a sweep cut short by a time limit keeps the rows it made
            on_row(header | {"rows": results})
    return header | {"rows": results}


def to_markdown(result: dict) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = [
        f"# Training-step ablation ({result['preset']})",
        "",
        f"Device: {result['device']}, PyTorch {result['torch']}, Triton {result['triton']}, "
        f"{result['date']}. N_res {result['n_res']}, N_clust {result['n_clust']}, N_extra "
        f"{result['n_extra']}, {result['n_templ']} templates, N_cycle {result['n_cycle']} "
        f"(timed), median of {result['reps']} steps of fold-train's Trainer; each row adds its "
        "switch to the rows above"
        + (f" (switches on from the start, untimed here: {', '.join(result['assumed'])})"
           if result.get("assumed") else "") + ".",
        "",
        "| row | step ms | speedup vs baseline | vs previous | peak alloc MiB | reserved MiB "
        "| loss | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result["rows"]:
        note = e.get("skipped") or e.get("error") or e.get("note") or ""
        plan = e.get("plan")
        if plan and "activation_checkpointing=auto" not in note:
            note = (note + f" activation_checkpointing=auto: the last "
                    f"{plan.get('no_ckpt_evoformer', 0)} Evoformer, "
                    f"{plan.get('no_ckpt_extra_msa', 0)} extra MSA blocks without it").strip()
        if "graphs_captured" in e:
            note = (note + f" graphs for N_cycle {e['graphs_captured']}").strip()
        lines.append(
            f"| {e['label']} | {num(e.get('step_ms'), '.1f')} | "
            f"{num(e.get('speedup_vs_baseline'), '.2f')} | "
            f"{num(e.get('speedup_vs_previous'), '.2f')} | "
            f"{num(e.get('peak_alloc_mib'), '.0f')} | {num(e.get('reserved_mib'), '.0f')} | "
            f"{num(e.get('loss'), '.4f')} | {note.replace('|', '/')} |")
    last = [e for e in result["rows"] if "overrides" in e]
    if last:
        lines += ["", "The last row as a training run: `fold-train train --preset "
                  f"{result['preset']} --data DATA {' '.join(last[-1]['overrides'])}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shapes (smoke test)")
    parser.add_argument("--reps", type=int, default=3, help="timed steps per row")
    parser.add_argument("--rows", default=",".join(k for k, _, _ in ROWS),
                        help="comma-separated subset of rows (default all): "
                             + ", ".join(k for k, _, _ in ROWS))
    parser.add_argument("--assume", default="",
                        help="rows whose switches are on without being timed (continue a sweep "
                             "in another process), e.g. kernels,flat,fused_adam,bf16,no_ckpt")
    parser.add_argument("--uncheckpointed", type=int, default=None,
                        help="with --assume no_ckpt: the Evoformer's last K blocks without "
                             "checkpointing (the rest keep it), as an earlier plan found; "
                             "default: activation_checkpointing=auto plans it")
    parser.add_argument("--uncheckpointed-extra", type=int, default=0,
                        help="with --uncheckpointed: the extra MSA stack's last blocks without")
    parser.add_argument("--out", type=Path, default=None, help="JSON here, Markdown beside it")
    args = parser.parse_args(argv)
    device = device_arg(args.device, "train_ablation")
    rows = rows_arg(args.rows, [k for k, _, _ in ROWS], "train_ablation")

    def save(result: dict) -> None:
        if args.out is not None:
            write_result(args.out, result, to_markdown(result), indent=2)

    assume = tuple(rows_arg(args.assume, [k for k, _, _ in ROWS], "train_ablation", "--assume"))
    result = ablate(device, args.tiny, args.reps, rows, on_row=save, assume=assume,
                    uncheckpointed=args.uncheckpointed,
                    uncheckpointed_extra=args.uncheckpointed_extra)
    print(to_markdown(result))
    save(result)
    return result




if __name__ == "__main__":
    main()
