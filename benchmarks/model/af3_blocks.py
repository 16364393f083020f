"""AF3 block benchmark: one Pairformer block and one diffusion transformer block, forward +
backward, training mode, bf16 (weights and inputs), batch 1.

Shapes (AF3 supplement sizes, ``fold_model.af3.config("af3")``): Pairformer block c_s 384, c_z 128,
16 single-attention heads, triangle attention 4 x 32, triangle multiplication 128, dropout 0.25,
at N_token 256, 384, 512, 768; diffusion transformer block c_token 768, c_s 384, 16 heads, pair
bias from c_z 128, at N_token 384 and 768 with 48 samples (and 384 with 16 samples). Masks have
~5% holes. Each row: ``--warmup`` calls, then the median of ``--reps`` timed calls (CUDA events)
and the activation peak of one call (``max_memory_allocated`` minus what was allocated before).

The op backend is chosen with ``--backend`` (``auto``: fold-kernels' Triton EvoAttention and fused
ops where installed; ``torch``: fold-model's reference ops); ``--compare`` runs both in one
process and reports the speed-up. The peer figures (Protenix, Boltz: their plain-PyTorch paths on
an H100) are the ones in ``shared/TARGETS.md``; they are printed beside our numbers as a reference
only, since the peers cannot be installed here: re-measure them in the same process where they
are available. Goals (issue 10): Pairformer at least 3x the faster peer, diffusion transformer
block at least 2x.

    python -m benchmarks.model.af3_blocks --compare \
        --out benchmarks/results/model/model_af3_blocks.json
    python -m benchmarks.model.af3_blocks --device cpu --tiny --out /tmp/af3_blocks.json   # smoke
    python -m benchmarks.model.af3_blocks --compare --graphs --blocks pairformer:256   # graphs

``--graphs`` captures each forward + backward (gradients of the inputs and parameters as graph
outputs) into a CUDA graph after warm-up and times the replay: the kernels without host overhead
(benchmarks/common/graphs.py); on CPU the same step runs eagerly (smoke). The backward starts
from the fp32 loss ``sum_o mean(o^2)`` (its kernels are part of the timed step: about 0.4 ms of the
Pairformer's at 384 tokens), or with ``--upstream random`` from fixed random output gradients
(the block alone).

Results are rewritten atomically after every row (JSON and a markdown table beside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from fold_model import ops

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.blocks import backward, build, upstream_grads
from benchmarks.common.blocks import step as block_step
from benchmarks.common.graphs import capture
from benchmarks.common.machine import device_name
from benchmarks.common.results import write_result
from benchmarks.common.timing import median_ms

# shared/TARGETS.md, H100, bf16, forward + backward ms (faster of Protenix and Boltz).
PEERS_MS = {
    ("pairformer", 256, 1): 15.0, ("pairformer", 384, 1): 25.7,
    ("pairformer", 512, 1): 51.0, ("pairformer", 768, 1): 164.8,
    ("diffusion_transformer", 384, 48): 10.7, ("diffusion_transformer", 768, 48): 30.4,
    ("diffusion_transformer", 384, 16): 4.8,
}


def measure(block: torch.nn.Module, args: tuple, device: torch.device, warmup: int,
            reps: int, graphs: bool = False, upstream: str = "loss") -> dict[str, Any]:
    cuda = device.type == "cuda"
    grads = upstream_grads(block, args) if upstream == "random" else None
    if graphs:  # replay a captured forward + backward; the peak is not measured
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        tensors += list(block.parameters())
        step = capture(lambda: backward(block, args, grads, tensors), device,
                       max(warmup, 2))[0]
    else:
        def step():
            block_step(block, args, grads)
    for _ in range(0 if graphs else warmup):
        step()
    peak = None
    if cuda and not graphs:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return {"ms": median_ms(step, device, reps, warmup=0), "peak_mib": peak}


def rows(tiny: bool) -> list[tuple[str, int, int]]:
    if tiny:
        return [("pairformer", 13, 1), ("pairformer", 20, 1), ("diffusion_transformer", 13, 3)]
    return [("pairformer", 256, 1), ("pairformer", 384, 1), ("pairformer", 512, 1),
            ("pairformer", 768, 1), ("diffusion_transformer", 384, 48),
            ("diffusion_transformer", 768, 48), ("diffusion_transformer", 384, 16)]


def _markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| block | N_token | samples | backend | ms | peak MiB | peer ms | peer / ours |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        peer = r.get("peer_ms")
        ratio = f"{peer / r['ms']:.2f}" if peer and r.get("ms") else "-"
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"
        backend = r["backend"] + (" (graph)" if r.get("graphs") else "")
        backend += ", random dY" if r.get("upstream") == "random" else ""
        lines.append(f"| {r['block']} | {r['n_token']} | {r['samples']} | {backend} | "
                     f"{r.get('ms', float('nan')):.2f} | {peak} | {peer or '-'} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny preset and sizes (CPU smoke test)")
    ap.add_argument("--backend", default="auto", help="op backend: auto, torch, triton")
    ap.add_argument("--compare", action="store_true", help="run --backend and torch side by side")
    ap.add_argument("--dtype", default=None, help="bfloat16 (GPU default) or float32 (CPU)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--graphs", action="store_true",
                    help="time CUDA-graph replays of forward + backward (no host overhead)")
    ap.add_argument("--upstream", choices=["loss", "random"], default="loss",
                    help="backward from the loss sum(mean(o^2)) in fp32 (default), or from fixed "
                         "random output gradients: the block alone, without the loss's kernels")
    ap.add_argument("--blocks", default=None,
                    help="only these rows, e.g. 'pairformer:256,diffusion_transformer:384:48'")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    found = ensure_kernels(device, needed=args.backend in ("auto", "triton"))
    print(f"attention backends: {found}", flush=True)
    backends = [args.backend] + (["torch"] if args.compare and args.backend != "torch" else [])
    results: list[dict[str, Any]] = []
    selected = rows(args.tiny)
    if args.blocks:
        want = [b.split(":") for b in args.blocks.split(",")]
        selected = [(w[0], int(w[1]), int(w[2]) if len(w) > 2 else 1) for w in want]
    for kind, n, samples in selected:
        for backend in backends:
            row: dict[str, Any] = {"block": kind, "n_token": n, "samples": samples,
                                   "backend": backend, "dtype": str(dtype),
                                   "graphs": args.graphs, "upstream": args.upstream,
                                   "device": device_name(device)}
            if not args.tiny:
                row["peer_ms"] = PEERS_MS.get((kind, n, samples))
            try:
                block, inputs = build(kind, n, samples, args.tiny, device, dtype)
                with ops.use_backend(backend):
                    row.update(measure(block, inputs, device, args.warmup, args.reps,
                                       args.graphs, args.upstream))
            except torch.cuda.OutOfMemoryError:
                row["error"] = "OOM"
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.out is not None:
                write_result(args.out, results, _markdown(results), indent=1)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    main()
