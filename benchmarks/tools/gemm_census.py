"""Every GEMM of fold's Pairformer training step, each timed alone against its byte/FLOP floor.

A development tool. It builds the block as ``benchmarks.model.peers`` does (bf16, training, fixed
random output gradients), records every ``mm`` / ``bmm`` / ``addmm`` of one forward+backward
through a ``TorchDispatchMode`` (shapes, strides, the fold source line that issued it), then
times each distinct call alone: a CUDA graph of ``--reps`` back-to-back calls, median of
``--rounds`` replays (on CPU: one eager call, for the smoke test). Beside it the same product
computed transposed (``B^T A^T``: what cuBLAS picks for the other orientation) and the floor
``max(FLOPs / 700 TFLOP/s, bytes / 4.3 TB/s)`` (H200 bf16 dense, measured copy bandwidth).

That is how the bias epilogue of triangle attention's output projection was found: 17.8 us
against 9.4 us for the plain GEMM at 256 tokens on an H200.

    python -m benchmarks.tools.gemm_census --n 256 384 512 --out results/tools/gemm_census.json
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import peer_blocks as pb
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.machine import versions
from benchmarks.common.results import write_result

OPS = ("mm", "bmm", "addmm")
PEAK_FLOPS, PEAK_BYTES = 700e12, 4.3e12


def _meta(t):
    return (tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))


class GemmLog(TorchDispatchMode):
    """Counts each distinct GEMM call: (op, operands' (shape, strides, dtype), kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple, list] = collections.OrderedDict()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in OPS:
            sites = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                     for f in traceback.extract_stack()
                     if "fold_" in f.filename and "dispatch" not in f.filename][-2:]
            key = (name, tuple(_meta(a) for a in args if isinstance(a, torch.Tensor)),
                   tuple(sorted((kwargs or {}).items())))
            entry = self.calls.setdefault(key, [0, " < ".join(reversed(sites))])
            entry[0] += 1
        return func(*args, **(kwargs or {}))


def _operand(meta, device) -> torch.Tensor:
    shape, stride, dtype = meta
    span = 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
    return torch.randn(span, device=device, dtype=getattr(torch, dtype)).as_strided(shape, stride)


def _time_us(fn, device: torch.device, reps: int, rounds: int) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        fn()  # warm-up (cuBLAS's workspace, heuristics) outside the capture
        with torch.cuda.graph(graph, stream=side):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream(device).wait_stream(side)
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return sorted(times)[len(times) // 2]


def _products(name: str, ops: list[torch.Tensor], kwargs: dict):
    """``(call, transposed call or None, FLOPs, bytes)`` of one recorded GEMM."""
    if name == "addmm":
        c, a, b = ops
        return (lambda: torch.addmm(c, a, b, **kwargs), None,
                2 * a.shape[0] * b.shape[1] * a.shape[1],
                2 * (a.numel() + b.numel() + a.shape[0] * b.shape[1]))
    a, b = ops
    if name == "mm":
        flops = 2 * a.shape[0] * b.shape[1] * a.shape[1]
        return (lambda: torch.mm(a, b), lambda: torch.mm(b.t(), a.t()), flops,
                2 * (a.numel() + b.numel() + a.shape[0] * b.shape[1]))
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[2] * a.shape[2]
    return (lambda: torch.bmm(a, b), lambda: torch.bmm(b.mT, a.mT), flops,
            2 * (a.numel() + b.numel() + a.shape[0] * a.shape[1] * b.shape[2]))


def census(n: int, device: torch.device, reps: int, rounds: int) -> dict:
    """The GEMMs of one Pairformer step at ``n`` tokens, each timed (see the module doc)."""
    tiny = device.type != "cuda"
    sizes = pb.fold_sizes(tiny)
    shape = pb.Shape("pairformer", n)
    case = pb.build_fold(shape, sizes, pb.base_inputs(shape, sizes), device, "bf16",
                         tiny)
    with torch.no_grad():
        grads = pb.output_grads(case.forward())
    wrt = list(case.inputs) + case.params

    def step():
        return torch.autograd.grad(case.forward(), wrt, grads, allow_unused=True)

    for _ in range(2):
        step()
    log = GemmLog()
    with log:
        step()
    gemms = []
    for (name, metas, kw), (count, site) in log.calls.items():
        ops = [_operand(m, device) for m in metas]
        call, transposed, flops, nbytes = _products(name, ops, dict(kw))
        us = _time_us(call, device, reps, rounds)
        gemms.append({
            "op": name, "operands": [[list(s), list(st), dt] for s, st, dt in metas],
            "kwargs": dict(kw), "count": count, "site": site, "us": us,
            "transposed_us": None if transposed is None else _time_us(transposed, device, reps,
                                                                      rounds),
            "floor_us": max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e6,
            "tflops": flops / us / 1e6, "tbps": nbytes / us / 1e6})
    total = sum(g["count"] * g["us"] for g in gemms)
    floor = sum(g["count"] * g["floor_us"] for g in gemms)
    return {"n_token": n, "calls": sum(g["count"] for g in gemms), "total_us": total,
            "floor_us": floor, "gemms": gemms}


def markdown(meta: dict, rows: list[dict]) -> str:
    out = [f"GEMMs of fold's Pairformer training step, each alone, {meta['device']}, "
           f"{meta['date']}; torch {meta['torch']}, triton {meta['triton']}. A CUDA graph of "
           f"{meta['reps']} calls, median of {meta['rounds']} replays; floor: max(FLOPs / 700 "
           f"TFLOP/s, bytes / 4.3 TB/s).", ""]
    for row in rows:
        out += [f"## {row['n_token']} tokens: {row['calls']} calls, {row['total_us']:.0f} us "
                f"(floor {row['floor_us']:.0f} us)", "",
                "| op | operands (shape, strides) | calls | us | transposed us | floor us | "
                "TB/s | site |", "|---|---|---|---|---|---|---|---|"]
        for g in row["gemms"]:
            operands = " ".join(f"{tuple(s)}:{tuple(st)}" for s, st, _ in g["operands"])
            tr = "-" if g["transposed_us"] is None else f"{g['transposed_us']:.1f}"
            out.append(f"| {g['op']} | {operands} | {g['count']} | {g['us']:.1f} | {tr} | "
                       f"{g['floor_us']:.1f} | {g['tbps']:.2f} | {g['site']} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[256, 384, 512])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        ensure_kernels(device)
    rows = [census(n, device, args.reps, args.rounds) for n in args.n]
    meta = {**versions(device), "reps": args.reps, "rounds": args.rounds}
    write_result(args.out, {**meta, "rows": rows}, markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
