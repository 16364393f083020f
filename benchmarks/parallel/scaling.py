"""Scaling of fold-parallel on 2, 4 or 8 GPUs of one host: DAP-2/4/8, BP-2 and BP-2 x DAP-2/4,
with and without DAO, against one GPU (issue 8; FastFold 4.2, 5.1, 6.2; Parallel Evoformer 4.2;
HelixFold hybrid parallelism).

    torchrun --nproc_per_node 4 -m benchmarks.parallel.scaling --out scaling_w4.json   # NCCL
    torchrun --nproc_per_node 4 -m benchmarks.parallel.scaling --smoke --out /tmp/s.json  # CPU

Workloads
---------
* ``train``: one full AF2 training step of ``fold_train.Trainer`` (``Trainer.run_steps``, the
  steps of ``fold-train train``): 4 recycling passes, 3 without gradients; template and extra MSA
  stacks, structure module, AF2 loss; backward, the Trainer's gradient average over the layout's
  ranks, its flat Adam + clipping + EMA. Each row is a ``TrainConfig``: the training preset of the
  shape with the row's options (in the JSON as ``preset`` and ``overrides``: bf16 autocast on GPU,
  per-block activation checkpointing, the layout's block order, ``dap``, ``bp``, ``dao``), the
  Trainer applying DAP/BP itself; the batch of ``benchmarks/common/af2_batch.py`` in the
  Trainer's layout (``training_batch``). Shapes: ``finetune`` (N_res 384, N_seq 512, N_extra
  5120, preset ``af2_finetune``) and ``initial`` (256, 128, 1024, ``af2_initial``). Median of
  ``--reps`` steps after one warm-up step; peak memory of every GPU of the layout.
* ``inference``: the 48-block Evoformer stack forward without gradients, bf16, N_seq 128, at
  N_res 4096 and 3072, chunked (``--chunk-size``, fold-model's ``set_chunk_size``). Before the
  timed passes a 2-block copy of the stack runs twice (warm-up, then timed): that per-block time
  x 48 x reps is the row's estimate, and a row whose estimate exceeds ``--inference-budget-s`` is
  recorded as skipped instead of run. ``--skip-single-inference`` skips the one-GPU rows outright.

Layouts (``--layouts``; those needing more ranks than the world are left out)
-----------------------------------------------------------------------------
``single`` (AF2 block order), ``dapN`` (synchronous DAP over N ranks), ``dapN_dao`` (Duality Async
Operations on), ``bp2`` (Parallel Evoformer order; BP on the Evoformer and extra MSA stacks),
``bp2_dapN[_dao]`` (BP-2 x DAP-N: rank = bp_index * N + dap_index, as ``fold_parallel.
build_groups`` lays ranks out), ``single_parallel`` (one GPU, Parallel Evoformer order: the
same-order baseline of the BP layouts). DAP covers the Evoformer, extra MSA and template pair
stacks. A layout on k < W ranks runs on ranks 0..k-1 while the others wait:
``fold_train.distributed.layout_context`` builds fold-parallel's groups (``build_groups`` with
``subset=True``: same rank formula) on the first k ranks, every rank calling it in the same order
(a collective), once per layout shape. Idle ranks wait on a gloo group with a long timeout
(``--wait-timeout-s``), not on NCCL, so a long one-GPU run cannot trip the NCCL watchdog.

Rows run in order of importance (the goals' layouts first, the DAO variants and the same-order
baseline last; inference: DAP at 4096 first, one GPU last) so that a run stopped by a time limit
keeps the most useful results: after every row rank 0 prints one flushed line and rewrites
``--out`` (JSON) and the markdown table beside it atomically. Rows already in ``--out`` from an
earlier call on the same device and world size are kept (a re-measured row replaces its old one;
``--fresh`` starts over), so one scaling table can be filled by several short calls. Speedups are
against the one-GPU row of the same shape (``single``; BP layouts also against
``single_parallel`` when measured). An ``OOM`` on a rank of a multi-rank layout is recorded only if
every rank reaches the end of the step; otherwise the peers wait in a collective until the NCCL
timeout (``--timeout-s``) ends the call: rows written so far stay, rerun with that layout removed.

GPU time on 4 H200s (planning estimates)
----------------------------------------
From ``results/parallel/parallel_dap_bp.md`` (48-block Evoformer fwd+bwd, checkpointed, one H200:
1.8 s at the initial shapes, 6.6 s at fine-tuning) and ``results/model/model_full.json`` (full
initial step 4.8 s on one H100): a one-GPU full step is ~4 s (initial) and ~13 s (fine-tuning: the
Evoformer fwd+bwd, three no-grad recycling passes of ~1.2 s, a 4-block extra MSA stack over 5120
sequences worth ~8 Evoformer blocks per pass, templates, structure module). A row costs (1 warm-up +
reps) steps plus ~5-10 s of model build and NCCL communicator setup; startup ~30 s per call.

* train finetune, W=4, ``--reps 3``: steps ~ single 13 s, dap4 4.5, bp2_dap2 5.5, dap2 7.5, bp2
  9.5, the three DAO variants 17.5, single_parallel 13 -> ~70 s x 4 + ~70 s = ~6 min.
* train initial, W=4, ``--reps 3``: ~1/3 of that, ~2.5 min.
* inference, W=4, ``--reps 1 --chunk-size 32``: the eager attention streams its N_res^3 x 4-head
  logits (~26 bytes per element over matmul, bias, mask, fp32 softmax, cast) at ~4.8 TB/s: ~3 s
  per block at 4096 on one GPU (~150 s per 48-block pass), 0.42 x that at 3072; DAP-4 about a
  quarter plus the all-to-alls. dap4 4096 ~50 s, dap4 3072 ~25 s, single 3072 ~80 s, single 4096
  ~190 s (skipped when its estimate is over the budget) -> ~6 min.
* W=8 (13 training layouts): finetune ~7.5 min, initial ~3 min, inference (dap8, dap4, single)
  ~6.5 min.

So the W=4 run is 3 calls of < 9 minutes (see fold-parallel's README for the commands).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fold_model.af2 import config
from fold_model.af2.evoformer import EvoformerStack
from fold_parallel import DapComm, enable_dap, init_distributed
from fold_train.config import apply_overrides, preset
from fold_train.distributed import DistContext, layout_context
from fold_train.loop import Trainer

from benchmarks.common.af2_batch import training_batch
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.parallel import (
    autocast_bf16,
    evoformer_inputs,
    guard_oom,
    sync,
    timed,
)
from benchmarks.common.results import write_result

# (N_res, N_clust = N_seq, N_extra, templates, recycling passes) and the preset of each shape.
TRAIN_SIZES = {
    "finetune": {"n_res": 384, "n_clust": 512, "n_extra": 5120, "n_templ": 4, "r": 4},
    "initial": {"n_res": 256, "n_clust": 128, "n_extra": 1024, "n_templ": 4, "r": 4},
}
PRESETS = {"finetune": "af2_finetune", "initial": "af2_initial"}
INFER_N_RES = (4096, 3072)
INFER_N_SEQ = 128
PROBE_BLOCKS = 2
SMOKE = {
    # Odd N_res so that DAP-4 pads; the tiny preset for both shapes.
    "train_sizes": {
        "finetune": {"n_res": 11, "n_clust": 5, "n_extra": 7, "n_templ": 2, "r": 2},
        "initial": {"n_res": 9, "n_clust": 4, "n_extra": 6, "n_templ": 2, "r": 2},
    },
    "infer_n_res": (19, 13),
    "infer_n_seq": 4,
}


@dataclass(frozen=True)
class Layout:
    """One way to spread a sample over ``bp * dap`` GPUs (ranks 0 .. bp*dap-1)."""

    name: str
    bp: int = 1
    dap: int = 1
    dao: bool = False
    order: str = "af2"  # block order; BP needs "parallel"

    @property
    def ranks(self) -> int:
        return self.bp * self.dap


def _layout(name: str) -> Layout:
    if name == "single":
        return Layout(name)
    if name == "single_parallel":
        return Layout(name, order="parallel")
    parts = name.split("_")
    dao = parts[-1] == "dao"
    parts = parts[:-1] if dao else parts
    bp = int(parts[0][2:]) if parts[0].startswith("bp") else 1
    dap = int(parts[-1][3:]) if parts[-1].startswith("dap") else 1
    return Layout(name, bp=bp, dap=dap, dao=dao, order="parallel" if bp > 1 else "af2")


# Importance order: the issue's goals (DAP-8, BP-2 x DAP-4) and their 4-GPU counterparts first,
# then the smaller layouts, the DAO variants, and the same-order one-GPU baseline of BP last.
TRAIN_LAYOUTS = tuple(_layout(n) for n in (
    "single", "dap8", "bp2_dap4", "dap4", "bp2_dap2", "dap2", "bp2",
    "dap8_dao", "bp2_dap4_dao", "dap4_dao", "bp2_dap2_dao", "dap2_dao", "single_parallel",
))
# Inference: DAP with DAO (forward overlap) at 8 and 4 ranks (2 on a 2-rank world), then one GPU.
INFER_LAYOUTS = tuple(_layout(n) for n in ("dap8_dao", "dap4_dao", "dap2_dao", "single"))
ALL_LAYOUTS = {lay.name: lay for lay in TRAIN_LAYOUTS + INFER_LAYOUTS}

# Published figures (speedup over one GPU) and the issue's goals, per (section, shape, layout).
REFERENCES: dict[tuple[str, str, str], str] = {
    ("train", "finetune", "dap2"): "HelixFold T6 1.48x (A100)",
    ("train", "finetune", "bp2"): "HelixFold T6 1.34x (A100)",
    ("train", "finetune", "bp2_dap2"): "HelixFold T6 2.09x (A100)",
    ("train", "finetune", "dap4"): "HelixFold T6 2.09x (A100)",
    ("train", "finetune", "dap8"): "HelixFold T6 2.25x (A100)",
    ("train", "finetune", "bp2_dap4"): "HelixFold T6 2.89x (A100)",
    ("train", "initial", "dap2"): "HelixFold T6 0.95x (A100); ScaleFold 1.6x (H100)",
    ("train", "initial", "bp2"): "HelixFold T6 1.39x (A100)",
    ("train", "initial", "dap4"): "ScaleFold 2.4x (H100)",
    ("train", "initial", "dap8"): "ScaleFold 2.77x (H100)",
    ("inference", "3072", "dap4_dao"): "FastFold 238.5 s (4 A100, whole model)",
    ("inference", "3072", "dap8_dao"): "FastFold 201.9 s (8 A100, whole model)",
    ("inference", "4096", "dap8_dao"): "FastFold 548.0 s (8 A100, whole model)",
}
GOALS: dict[tuple[str, str, str], str] = {
    ("train", "finetune", "dap8"): ">= 3x",
    ("train", "finetune", "bp2_dap4"): ">= 3.5x",
    ("inference", "4096", "dap8_dao"): "< 300 s (whole model, 8 H200)",
}
REFERENCE_NOTES = [
    "HelixFold Table 6 (Parallel Evoformer paper, hybrid parallelism on A100, step time vs "
    "DAP=1 BP=1): fine-tuning DAP-2 1.48x, BP-2 1.34x, BP-2 x DAP-2 2.09x, DAP-4 2.09x, "
    "DAP-8 2.25x, BP-2 x DAP-4 2.89x; initial training DAP-2 0.95x, BP-2 1.39x.",
    "ScaleFold (H100, MLPerf OpenFold step with its other optimizations): DAP-2/4/8 = 1.6x, "
    "2.4x, 2.77x one GPU.",
    "FastFold Table 5 (A100, whole-model inference latency): 3072 residues 238.5 s on 4 GPUs, "
    "201.9 s on 8; 4096 residues 548.0 s on 8 (OOM on 4).",
    "Goals (issue 8): DAP-8 >= 3x and BP-2 x DAP-4 >= 3.5x one GPU at the fine-tuning shapes; "
    "4096-residue inference < 5 min on 8 H200s. The inference rows time one 48-block Evoformer "
    "pass; `4 passes s` (AF2's 3 recycles + 1) is a lower bound of whole-model inference.",
]


# ----------------------------------------------------------------------------- layouts


_CONTEXTS: dict[tuple[int, int], DistContext | None] = {}


def context_of(world: DistContext, layout: Layout) -> DistContext | None:
    """This rank's fold-train context of ``layout`` on world ranks 0 .. bp*dap-1 (``None`` outside
    it), built once per (bp, dap): every rank asks for the same layouts in the same order, so the
    collective group creation matches on all of them."""
    key = (layout.bp, layout.dap)
    if key not in _CONTEXTS:
        _CONTEXTS[key] = layout_context(world, layout.ranks, dap=layout.dap, bp=layout.bp)
    return _CONTEXTS[key]


# ----------------------------------------------------------------------------- workloads


def train_overrides(args, layout: Layout, device: torch.device) -> list[str]:
    """The fold-train options of a training row (``torchrun ... fold-train train --preset P``
    with these trains with the same step)."""
    return [
        # bf16 autocast on GPU; the CPU smoke run stays fp32
        "precision=" + ("bf16" if device.type == "cuda" else "fp32"),
        "activation_checkpointing=true", f"model.block_order={layout.order}",
        f"dap={layout.dap}", f"bp={layout.bp}", f"dao={str(layout.dao).lower()}",
        "loader_workers=0",
        *([] if args.smoke or not args.blocks else [f"model.evoformer.no_blocks={args.blocks}"]),
    ]


def train_preset(args, shape: str) -> str:
    return "tiny" if args.smoke else PRESETS[shape]


def train_row(args, device: torch.device, shape: str, layout: Layout,
              ctx: DistContext) -> dict:
    """Time ``fold_train.Trainer`` steps of ``layout`` at ``shape`` on this rank."""
    sizes = (SMOKE["train_sizes"] if args.smoke else TRAIN_SIZES)[shape]
    cfg = apply_overrides(preset(train_preset(args, shape)), train_overrides(args, layout, device))
    batch = training_batch(sizes, device)
    with tempfile.TemporaryDirectory(prefix="parallel_scaling_") as run_dir:  # stays empty
        trainer = Trainer(cfg, run_dir, None, ctx=ctx, progress=False)

        def step() -> None:  # N_cycle = R: R - 1 passes without gradients, one with
            trainer.run_steps([batch], n_cycle=sizes["r"])

        ms, peak, host_ms, syncs = timed(step, device, args.reps, count_syncs=args.count_syncs)
    return {"ms": ms, "peak_mib": peak, "host_ms": host_ms, "host_syncs": syncs}


def inference_row(args, device: torch.device, n_res: int, layout: Layout,
                  ctx: DistContext) -> dict:
    """Time the Evoformer stack forward (no grad) of ``layout`` at ``n_res`` on this rank, after a
    2-block probe whose per-block time gives the row's estimate (skipped over the budget)."""
    n_seq = SMOKE["infer_n_seq"] if args.smoke else INFER_N_SEQ
    reps = max(1, args.infer_reps)

    def build(blocks: int) -> EvoformerStack:
        cfg = config("tiny" if args.smoke else "af2_initial").evoformer
        cfg.no_blocks = blocks
        torch.manual_seed(0)
        stack = EvoformerStack(cfg, layout.order).to(device).eval()
        stack.set_chunk_size(args.chunk_size)
        if layout.dap > 1:  # the inference layouts are DAP only
            comm = DapComm(ctx.groups.dap_group, overlap_forward=layout.dao,
                           overlap_backward=layout.dao)
            enable_dap(stack, comm, check_shapes=False)
        return stack

    n_blocks = config("tiny" if args.smoke else "af2_initial").evoformer.no_blocks
    if not args.smoke and args.blocks:
        n_blocks = args.blocks
    probe_blocks = min(PROBE_BLOCKS, n_blocks)
    probe = build(probe_blocks)
    inputs = _infer_inputs(args, n_res, n_seq, device)

    def run(stack: EvoformerStack) -> Callable[[], None]:
        def fwd() -> None:
            with torch.no_grad(), autocast_bf16(device):
                stack(*inputs)
        return fwd

    run(probe)()  # warm-up: kernels, allocator, communicators
    sync(device)
    t0 = time.perf_counter()
    run(probe)()
    sync(device)
    per_block_s = (time.perf_counter() - t0) / probe_blocks
    estimate_s = _agree_max(per_block_s * n_blocks * reps, ctx, device)
    del probe
    if estimate_s > args.inference_budget_s:
        return {"status": f"skipped: estimate {estimate_s:.0f} s > --inference-budget-s "
                          f"{args.inference_budget_s:.0f}", "estimate_s": estimate_s}
    stack = build(n_blocks)
    ms, peak, host_ms, _ = timed(run(stack), device, reps, count_syncs=False, warmup=False)
    return {"ms": ms, "peak_mib": peak, "host_ms": host_ms, "estimate_s": estimate_s}


def _infer_inputs(args, n_res: int, n_seq: int, device: torch.device):
    cfg = config("tiny" if args.smoke else "af2_initial").evoformer
    return evoformer_inputs(cfg, n_res, n_seq, device, grad=False)


def _agree_max(value: float, ctx: DistContext, device: torch.device) -> float:
    """The largest ``value`` over the layout's ranks (so that they all skip or all run)."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(t.item())


# ----------------------------------------------------------------------------- rows and results


def _combine(per_rank: list[dict]) -> dict:
    """One row from every rank's result: a step lasts as long as its slowest rank."""
    status = next((r["status"] for r in per_rank if "status" in r), None)
    row: dict[str, Any] = {}
    estimates = [r["estimate_s"] for r in per_rank if "estimate_s" in r]
    if estimates:
        row["estimate_s"] = max(estimates)
    if status is not None:
        row["status"] = status
        return row
    peaks = [r["peak_mib"] for r in per_rank]
    syncs = [r.get("host_syncs") for r in per_rank]
    row.update({
        "status": "ok",
        "ms": max(r["ms"] for r in per_rank),
        "ms_per_rank": [r["ms"] for r in per_rank],
        "host_ms": max(r["host_ms"] for r in per_rank),
        "peak_mib": None if None in peaks else max(peaks),
        "peak_mib_per_rank": peaks,
        "host_syncs": None if None in syncs else max(syncs),
    })
    return row


def _add_ratios(rows: list[dict]) -> None:
    """Speedups over the one-GPU row of the same section and shape, and the reference columns."""
    base = {(r["section"], r["shape"], r["layout"]): r for r in rows
            if r["status"] == "ok" and r["layout"] in ("single", "single_parallel")}
    for r in rows:
        # A training layout with DAO answers to the same published figure and goal as without.
        name = r["layout"].removesuffix("_dao") if r["section"] == "train" else r["layout"]
        key = (r["section"], r["shape"], name)
        r["reference"] = REFERENCES.get(key)
        r["goal"] = GOALS.get(key)
        r.pop("speedup_vs_1gpu", None)
        r.pop("speedup_vs_same_order_1gpu", None)
        if r["status"] != "ok" or r["layout"].startswith("single"):
            continue
        one = base.get((r["section"], r["shape"], "single"))
        if one is not None:
            r["speedup_vs_1gpu"] = one["ms"] / r["ms"]
        same = base.get((r["section"], r["shape"], "single_parallel"))
        if r["order"] == "parallel" and same is not None:
            r["speedup_vs_same_order_1gpu"] = same["ms"] / r["ms"]


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
    lines = [
        f"# fold-parallel scaling on {results['world_size']} x {results['device']}", "",
        f"Backend {results['backend']}, PyTorch {results['torch']}, Triton {results['triton']}, "
        f"world size {results['world_size']}, dates {', '.join(results['dates'])}. "
        "Script: `benchmarks/parallel/scaling.py` (issue 8); calls:", "",
        *[f"* `{c}`" for c in results["commands"]], "",
        "## Published figures and goals", "", *[f"* {n}" for n in REFERENCE_NOTES], "",
    ]
    train = [r for r in results["rows"] if r["section"] == "train"]
    for shape in dict.fromkeys(r["shape"] for r in train):
        s = next(r for r in train if r["shape"] == shape)
        lines += [
            f"## Training step, {shape} (N_res {s['n_res']}, N_seq {s['n_clust']}, N_extra "
            f"{s['n_extra']}, {s['n_templ']} templates, {s['r']} recycling passes; median of "
            f"{s['reps']})", "",
            f"Steps of `fold_train.Trainer`, training preset `{s.get('preset', '-')}` with each "
            "row's `overrides` (JSON).", "",
            "| layout | GPUs | ms | peak MiB (max GPU) | peak MiB per GPU | speedup vs 1 GPU "
            "| vs same-order 1 GPU | published | goal | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in train if r["shape"] == shape):
            per = r.get("peak_mib_per_rank")
            per_s = "-" if not per or None in per else " / ".join(f"{p:.0f}" for p in per)
            lines.append(
                f"| {r['layout']} | {r['gpus']} | {_fmt(r.get('ms'), '.1f')} "
                f"| {_fmt(r.get('peak_mib'), '.0f')} | {per_s} "
                f"| {_fmt(r.get('speedup_vs_1gpu'), '.2f')} "
                f"| {_fmt(r.get('speedup_vs_same_order_1gpu'), '.2f')} "
                f"| {r['reference'] or '-'} | {r['goal'] or '-'} | {r['status']} |")
        lines.append("")
    infer = [r for r in results["rows"] if r["section"] == "inference"]
    if infer:
        lines += [
            "## Long-sequence inference: Evoformer stack forward (48 blocks, no grad, bf16, "
            "N_seq 128, chunked)", "",
            "| N_res | layout | GPUs | chunk | s | peak MiB (max GPU) | speedup vs 1 GPU "
            "| 4 passes s | estimate s | published | goal | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in infer:
            sec = None if r.get("ms") is None else r["ms"] / 1e3
            lines.append(
                f"| {r['shape']} | {r['layout']} | {r['gpus']} | {r.get('chunk_size')} "
                f"| {_fmt(sec, '.1f')} | {_fmt(r.get('peak_mib'), '.0f')} "
                f"| {_fmt(r.get('speedup_vs_1gpu'), '.2f')} "
                f"| {_fmt(None if sec is None else 4 * sec, '.0f')} "
                f"| {_fmt(r.get('estimate_s'), '.0f')} "
                f"| {r['reference'] or '-'} | {r['goal'] or '-'} | {r['status']} |")
        lines.append("")
    return "\n".join(lines)


class Runner:
    """Runs each row on its layout's ranks while the others wait, and (rank 0) keeps ``--out``
    and its markdown up to date after every row."""

    def __init__(self, args, world: DistContext, control: dist.ProcessGroup,
                 results: dict) -> None:
        self.args, self.world, self.control, self.results = args, world, control, results
        self.device = world.device

    def row(self, section: str, shape: str, layout: Layout,
            fn: Callable[[DistContext], dict], extra: dict | None = None) -> None:
        ctx = context_of(self.world, layout)  # collective: every rank
        t0 = time.perf_counter()
        result = None
        if ctx is not None:
            result = guard_oom(lambda: fn(ctx), self.device)
            result = {"status": "OOM"} if result == "OOM" else result
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, result, group=self.control)  # idle ranks wait here
        row = {"section": section, "shape": shape, "layout": layout.name, "gpus": layout.ranks,
               "bp": layout.bp, "dap": layout.dap, "dao": layout.dao, "order": layout.order,
               **(extra or {}), "date": datetime.date.today().isoformat(),
               "wall_s": time.perf_counter() - t0, **_combine(everyone[: layout.ranks])}
        if dist.get_rank() == 0:
            self._record(row)

    def _record(self, row: dict) -> None:
        rows = self.results["rows"]
        key = (row["section"], row["shape"], row["layout"])
        old = [i for i, r in enumerate(rows) if (r["section"], r["shape"], r["layout"]) == key]
        if old:
            rows[old[0]] = row
        else:
            rows.append(row)
        _add_ratios(rows)
        sp = row.get("speedup_vs_1gpu")
        print(f"[parallel_scaling] {row['section']} {row['shape']} {row['layout']} "
              f"({row['gpus']} GPU): {row['status']}, ms {_fmt(row.get('ms'), '.1f')}, "
              f"peak MiB {_fmt(row.get('peak_mib'), '.0f')}, "
              f"speedup {_fmt(sp, '.2f')}, row wall {row['wall_s']:.0f} s", flush=True)
        if self.args.out is not None:
            write_result(self.args.out, self.results, markdown(self.results), indent=2)


def _selected(candidates: tuple[Layout, ...], names: list[str] | None, world: int) -> list[Layout]:
    chosen = [lay for lay in candidates if names is None or lay.name in names]
    return [lay for lay in chosen if lay.ranks <= world]


def _inference_layouts(names: list[str] | None, world: int) -> list[Layout]:
    """DAP-8 and DAP-4 (DAP-2 on a 2-rank world) with DAO, then one GPU; or the DAP-only
    layouts named in ``--layouts``, the largest first."""
    if names is None:
        dap = [lay for lay in INFER_LAYOUTS if 1 < lay.ranks <= world
               and (lay.ranks >= 4 or world == 2)]
        return dap + [ALL_LAYOUTS["single"]]
    chosen = [ALL_LAYOUTS[n] for n in names if ALL_LAYOUTS[n].bp == 1
              and ALL_LAYOUTS[n].ranks <= world]
    return sorted(chosen, key=lambda lay: -lay.ranks)


def _load_previous(args, header: dict) -> tuple[dict | None, str | None]:
    """Earlier rows in ``--out`` (same device, backend and world size), or an error text."""
    if args.out is None or args.fresh or not args.out.exists():
        return None, None
    try:
        old = json.loads(args.out.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return None, f"{args.out}: cannot read earlier results ({err}); use --fresh"
    mismatch = [k for k in ("device", "backend", "world_size") if old.get(k) != header[k]]
    if mismatch or old.get("benchmark") != "parallel_scaling":
        return None, (f"{args.out}: earlier results differ in {mismatch or ['benchmark']} "
                      f"(file {[old.get(k) for k in mismatch]}, now "
                      f"{[header[k] for k in mismatch]}); use another --out or --fresh")
    return old, None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, CPU gloo")
    parser.add_argument("--only", choices=["train", "inference"], default=None)
    parser.add_argument("--shapes", nargs="+", choices=list(TRAIN_SIZES),
                        default=list(TRAIN_SIZES), help="training shapes, in this order")
    parser.add_argument("--layouts", nargs="+", choices=list(ALL_LAYOUTS), default=None,
                        help="only these layouts (run in importance order)")
    parser.add_argument("--reps", type=int, default=3, help="timed training steps per row")
    parser.add_argument("--infer-reps", type=int, default=1, help="timed forwards per row")
    parser.add_argument("--blocks", type=int, default=48, help="Evoformer blocks")
    parser.add_argument("--infer-n-res", nargs="+", type=int, default=None,
                        help=f"inference N_res (default {' '.join(map(str, INFER_N_RES))})")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="inference chunk size (default 32; 4 with --smoke)")
    parser.add_argument("--skip-single-inference", action="store_true",
                        help="do not run the one-GPU inference rows (OOM or minutes each)")
    parser.add_argument("--inference-budget-s", type=float, default=240.0,
                        help="skip an inference row whose 2-block estimate is longer")
    parser.add_argument("--count-syncs", action="store_true",
                        help="one more step per row counting synchronising CUDA calls")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    parser.add_argument("--wait-timeout-s", type=float, default=3600.0,
                        help="how long idle ranks wait for a row (gloo group)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--fresh", action="store_true", help="ignore earlier rows in --out")
    args = parser.parse_args(argv)
    if args.chunk_size is None:
        args.chunk_size = 4 if args.smoke else 32
    if args.infer_n_res is None:
        args.infer_n_res = list(SMOKE["infer_n_res"] if args.smoke else INFER_N_RES)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = init_distributed("gloo" if args.smoke else None, timeout_s=args.timeout_s)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        raise SystemExit("parallel_scaling: run with 2, 4 or 8 ranks (torchrun --nproc_per_node)")
    control = dist.new_group(backend="gloo",
                             timeout=datetime.timedelta(seconds=args.wait_timeout_s))
    header = {
        "benchmark": "parallel_scaling",
        "device": device_name(device),
        "backend": str(dist.get_backend()),
        "world_size": world,
    }
    results: dict[str, Any] = {**header, "rows": [], "dates": [], "commands": []}
    error = None
    if rank == 0:
        old, error = _load_previous(args, header)
        if old is not None:
            results.update({k: old.get(k, results[k]) for k in ("rows", "dates", "commands")})
    box = [error]
    dist.broadcast_object_list(box, src=0, group=control)
    if box[0] is not None:
        raise SystemExit(f"parallel_scaling: {box[0]}")
    today = datetime.date.today().isoformat()
    results.update({
        "torch": torch.__version__, "triton": triton_version(),
        "cuda": torch.version.cuda, "blocks": None if args.smoke else args.blocks,
        "dates": sorted(set(results["dates"]) | {today}),
        "commands": results["commands"] + [
            f"torchrun --nproc_per_node {world} -m benchmarks.parallel.scaling "
            + " ".join(sys.argv[1:] if argv is None else argv)],
        "references": REFERENCE_NOTES,
    })
    runner = Runner(args, DistContext(rank, world, device, None), control, results)

    if args.only in (None, "train"):
        for shape in args.shapes:
            for layout in _selected(TRAIN_LAYOUTS, args.layouts, world):
                sizes = (SMOKE["train_sizes"] if args.smoke else TRAIN_SIZES)[shape]
                runner.row("train", shape, layout,
                           lambda c, s=shape, lay=layout: train_row(args, device, s, lay, c),
                           {"reps": args.reps, **sizes, "preset": train_preset(args, shape),
                            "overrides": train_overrides(args, layout, device)})
    if args.only in (None, "inference"):
        desc = sorted(args.infer_n_res, reverse=True)
        plan = [(lay, n) for lay in _inference_layouts(args.layouts, world) if lay.ranks > 1
                for n in desc]
        # One GPU last, the smaller size first: the likeliest to fit in memory and in time.
        if args.layouts is None or "single" in args.layouts:
            plan += [(ALL_LAYOUTS["single"], n) for n in sorted(args.infer_n_res)]
        for layout, n_res in plan:
            def fn(c, lay=layout, n=n_res) -> dict:
                if lay.ranks == 1 and args.skip_single_inference:
                    return {"status": "skipped: --skip-single-inference"}
                return inference_row(args, device, n, lay, c)

            runner.row("inference", str(n_res), layout, fn,
                       {"reps": args.infer_reps, "chunk_size": args.chunk_size})
    sync(device)
    dist.barrier(group=control)
    return results


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
