"""Sweep EvoAttention's launch configurations on the model's shapes and layouts.

A development tool for fold-kernels' candidate tables (``tuning._attention_configs``): for each
shape it times every kernel (``fwd``, ``dkdv``, ``dq``, ``dbias``) under each configuration of a
grid wider than the shipped candidates, in two layouts of q/k/v/gate:

* ``contig``: ``[B, R, H, N, D]`` contiguous;
* ``model``: the view fold-model passes, heads of a projection ``[B, R, N, H * D]``
  (``unflatten`` + ``transpose``: rows ``H * D`` apart).

It prints, per kernel, the shipped default, the shipped candidates' best and the sweep's best, in
ms and in TFLOP/s of the tile products (2 products per logit forward, 4 for dK/dV, 3 for dQ and
dbias), and writes JSON with every timing.

    python -m benchmarks.tools.attention_configs tri:384 tri:768 dit:384,48 --out sweep.json

Targets: ``tri:N`` (R = N, H 4, D 32: triangle attention), ``dit:N,S`` (R = S samples, H 16,
D 48: the diffusion transformer), ``single:N`` (R 1, H 16, D 24: Pairformer single attention).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import time
from pathlib import Path

import torch

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.blocks import MASKS, pattern_mask
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import write_atomic

PRODUCTS = {"fwd": 2, "dkdv": 4, "dkdv_atomic": 4, "dkdv_dq": 5, "dkdv_atomic_dq": 5, "dq": 3,
            "dbias": 3}


def shape_of(target: str) -> tuple[int, int, int, int]:
    kind, _, dims = target.partition(":")
    sizes = [int(x) for x in dims.split(",")]
    if kind == "tri":
        return sizes[0], sizes[0], 4, 32
    if kind == "dit":
        return sizes[1], sizes[0], 16, 48
    if kind == "single":
        return 1, sizes[0], 16, 24
    raise SystemExit(f"unknown target {target!r}")


def inputs(r: int, n: int, h: int, d: int, layout: str, mask: str = "holes"):
    """q, k, v, gate, do in ``layout``, a bias ``[1, H, N, N]`` and a key mask ``[1, R, N]``
    of the pattern ``mask`` (``benchmarks.common.blocks.MASKS``)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def heads() -> torch.Tensor:
        if layout == "contig":
            return torch.randn(1, r, h, n, d, device="cuda", generator=g).bfloat16()
        x = torch.randn(1, r, n, h * d, device="cuda", generator=g).bfloat16()
        return x.unflatten(-1, (h, d)).transpose(-2, -3)  # [1, R, H, N, D] view

    q, k, v, gate, do = heads(), heads(), heads(), heads(), heads()
    bias = torch.randn(1, h, n, n, device="cuda", generator=g).bfloat16()
    keep = pattern_mask((1, r, n), g, mask, "cuda")
    return q, k, v, gate, bias, keep, do


def grid(kernel: str, rows_wanted: tuple[int, ...] = (2, 1)) -> list:
    """The sweep's configurations: one or two rows per program; dK/dV also key-major tiles."""
    from fold_kernels.tuning import Config

    dkdv = kernel.startswith("dkdv")
    out = []
    for bm, bn, w, s, rows, t in itertools.product((32, 64, 128), (32, 64, 128), (4, 8),
                                                   (3, 2), (2, 1), (False, True)):
        if (kernel == "dbias" and rows > 1) or (not dkdv and t):
            continue
        if rows not in rows_wanted:
            continue
        if bm * bn > 128 * 64 or (w == 8 and bm * bn < 64 * 64):
            continue
        out.append(Config(bm, bn, w, s, rows=rows, transpose=t))
    return out


def sweep(target: str, layout: str, budget_s: float, kernels: list[str] | None = None,
          rows_wanted: tuple[int, ...] = (2, 1), mask: str = "holes") -> dict:
    from fold_kernels import tuning
    from triton.testing import do_bench

    ea = importlib.import_module("fold_kernels.evo_attention")  # the module, not the function

    r, n, h, d = shape_of(target)
    q, k, v, gate, bias, keep, do = inputs(r, n, h, d, layout, mask)
    logits = r * h * n * n
    lp = ea._Launch(q, bias, keep, d ** -0.5)
    flat = (lp.B, lp.R, lp.H, lp.N, lp.D)
    q_, k_, v_, g_ = lp.set_layout(*(t.reshape(flat) for t in (q, k, v, gate)))
    captured = {}

    # one forward and backward with tuning.pick intercepted: each kernel's launch function is
    # kept (and run once with the default configuration)
    real_pick = tuning.pick

    def grab(name, key, cands, launch):
        captured[name.removeprefix("evo_")] = launch
        return cands[0]

    tuning.pick = grab
    try:
        _, o_pre, lse = ea._forward(q_, k_, v_, g_, None, lp)
        ea._backward(do.reshape(flat), q_, k_, v_, g_, None, o_pre, lse, lp, need_dbias=True)
    finally:
        tuning.pick = real_pick
    result = {"target": target, "layout": layout, "mask": mask, "R": r, "N": n, "H": h, "D": d,
              "kernels": {}}
    if kernels:
        missing = set(kernels) - set(captured)
        if missing:
            raise SystemExit(f"--kernels: {sorted(missing)} did not run for {target} "
                             f"(ran: {sorted(captured)})")
        captured = {k: f for k, f in captured.items() if k in kernels}
    for kernel, launch in captured.items():
        t_end = time.time() + budget_s / len(captured)
        shipped = tuning.attention_configs(kernel, tuning.arch(), d)
        flops = 2 * PRODUCTS[kernel] * logits * d
        rows = []
        for cfg in list(dict.fromkeys(shipped + grid(kernel, rows_wanted))):
            if time.time() > t_end:
                break
            try:
                ms = do_bench(lambda cfg=cfg, launch=launch: launch(cfg), warmup=3, rep=10,
                              return_mode="median")
            except Exception as e:  # out of shared memory / registers
                ms = None
                err = type(e).__name__
            rows.append({"cfg": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages,
                                 cfg.rows, *(["key"] if cfg.transpose else [])],
                         "shipped": cfg in shipped, "ms": ms,
                         **({} if ms is not None else {"error": err})})
        ok = [x for x in rows if x["ms"] is not None]
        best = min(ok, key=lambda x: x["ms"])
        best_shipped = min((x for x in ok if x["shipped"]), key=lambda x: x["ms"])
        default = ok[0]
        result["kernels"][kernel] = {"flops": flops, "rows": rows, "best": best,
                                     "best_shipped": best_shipped, "default": default}
        print(f"{target} {layout} {mask} {kernel:5s} default {default['cfg']} "
              f"{default['ms']:.3f} ms, shipped best {best_shipped['cfg']} "
              f"{best_shipped['ms']:.3f} ms, sweep best "
              f"{best['cfg']} {best['ms']:.3f} ms = {flops / best['ms'] / 1e9:.0f} TFLOP/s "
              f"({len(ok)} configs)", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--layouts", nargs="+", default=["model", "contig"])
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="per target and layout, split evenly over the kernels")
    ap.add_argument("--kernels", nargs="+", default=None,
                    help="only these kernels (fwd, dkdv_atomic, dq, ...; default: all that ran)")
    ap.add_argument("--rows", nargs="*", type=int, default=[2, 1],
                    help="rows per program of the sweep's grid (the shipped candidates always "
                         "run; none: only them)")
    ap.add_argument("--mask", default="holes", choices=MASKS,
                    help="the key mask's pattern: ~5%% random holes, a padded input's, none")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ensure_kernels("cuda")
    meta = {"device": device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "triton": triton_version()}
    results = []
    for target in args.targets:
        for layout in args.layouts:
            results.append(sweep(target, layout, args.budget_s, args.kernels,
                                 tuple(args.rows), args.mask))
            if args.out:
                write_atomic(args.out, json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
