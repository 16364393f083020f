"""Host microseconds per launch on a GPU: where an eager fold block's host time goes.

A development tool (GPU). Each row launches one small operation many times back to back and
reports the host time per call (the device work is tiny, so the host is the bottleneck), in
one process:

* ``torch.add`` and ``F.layer_norm``: PyTorch's own eager cost per op, for scale;
* one Triton kernel (fold-kernels' LayerNorm forward) launched through ``kernel[grid](...)``
  (Triton's JIT path: argument binding, specialization key, cache lookup) and through
  :mod:`fold_kernels.launch` (the compiled handle, keyed by fold's own specialization key);
* fold-kernels' wrappers (``layer_norm``, ``evo_attention``) called directly, through
  fold-model's registry (``ops.*``: ``resolve`` + ``supports``), without and with autograd.

    python -m benchmarks.kernels.launch_overhead --calls 300 --out /tmp/launch.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import write_atomic


def per_call_us(fn, calls: int, reps: int = 7) -> float:
    """Best-of-``reps`` host microseconds per call of ``fn`` (synchronised between rounds)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
        torch.cuda.synchronize()
        best = min(best, dt / calls * 1e6)
    return best


def cases(device: torch.device):
    import importlib

    ea = importlib.import_module("fold_kernels.evo_attention")
    ln = importlib.import_module("fold_kernels.layer_norm")  # the module, not the function
    from fold_model import ops

    dt = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, grad=False):
        return torch.randn(*shape, generator=g).to(device, dt).requires_grad_(grad)

    a, b, c = rnd(64, 128), rnd(64, 128), rnd(64, 128)
    x, w, bb = rnd(64, 128), rnd(128), rnd(128)
    y = torch.empty_like(x)
    mean = torch.empty(64, device=device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    grid = (triton_cdiv(64, 16),)

    def jit_launch():
        ln._ln_fwd.jit[grid](x, w, bb, y, mean, rstd, 64, 128, 1e-5, 1, 64, 0, 0, 128, 1,
                             w, mean, 0, HAS_BIAS=True, BLOCK_R=16, BLOCK_C=128, num_warps=4)

    rows = {
        "torch.add (out=)": lambda: torch.add(a, b, out=c),
        "F.layer_norm": lambda: F.layer_norm(x, (128,), w, bb),
        "triton JIT launch (_ln_fwd[grid])": jit_launch,
    }
    def cached_launch():
        ln._ln_fwd[grid](x, w, bb, y, mean, rstd, 64, 128, 1e-5, 1, 64, 0, 0, 128, 1,
                         w, mean, 0, HAS_BIAS=True, BLOCK_R=16, BLOCK_C=128, num_warps=4)

    rows["triton cached launch (fold_kernels.launch.FastKernel)"] = cached_launch
    rows["fold_kernels.layer_norm (no grad)"] = lambda: _nograd(ln.layer_norm, x, w, bb)
    rows["ops.layer_norm (registry, no grad)"] = lambda: _nograd(ops.layer_norm, x, w, bb)
    xg, wg, bg = rnd(64, 128, grad=True), rnd(128, grad=True), rnd(128, grad=True)
    rows["ops.layer_norm fwd+bwd"] = lambda: _fb(ops.layer_norm(xg, wg, bg), (xg, wg, bg))
    rows["F.layer_norm fwd+bwd"] = lambda: _fb(F.layer_norm(xg, (128,), wg, bg), (xg, wg, bg))
    class Identity(torch.autograd.Function):  # the autograd engine's cost of a Python backward
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g

    rows["autograd.Function identity fwd+bwd (no launch)"] = lambda: _fb(Identity.apply(xg),
                                                                         (xg,))
    rows["torch x*2 fwd+bwd (one launch each way)"] = lambda: _fb(xg * 2, (xg,))
    y0, mean0, rstd0 = ln.ln_forward(x, w, bb, 1e-5)
    dy0 = torch.randn_like(y0)
    rows["ln_backward called directly (2 launches)"] = lambda: ln.ln_backward(dy0, x, w, mean0,
                                                                             rstd0)
    q, k, v, gt = (rnd(1, 4, 4, 32, 16) for _ in range(4))
    bias = rnd(1, 4, 32, 32)
    mask = torch.rand(1, 4, 32, generator=g).to(device) > 0.2
    rows["evo_attention (no grad)"] = lambda: _nograd(ea.evo_attention, q, k, v, bias, mask,
                                                      None, gt)
    rows["ops.attention (registry, no grad)"] = lambda: _nograd(ops.attention, q, k, v, bias,
                                                                mask, None, gt)
    qg, kg, vg, gg = (rnd(1, 4, 4, 32, 16, grad=True) for _ in range(4))
    bg2 = rnd(1, 4, 32, 32, grad=True)
    rows["ops.attention fwd+bwd (5 launches)"] = lambda: _fb(
        ops.attention(qg, kg, vg, bg2, mask, None, gg), (qg, kg, vg, gg, bg2))
    return rows


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _nograd(fn, *args):
    with torch.no_grad():
        return fn(*args)


def _fb(out: torch.Tensor, leaves) -> None:
    out.backward(torch.ones_like(out))
    for t in leaves:
        t.grad = None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    ensure_kernels(device)
    result = {"device": device_name(), "torch": torch.__version__,
              "triton": triton_version(), "date": time.strftime("%Y-%m-%d"), "rows": {}}
    for name, fn in cases(device).items():
        us = per_call_us(fn, args.calls)
        result["rows"][name] = round(us, 2)
        print(f"{us:9.2f} us  {name}", flush=True)
    if args.out:
        write_atomic(args.out, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
