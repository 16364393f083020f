"""AutoChunk vs no chunking vs expert chunking: Evoformer inference (FastFold section 6.4).

An AF2 Evoformer stack (default sizes of ``EvoformerConfig``: c_m 256, c_z 128, ...; ``--blocks``
blocks, default 2: the peak of a stack is the peak of one block plus the two streams, and time
per block is what matters) in bf16, eval mode, ``torch.no_grad()``, N_seq 128, masks with holes.
For each N_res (512, 1024, 2048, 3072, 4096):

* (a) ``none``: no chunking;
* (b) ``manual64``: fold-model's expert chunking, ``set_chunk_size(64)``;
* (c) ``auto_equal``: ``fold_chunk.autochunk`` with the budget set to (b)'s measured peak;
* (d) ``auto_min``: ``fold_chunk.autochunk`` with the smallest budget it can meet
  (``smallest_reachable_peak`` with ``--min-chunk``, default 16).

Peak memory is the activation peak: ``torch.cuda.max_memory_allocated()`` during the call minus
what was allocated before it (weights, inputs). Time is the median of ``--reps`` calls after one
warm-up, CUDA events. A configuration that runs out of memory is recorded as ``"OOM"``. AutoChunk
planning time is reported apart (planning runs once per shape). Goals (from the issue): (d) at most
10% of (a)'s peak; (c) at least 1.15x (b)'s speed; AutoChunk within 5% of (a)'s speed where (a)
fits. Outputs of (b), (c), (d) are compared with (a) (bf16: relative norm error ~1e-2).

    python benchmarks/chunk_evoformer.py --out benchmarks/results/chunk_evoformer.json  # CUDA
    python benchmarks/chunk_evoformer.py --device cpu --small --out /tmp/chunk.json    # smoke

Op backend: ``--backend torch`` (default) runs (a)-(d) on fold-model's PyTorch reference ops.
That is like for like: the fold-model op registry hands the reference implementation to
``torch.fx`` while tracing, so AutoChunk's generated code always runs reference ops;
``--backend auto`` lets (a) and (b) use fold-kernels' Triton kernels where installed.

On CPU the peak is measured with ``fold_chunk.measure_peak_memory`` (live tensor bytes). The
JSON goes to ``--out``; a markdown table is written beside it (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import fold_chunk as fc
import torch
from fold_model import ops
from fold_model.af2.config import EvoformerConfig
from fold_model.af2.evoformer import EvoformerStack

N_RES = [512, 1024, 2048, 3072, 4096]
SMALL_N_RES = [24, 37]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_measured(fn, device: torch.device, reps: int) -> tuple[float, int, object]:
    """(median ms, activation peak bytes, output) of ``fn()``."""
    with torch.no_grad():
        if device.type == "cuda":
            out = fn()  # warm-up
            del out
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            out = fn()
            _sync(device)
            peak = torch.cuda.max_memory_allocated(device) - before
            times = []
            for _ in range(reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                _sync(device)
                times.append(start.elapsed_time(end))
        else:
            peak = fc.measure_peak_memory(fn)
            out = fn()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), peak, out


def _rel_err(out, ref) -> float:
    errs = [((o.float() - r.float()).norm() / r.float().norm()).item() for o, r in zip(out, ref)]
    return max(errs)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


def run_shape(stack: EvoformerStack, n_seq: int, n_res: int, device: torch.device,
              dtype: torch.dtype, reps: int, min_chunk: int) -> dict:
    cfg_m, cfg_z = stack.blocks[0].msa_att_row.layer_norm_m.weight.shape[0], \
        stack.blocks[0].tri_mul_out.layer_norm_in.weight.shape[0]
    gen = torch.Generator().manual_seed(n_res)
    m = torch.randn(n_seq, n_res, cfg_m, generator=gen).to(device, dtype)
    z = torch.randn(n_res, n_res, cfg_z, generator=gen).to(device, dtype)
    msa_mask = (torch.rand(n_seq, n_res, generator=gen) > 0.1).to(device, dtype)
    pair_mask = (torch.rand(n_res, n_res, generator=gen) > 0.1).to(device, dtype)
    args = (m, z, msa_mask, pair_mask)
    row: dict = {"n_seq": n_seq, "n_res": n_res}
    ref = None

    def measure(name: str, fn) -> None:
        nonlocal ref
        try:
            ms, peak, out = _run_measured(fn, device, reps)
        except RuntimeError as exc:
            if not _is_oom(exc):
                raise
            row[name] = "OOM"
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return
        row[name] = {"ms": ms, "peak_bytes": peak}
        if ref is None and name == "none":
            ref = out
        elif ref is not None:
            row[name]["rel_err_vs_none"] = _rel_err(out, ref)
        del out
        if device.type == "cuda":
            torch.cuda.empty_cache()

    stack.set_chunk_size(None)
    measure("none", lambda: stack(*args))
    stack.set_chunk_size(64)
    measure("manual64", lambda: stack(*args))
    stack.set_chunk_size(None)

    def measure_auto(name: str, budget: int, plan_s: float = 0.0) -> None:
        t0 = time.perf_counter()
        try:
            chunked = fc.autochunk(stack, args, budget, min_chunk=min_chunk)
        except fc.MemoryBudgetError as exc:
            row[name] = {"error": str(exc)}
            return
        plan_s += time.perf_counter() - t0
        measure(name, lambda: chunked(*args))
        if isinstance(row[name], dict):
            row[name].update(budget_bytes=budget, plan_s=plan_s,
                             n_regions=len(chunked.report.regions),
                             estimated_peak_bytes=chunked.report.simulated_peak_after,
                             report=str(chunked.report))

    if isinstance(row["manual64"], dict):
        measure_auto("auto_equal", row["manual64"]["peak_bytes"])
    t0 = time.perf_counter()
    smallest = fc.smallest_reachable_peak(stack, args, min_chunk=min_chunk)
    measure_auto("auto_min", smallest, time.perf_counter() - t0)
    _goals(row)
    return row


def _goals(row: dict) -> None:
    a, b, c, d = (row.get(k) for k in ("none", "manual64", "auto_equal", "auto_min"))
    ok = lambda x: isinstance(x, dict) and "ms" in x  # noqa: E731
    goals: dict = {}
    if ok(a) and ok(d):
        goals["auto_min_peak_over_none"] = d["peak_bytes"] / a["peak_bytes"]
        goals["auto_min_peak_at_most_10pct"] = goals["auto_min_peak_over_none"] <= 0.10
    if ok(b) and ok(c):
        goals["auto_equal_speedup_over_manual64"] = b["ms"] / c["ms"]
        goals["auto_equal_at_least_1.15x"] = goals["auto_equal_speedup_over_manual64"] >= 1.15
        goals["auto_equal_peak_over_manual64"] = c["peak_bytes"] / b["peak_bytes"]
    if ok(a) and ok(c):
        goals["auto_equal_time_over_none"] = c["ms"] / a["ms"]
        goals["auto_within_5pct_of_none"] = goals["auto_equal_time_over_none"] <= 1.05
    row["goals"] = goals


def _fmt(x) -> str:
    if not isinstance(x, dict):
        return str(x)
    if "ms" not in x:
        return "error"
    return f"{x['ms']:.1f} ms / {x['peak_bytes'] / 2**20:.1f} MiB"


def write_markdown(result: dict, path: Path) -> None:
    lines = [
        f"# AutoChunk, Evoformer inference ({result['device_name']}, {result['dtype']}, "
        f"{result['blocks']} blocks, N_seq {result['n_seq']})",
        "",
        "| N_res | (a) none | (b) manual 64 | (c) auto, budget (b) | (d) auto, min budget |"
        " (d)/(a) peak | (b)/(c) speed | (c)/(a) time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        g = row["goals"]
        cells = [str(row["n_res"])] + [_fmt(row.get(k)) for k in
                                       ("none", "manual64", "auto_equal", "auto_min")]
        for key in ("auto_min_peak_over_none", "auto_equal_speedup_over_manual64",
                    "auto_equal_time_over_none"):
            cells.append(f"{g[key]:.3f}" if key in g else "-")
        lines.append("| " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--n-res", type=int, nargs="*", default=None)
    parser.add_argument("--n-seq", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--min-chunk", type=int, default=None)
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp32"])
    parser.add_argument("--backend", default="torch", help="fold-model op backend (see doc)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/chunk_evoformer.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    if args.small:
        cfg = EvoformerConfig(c_m=16, c_z=8, c_s=8, no_blocks=args.blocks,
                                     c_hidden_msa_att=4, no_heads_msa=2, c_hidden_opm=4,
                                     c_hidden_mul=8, c_hidden_pair_att=4, no_heads_pair=2,
                                     transition_n=2)
        n_res, n_seq = args.n_res or SMALL_N_RES, args.n_seq or 8
        min_chunk, dtype_name = args.min_chunk or 2, args.dtype or "fp32"
    else:
        cfg = EvoformerConfig(no_blocks=args.blocks)
        n_res, n_seq = args.n_res or N_RES, args.n_seq or 128
        min_chunk, dtype_name = args.min_chunk or 16, args.dtype or "bf16"
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.manual_seed(0)
    stack = EvoformerStack(cfg).to(device=device, dtype=dtype).eval()

    rows = []
    for n in n_res:
        with ops.use_backend(args.backend):
            row = run_shape(stack, n_seq, n, device, dtype, args.reps, min_chunk)
        print(json.dumps(row["goals"] | {"n_res": n}), flush=True)
        rows.append(row)
    result = {
        "benchmark": "chunk_evoformer",
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": dtype_name,
        "blocks": args.blocks,
        "backend": args.backend,
        "n_seq": n_seq,
        "min_chunk": min_chunk,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    write_markdown(result, args.out.with_suffix(".md"))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
