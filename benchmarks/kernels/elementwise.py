"""LayerNorm, fused LayerNorm+Linear, SwiGLU and the AF2 gating fusions vs eager and
torch.compile, bf16, on AlphaFold shapes (rows = N_res^2 or N_seq * N_res, hidden 64-384).

Contenders in one process on one GPU: eager (the plain PyTorch reference of each op),
``torch.compile`` of that reference (compiler reset between ops so it never falls back), and the
fold-kernels Triton op. Forward and forward+backward median ms of CUDA-graph replays
(``triton.testing.do_bench_cudagraph``: these ops take microseconds, so timing Python launches
would measure the host, not the GPU; inputs are not flushed from L2 between replays), and each
op's relative error against the eager output.

    python -m benchmarks.kernels.elementwise --out elementwise.json
    python -m benchmarks.kernels.elementwise --md elementwise.json > elementwise.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import merged_rows, write_atomic

BF16 = torch.bfloat16


def _cases():
    """(op name, shape label, builder of the differentiable inputs, extra non-grad inputs)."""

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda") * scale).to(BF16)

    cases = []
    for rows, c, label in [(65536, 64, "template pair 256^2 x 64"),
                           (147456, 128, "pair 384^2 x 128"),
                           (147456, 384, "384^2 x 384")]:
        cases.append(("layer_norm", label, lambda rows=rows, c=c: (
            [rnd(rows, c), rnd(c), rnd(c)], [])))
    for rows, c, n_out, label in [(147456, 128, 512, "pair transition 384^2, 128->512"),
                                  (196608, 256, 1024, "MSA transition 512x384, 256->1024")]:
        cases.append(("layer_norm_linear", label, lambda rows=rows, c=c, n_out=n_out: (
            [rnd(rows, c), rnd(c), rnd(c), rnd(n_out, c, scale=c**-0.5), rnd(n_out)], [])))
    for rows, c, h, label in [(147456, 128, 512, "AF3 pair transition 384^2, 128->2x512"),
                              (65536, 256, 1024, "256^2, 256->2x1024")]:
        cases.append(("swiglu", label, lambda rows=rows, c=c, h=h: (
            [rnd(rows, c), rnd(2 * h, c, scale=c**-0.5), rnd(2 * h)], [])))
    for rows, c, label in [(147456, 128, "pair 384^2 x 128"), (196608, 256, "MSA 512x384 x 256")]:
        cases.append(("bias_sigmoid_gate", label, lambda rows=rows, c=c: (
            [rnd(rows, c), rnd(rows, c), rnd(c)], [])))
    for s, n, c, label in [(384, 384, 128, "pair 384^2 x 128, row-shared mask"),
                           (512, 384, 256, "MSA 512x384 x 256, row-shared mask")]:
        def build(s=s, n=n, c=c):
            keep = (torch.rand(1, n, c, device="cuda") > 0.25).to(BF16) / 0.75
            return [rnd(s, n, c), rnd(s, n, c), rnd(c)], [keep]
        cases.append(("bias_dropout_residual", label, build))
    return cases


def _call(fn, op, grads, extra):
    return fn(*grads, *extra)  # extra: the dropout mask (no gradient)


def measure(fn, op, grads, extra, dy):
    from triton.testing import do_bench, do_bench_cudagraph

    leaves = [t.detach().clone().requires_grad_() for t in grads]

    def fwd():
        return _call(fn, op, leaves, extra)

    def fwd_bwd():
        torch.autograd.backward(_call(fn, op, leaves, extra), dy)

    fwd_bwd()
    out = fwd().detach()
    try:  # the kernels take microseconds: replay a CUDA graph so launch overhead is not timed
        t_fwd = do_bench_cudagraph(fwd, rep=30, return_mode="median")
        t_fb = do_bench_cudagraph(fwd_bwd, rep=30, grad_to_none=leaves, return_mode="median")
        how = "cudagraph"
    except Exception as exc:  # a contender that cannot be captured is timed with events
        print("graph capture failed:", type(exc).__name__, str(exc)[:100])
        torch.cuda.synchronize()
        t_fwd = do_bench(fwd, warmup=10, rep=50, return_mode="median")
        t_fb = do_bench(fwd_bwd, warmup=10, rep=50, grad_to_none=leaves, return_mode="median")
        how = "events"
    return {"fwd_ms": t_fwd, "fwd_bwd_ms": t_fb, "timing": how}, out


def run(out_path, ops=None):
    import fold_kernels
    from fold_kernels import reference

    results = {"device": device_name(), "torch": torch.__version__,
               "triton": triton_version(), "rows": []}
    for op, label, build in _cases():
        if ops and op not in ops:
            continue
        torch.manual_seed(0)
        grads, extra = build()
        eager_fn = getattr(reference, op)
        contenders = {"eager": lambda f=eager_fn: f,
                      "compile": lambda f=eager_fn: torch.compile(f, dynamic=False),
                      "ours": lambda op=op: getattr(fold_kernels, op)}
        row = {"op": op, "shape": label, "results": {}}
        ref_out = None
        dy = None
        for name, make in contenders.items():
            torch._dynamo.reset()
            t0 = time.time()
            try:
                fn = make()
                if dy is None:
                    dy = torch.randn_like(_call(fn, op, grads, extra))
                res, out = measure(fn, op, grads, extra, dy)
                if ref_out is None:
                    ref_out = out
                else:
                    res["err_vs_eager"] = ((out.float() - ref_out.float()).norm()
                                           / ref_out.float().norm()).item()
            except Exception as exc:
                traceback.print_exc(limit=2)
                res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
            res["wall_s"] = round(time.time() - t0, 1)
            row["results"][name] = res
            print(op, label, name, res, flush=True)
        results["rows"].append(row)
        write_atomic(Path(out_path), json.dumps(results, indent=1))
    return results


def to_markdown(files):
    rows, devices = merged_rows(files)
    out = ["# Elementwise / LayerNorm / fused transition kernels (bf16, median ms, CUDA-graph "
           "replays)", "",
           "Device: " + "; ".join(sorted(devices)), "",
           "| op | shape | eager fwd | compile fwd | ours fwd | eager f+b | compile f+b | "
           "ours f+b | fwd vs eager | f+b vs eager | f+b vs compile |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r = row["results"]

        def cell(name, key, r=r):
            x = r.get(name, {})
            return f"{x[key]:.3f}" if key in x else x.get("error", "-")[:25]

        def ratio(a, b, key, r=r):
            xa, xb = r.get(a, {}), r.get(b, {})
            return f"{xa[key] / xb[key]:.2f}x" if key in xa and key in xb else "-"

        out.append(f"| {row['op']} | {row['shape']} | " + " | ".join(
            [cell("eager", "fwd_ms"), cell("compile", "fwd_ms"), cell("ours", "fwd_ms"),
             cell("eager", "fwd_bwd_ms"), cell("compile", "fwd_bwd_ms"),
             cell("ours", "fwd_bwd_ms"), ratio("eager", "ours", "fwd_ms"),
             ratio("eager", "ours", "fwd_bwd_ms"), ratio("compile", "ours", "fwd_bwd_ms")])
            + " |")
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                 "elementwise.json"))
    p.add_argument("--ops", nargs="*")
    p.add_argument("--md", nargs="+")
    args = p.parse_args(argv)
    if args.md:
        sys.stdout.write(to_markdown(args.md))
        return
    run(args.out, args.ops)
    sys.stdout.write(to_markdown([args.out]))


if __name__ == "__main__":
    main()
