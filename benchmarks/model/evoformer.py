"""One AF2 Evoformer block (af2_initial sizes, c_m 256, c_z 128) in bf16, training mode: forward
and forward+backward median ms and peak memory at the FastFold / ScaleFold shapes.

Weights and inputs in bf16 (not autocast), dropout on, default op backends (``auto``: the Triton
kernels when fold-kernels is installed, the torch reference otherwise; ``--backend torch`` forces
the reference). Each block order is measured: af2, multimer, parallel.

    python -m benchmarks.model.evoformer --out benchmarks/results/model/model_evoformer.json  # CUDA
    python -m benchmarks.model.evoformer --device cpu --tiny                  # CPU smoke test
    python -m benchmarks.model.evoformer --graphs --orders af2 --shapes 128,256 # CUDA graphs

``--graphs`` captures each step (forward; forward + backward with the gradients of the inputs and
parameters as graph outputs) into a CUDA graph after warm-up and times its replay: the kernels'
time without host overhead (benchmarks/common/graphs.py). On CPU the same step runs eagerly.

The JSON goes to ``--out``; a markdown table is written beside it (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
from fold_model import ops
from fold_model.af2 import config
from fold_model.af2.evoformer import make_block

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.cli import device_arg
from benchmarks.common.graphs import capture, grad_body
from benchmarks.common.machine import device_name
from benchmarks.common.results import write_atomic
from benchmarks.common.timing import median_ms

SHAPES = [(128, 256), (512, 384), (512, 512), (1024, 384)]  # (N_seq, N_res)
TINY_SHAPES = [(5, 7), (8, 11)]


def bench_block(order: str, n_seq: int, n_res: int, device: torch.device, dtype: torch.dtype,
                tiny: bool, reps: int, graphs: bool = False) -> dict:
    cfg = config("tiny" if tiny else "af2_initial").evoformer
    torch.manual_seed(0)
    block = make_block(cfg, cfg.c_m, cfg.c_z, order).to(device=device, dtype=dtype).train()
    m = torch.randn(1, n_seq, n_res, cfg.c_m, device=device, dtype=dtype, requires_grad=True)
    z = torch.randn(1, n_res, n_res, cfg.c_z, device=device, dtype=dtype, requires_grad=True)
    msa_mask = torch.ones(1, n_seq, n_res, device=device, dtype=dtype)
    pair_mask = torch.ones(1, n_res, n_res, device=device, dtype=dtype)

    def fwd():
        with torch.no_grad():
            block(m, z, msa_mask, pair_mask)

    def fwd_bwd():
        m_out, z_out = block(m, z, msa_mask, pair_mask)
        (m_out.float().sum() + z_out.float().sum()).backward()

    if graphs:
        def fwd_out():
            with torch.no_grad():
                return block(m, z, msa_mask, pair_mask)

        def loss():
            m_out, z_out = block(m, z, msa_mask, pair_mask)
            return m_out.float().sum() + z_out.float().sum()

        fwd = capture(fwd_out, device)[0]
        fwd_bwd = capture(grad_body(loss, [m, z, *block.parameters()]), device)[0]

    row = {"order": order, "n_seq": n_seq, "n_res": n_res, "dtype": str(dtype),
           "graphs": graphs}
    for name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            row[f"{name}_ms"] = median_ms(fn, device, reps)
            if device.type == "cuda":
                row[f"{name}_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        except torch.cuda.OutOfMemoryError:
            row[f"{name}_ms"] = None
            row[f"{name}_error"] = "out of memory"
        block.zero_grad(set_to_none=True)
        m.grad = z.grad = None
    return row


def to_markdown(rows: list[dict]) -> str:
    lines = ["| order | N_seq | N_res | fwd ms | fwd peak MiB | fwd+bwd ms | fwd+bwd peak MiB |",
             "|---|---|---|---|---|---|---|"]

    def fmt(v):
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    for r in rows:
        lines.append(
            f"| {r['order']} | {r['n_seq']} | {r['n_res']} | {fmt(r.get('fwd_ms'))} | "
            f"{fmt(r.get('fwd_peak_mib'))} | {fmt(r.get('fwd_bwd_ms'))} | "
            f"{fmt(r.get('fwd_bwd_peak_mib'))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny config and shapes (smoke test)")
    parser.add_argument("--orders", default="af2,multimer,parallel")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--backend", default=None, help="force an op backend, e.g. torch")
    parser.add_argument("--graphs", action="store_true",
                        help="time CUDA-graph replays of the step (no host overhead)")
    parser.add_argument("--shapes", default=None,
                        help="N_seq,N_res pairs, e.g. '128,256;512,384' (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args(argv)
    device = device_arg(args.device, "model_evoformer")
    # bf16 on GPU as in the papers; fp32 for the CPU smoke test (bf16 matmul on CPU is slow).
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = TINY_SHAPES if args.tiny else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in pair.split(",")) for pair in args.shapes.split(";")]
    found = ensure_kernels(device, needed=args.backend in (None, "auto", "triton"))
    rows = []
    with ops.use_backend(args.backend) if args.backend else contextlib.nullcontext():
        for order in args.orders.split(","):
            for n_seq, n_res in shapes:
                row = bench_block(order, n_seq, n_res, device, dtype, args.tiny, args.reps,
                                  args.graphs)
                print(json.dumps(row), flush=True)
                rows.append(row)
    meta = {"device": device_name(device),
            "torch": torch.__version__, "backend": args.backend or "auto",
            "graphs": args.graphs, "attention_backends": found}
    if args.out is not None:
        write_atomic(args.out, json.dumps({"meta": meta, "rows": rows}, indent=2))
        write_atomic(
            args.out.with_suffix(".md"),
            f"Evoformer block, {meta['device']}, {dtype}, backend {meta['backend']}"
            f"{', CUDA-graph replay' if args.graphs else ''}\n\n"
            + to_markdown(rows)
        )
    return rows


if __name__ == "__main__":
    main()
