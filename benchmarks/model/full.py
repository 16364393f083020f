"""The full AF2 model (``af2_initial``) forward + backward + loss at the initial-training shapes:
N_res 256, N_clust 128, N_extra 1024, 4 templates, 4 recycling passes (3 without gradients, the
last with), per-block activation checkpointing, bf16 autocast (structure module in fp32).

    python -m benchmarks.model.full --out benchmarks/results/model/model_full.json   # CUDA
    python -m benchmarks.model.full --tiny --device cpu                # CPU smoke test (seconds)

Reports the median step time (ms) and peak memory (MiB, CUDA); JSON to ``--out`` and a markdown
line beside it. The batch is synthetic (random sequences, MSA and a random-walk structure run
through fold-data's ground-truth builder) since only the cost is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.loss import AlphaFold2Loss

from benchmarks.common.af2_batch import FULL, TINY, synthetic_batch
from benchmarks.common.cli import device_arg
from benchmarks.common.machine import device_name
from benchmarks.common.results import write_atomic


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny config and shapes (smoke test)")
    parser.add_argument("--order", default="af2", choices=["af2", "multimer", "parallel"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = device_arg(args.device, "model_full")
    sizes = TINY if args.tiny else FULL
    cfg = config("tiny" if args.tiny else "af2_initial", block_order=args.order,
                 checkpoint_blocks=True)
    torch.manual_seed(0)
    model = AlphaFold2(cfg).to(device).train()
    loss_fn = AlphaFold2Loss(cfg.loss)
    batch, truth = synthetic_batch(**sizes, device=device)
    n_params = sum(p.numel() for p in model.parameters())

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            outputs = model(batch)
        loss, _ = loss_fn(outputs, truth)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    loss_value = step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    result = {
        "preset": "tiny" if args.tiny else "af2_initial", "order": args.order, **sizes,
        "params": n_params, "step_ms": statistics.median(times), "loss": loss_value,
        "peak_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                     if device.type == "cuda" else None),
        "device": device_name(device),
        "torch": torch.__version__,
    }
    if not np.isfinite(loss_value):
        raise SystemExit(f"model_full: non-finite loss {loss_value}")
    print(json.dumps(result), flush=True)
    if args.out is not None:
        write_atomic(args.out, json.dumps(result, indent=2))
        peak = "-" if result["peak_mib"] is None else f"{result['peak_mib']:.0f}"
        write_atomic(
            args.out.with_suffix(".md"),
            "| preset | order | N_res | N_clust | N_extra | N_templ | passes | step ms "
            "| peak MiB |\n"
            "|---|---|---|---|---|---|---|---|---|\n"
            f"| {result['preset']} | {args.order} | {sizes['n_res']} | {sizes['n_clust']} | "
            f"{sizes['n_extra']} | {sizes['n_templ']} | {sizes['r']} | "
            f"{result['step_ms']:.1f} | {peak} |\n"
        )
    return result


if __name__ == "__main__":
    main()
