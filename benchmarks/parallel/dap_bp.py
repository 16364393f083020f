"""DAP-2, DAP-2 + DAO and BP-2 against one GPU, in one session (FastFold sections 4.2, 5.1, 6.2;
Parallel Evoformer section 4.2; HelixFold hybrid parallelism).

    torchrun --nproc_per_node 2 -m benchmarks.parallel.dap_bp \
        --out benchmarks/results/parallel/parallel_dap_bp.json
    torchrun --nproc_per_node 2 -m benchmarks.parallel.dap_bp --smoke --out /tmp/s.json  # CPU

Workloads (bf16 autocast, per-block activation checkpointing in training, as in AF2 training):

* ``evoformer``: Evoformer stack (48 blocks) forward + backward + gradient sync, at the
  initial-training shapes (N_res 256, N_seq 128) and the fine-tuning shapes (384, 512);
* the whole training step is not here: ``benchmarks.parallel.scaling``'s ``train`` workload
  times ``fold_train.Trainer``'s steps (the steps of ``fold-train train``) with the Trainer
  applying DAP / DAO / BP itself (an earlier ``train_step`` section here ran a private copy of a
  training step);
* ``inference``: Evoformer stack forward without gradients at N_res 2048 and 3072 (N_seq 128):
  time and peak memory per GPU, one GPU vs DAP-2 (FastFold 6.2);
* ``volume``: the bytes each rank sends per Evoformer block (forward + backward), counted from
  the collectives issued, next to FastFold Table 3 / HelixFold Table 4; and the collectives per
  block of the timed training workload (with the recomputation of checkpointed blocks).

Modes: ``single`` (rank 0 alone; the other ranks wait), ``dap2`` (synchronous all-to-alls),
``dap2_dao`` (Duality Async Operations on), ``bp2`` (Parallel Evoformer order; its one-GPU
baseline ``single_parallel`` uses the same order). A mode that runs out of memory is recorded as
``"OOM"``. Results: JSON to ``--out`` and a markdown table beside it (rank 0 writes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fold_model.af2 import config
from fold_model.af2.evoformer import EvoformerStack
from fold_model.seams import IDENTITY_COMM
from fold_parallel import (
    Collectives,
    DapComm,
    enable_bp,
    enable_dap,
    init_distributed,
    sync_gradients,
)
from fold_parallel.volume import CommRecorder, fastfold_table3

from benchmarks.common.machine import device_name
from benchmarks.common.parallel import evoformer_inputs as _evoformer_inputs
from benchmarks.common.parallel import guard_oom as _guard_oom
from benchmarks.common.parallel import has_branches
from benchmarks.common.parallel import timed as _timed
from benchmarks.common.results import write_result

TRAIN_SHAPES = {"initial": (256, 128), "finetune": (384, 512)}  # (N_res, N_seq)
INFER_N_RES = (2048, 3072)
SMOKE = {
    "train_shapes": {"initial": (13, 6), "finetune": (15, 8)},
    "infer_n_res": (21,),
    "infer_seq": 4,
}
MODES = ("single", "single_parallel", "dap2", "dap2_dao", "bp2")


def _order(mode: str) -> str:
    return "parallel" if mode in ("bp2", "single_parallel") else "af2"


def _parallelize(module: torch.nn.Module, mode: str, stacks: list[torch.nn.Module]) -> None:
    """Put ``stacks`` (submodules of ``module``) under the mode's parallelism."""
    if mode in ("dap2", "dap2_dao"):
        dao = mode == "dap2_dao"
        comm = DapComm(None, overlap_forward=dao, overlap_backward=dao)
        for s in stacks:
            enable_dap(s, comm, check_shapes=False)
    elif mode == "bp2":
        coll = Collectives(None, name="BP group")
        for s in stacks:
            if has_branches(s):
                enable_bp(s, coll)


def _run_mode(mode: str, build_and_time, device: torch.device) -> Any:
    """Run one mode on the ranks it needs; every rank returns rank 0's result."""
    rank = dist.get_rank()
    result: Any = None
    if mode.startswith("single"):
        if rank == 0:
            result = _guard_oom(lambda: build_and_time(mode), device)
    else:
        result = _guard_oom(lambda: build_and_time(mode), device)
    box = [result]
    dist.broadcast_object_list(box, src=0)
    dist.barrier()
    return box[0]


def bench_evoformer(args, device, shapes) -> dict:
    out: dict[str, Any] = {}
    for name, (n_res, n_seq) in shapes.items():
        def build_and_time(mode: str, n_res=n_res, n_seq=n_seq) -> dict:
            cfg = _cfg(args).evoformer
            torch.manual_seed(0)
            stack = EvoformerStack(cfg, _order(mode), checkpoint_blocks=True).to(device).train()
            _parallelize(stack, mode, [stack])
            inputs = _evoformer_inputs(cfg, n_res, n_seq, device, grad=True)

            def step() -> None:
                with torch.autocast(device.type, dtype=torch.bfloat16,
                                    enabled=device.type == "cuda"):
                    m, z, s = stack(*inputs)
                (m.float().mean() + z.float().mean() + s.float().mean()).backward()
                if not mode.startswith("single"):
                    sync_gradients(stack)
                stack.zero_grad(set_to_none=True)

            ms, peak, host_ms, syncs = _timed(step, device, args.reps)
            return {"ms": ms, "peak_mib": peak, "host_ms": host_ms, "host_syncs": syncs}

        out[name] = {mode: _run_mode(mode, build_and_time, device) for mode in MODES}
    return out


def bench_inference(args, device, n_res_list, n_seq: int) -> dict:
    out: dict[str, Any] = {}
    for n_res in n_res_list:
        def build_and_time(mode: str, n_res=n_res) -> dict:
            cfg = _cfg(args).evoformer
            torch.manual_seed(0)
            stack = EvoformerStack(cfg, "af2").to(device).eval()
            if args.chunk_size:
                stack.set_chunk_size(args.chunk_size)
            _parallelize(stack, mode, [stack])
            inputs = _evoformer_inputs(cfg, n_res, n_seq, device, grad=False)

            def step() -> None:
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16,
                                                     enabled=device.type == "cuda"):
                    stack(*inputs)

            ms, peak, host_ms, syncs = _timed(step, device, max(1, args.reps // 2))
            return {"ms": ms, "peak_mib": peak, "host_ms": host_ms, "host_syncs": syncs}

        out[str(n_res)] = {
            mode: _run_mode(mode, build_and_time, device) for mode in ("single", "dap2_dao")
        }
    return out


def bench_volume(args, device, shapes) -> dict:
    """Bytes sent per rank for one Evoformer block, forward + backward (bf16 autocast)."""
    out: dict[str, Any] = {}
    for name, (n_res, n_seq) in shapes.items():
        row: dict[str, Any] = {}
        for mode in ("dap2", "bp2"):
            cfg = _cfg(args).evoformer
            cfg.no_blocks = 1
            stack = EvoformerStack(cfg, _order(mode)).to(device).eval()
            _parallelize(stack, mode, [stack])
            rec = _recorded_step(stack, cfg, n_res, n_seq, device)
            # The stack's entry/exit (gather of m and z, and their backward) is not per block.
            row[mode] = {"calls": rec.counts(), "sent_mib": {
                k: v / 2**20 for k, v in rec.sent_by_op().items()}}
            stack.set_comm(IDENTITY_COMM)
        row["train_calls_per_block"] = _train_calls(args, device, n_res, n_seq)
        p = dist.get_world_size()
        bytes_per = 2 if device.type == "cuda" else 4
        k_pair = n_res * n_res * cfg.c_z * bytes_per
        row["fastfold_table3_mib_with_K_pair"] = {
            k: v / 2**20 for k, v in fastfold_table3(k_pair, p).items()}
        out[name] = row
    return out


def _recorded_step(stack, cfg, n_res: int, n_seq: int, device) -> CommRecorder:
    """The collectives of one forward (bf16 autocast on CUDA) + backward of ``stack``."""
    inputs = _evoformer_inputs(cfg, n_res, n_seq, device, grad=True)
    with CommRecorder() as rec:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            m, z, s = stack(*inputs)
        (m.float().mean() + z.float().mean() + s.float().mean()).backward()
    return rec


def _train_calls(args, device, n_res: int, n_seq: int) -> dict:
    """Collectives per block as the timed ``evoformer`` workload issues them (training mode,
    per-block checkpointing: forward, recomputation in backward, backward), from two blocks minus
    one so that the stack's entry/exit gathers cancel."""
    per_mode: dict[str, Any] = {}
    for mode in ("dap2", "dap2_dao", "bp2"):
        counts = []
        for blocks in (1, 2):
            cfg = _cfg(args).evoformer
            cfg.no_blocks = blocks
            torch.manual_seed(0)
            stack = EvoformerStack(cfg, _order(mode), checkpoint_blocks=True).to(device).train()
            _parallelize(stack, mode, [stack])
            rec = _recorded_step(stack, cfg, n_res, n_seq, device)
            counts.append(rec.counts())
            stack.set_comm(IDENTITY_COMM)
        ops = set(counts[0]) | set(counts[1])
        per_mode[mode] = {op: counts[1].get(op, 0) - counts[0].get(op, 0) for op in sorted(ops)}
    return per_mode


def _cfg(args, **overrides):
    cfg = config("tiny" if args.smoke else "af2_initial", **overrides)
    if not args.smoke and args.blocks:
        cfg.evoformer.no_blocks = args.blocks
    return cfg


def _ratios(section: dict) -> None:
    """Speedups over the right one-GPU baseline, added in place."""
    for row in section.values():
        for mode, res in list(row.items()):
            base = row.get("single_parallel" if mode == "bp2" else "single")
            if isinstance(res, dict) and isinstance(base, dict) and not mode.startswith("single"):
                res["speedup_vs_1gpu"] = base["ms"] / res["ms"]


def _markdown(results: dict) -> str:
    lines = [f"# DAP / DAO / BP on {results['device']} x {results['world_size']}", ""]
    for section in ("evoformer", "inference"):
        lines += [f"## {section}", "",
                  "| shape | mode | ms | peak MiB | speedup vs 1 GPU | host ms | host syncs |",
                  "|---|---|---|---|---|---|---|"]
        for shape, row in results[section].items():
            for mode, res in row.items():
                if isinstance(res, dict):
                    peak = "-" if res["peak_mib"] is None else f"{res['peak_mib']:.0f}"
                    sp = f"{res['speedup_vs_1gpu']:.2f}" if "speedup_vs_1gpu" in res else "-"
                    host = f"{res['host_ms']:.1f}" if "host_ms" in res else "-"
                    syncs = res.get("host_syncs")
                    lines.append(f"| {shape} | {mode} | {res['ms']:.1f} | {peak} | {sp} | {host} "
                                 f"| {'-' if syncs is None else syncs} |")
                else:
                    lines.append(f"| {shape} | {mode} | {res} | - | - | - | - |")
        lines.append("")
    lines += ["## communication per Evoformer block (fwd + bwd, per rank)", "",
              "```", json.dumps(results["volume"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, CPU gloo")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=48, help="Evoformer blocks")
    parser.add_argument("--chunk-size", type=int, default=None, help="inference chunking")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["evoformer", "inference", "volume"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = init_distributed("gloo" if args.smoke else None)
    if dist.get_world_size() != 2:
        raise SystemExit("parallel_dap_bp: run with 2 ranks (torchrun --nproc_per_node 2)")
    shapes = SMOKE["train_shapes"] if args.smoke else TRAIN_SHAPES
    results: dict[str, Any] = {
        "device": device_name(device),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "torch": torch.__version__,
        "blocks": None if args.smoke else args.blocks,
    }
    results["evoformer"] = {} if "evoformer" in args.skip else bench_evoformer(args, device, shapes)
    n_res_list = SMOKE["infer_n_res"] if args.smoke else INFER_N_RES
    n_seq = SMOKE["infer_seq"] if args.smoke else 128
    results["inference"] = (
        {} if "inference" in args.skip else bench_inference(args, device, n_res_list, n_seq))
    results["volume"] = {} if "volume" in args.skip else bench_volume(args, device, shapes)
    for section in ("evoformer", "inference"):
        _ratios(results[section])
    if dist.get_rank() == 0:
        print(json.dumps(results, indent=1), flush=True)
        if args.out is not None:
            write_result(args.out, results, _markdown(results), indent=2)
    return results


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
