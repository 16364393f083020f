"""EvoAttention vs eager PyTorch, SDPA (float mask), FlexAttention (compiled) and trifast.

All contenders run in one process on one GPU, bf16, on the same inputs: q, k, v ``[1, R, H, N,
D]``, a pair bias ``[1, H, N, N]`` shared by the R rows (with gradient) and a key mask
``[1, R, N]`` with about 5% holes. For each shape and contender: forward and forward+backward
median times (``triton.testing.do_bench``) and the peak memory of forward+backward above the
inputs. Our output and gradients are checked against SDPA's (both bf16) on every shape.

    python -m benchmarks.kernels.attention --groups triangle msa extra --out results.json
    python -m benchmarks.kernels.attention --md results.json [more.json ...] > results.md

trifast is only defined for triangle attention (R = N). FlexAttention is compiled once per
shape, with the compiler reset between shapes so it never falls back to eager.
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

SHAPES = {
    # name: (R, N, H, D)
    "triangle": [(256, 256, 4, 32), (384, 384, 4, 32), (768, 768, 4, 32), (1536, 1536, 4, 32)],
    "msa": [(128, 256, 8, 32), (512, 384, 8, 32)],
    "extra": [(1024, 256, 8, 8), (5120, 384, 8, 8)],
}
MASK_NEG = -1e9


def make_inputs(r, n, h, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16

    def rnd(*shape):
        return torch.randn(shape, device="cuda", generator=g, dtype=torch.float32).to(dt)

    q, k, v = rnd(1, r, h, n, d), rnd(1, r, h, n, d), rnd(1, r, h, n, d)
    bias = rnd(1, h, n, n)
    mask = torch.rand(1, r, n, device="cuda", generator=g) > 0.05
    do = rnd(1, r, h, n, d)
    return q, k, v, bias, mask, do


# ----------------------------------------------------------------------------- contenders


def mask_bias(mask, dtype):
    """0 where attended, -1e9 where masked (the additive form the peers use)."""
    return (1 - mask.to(dtype)) * MASK_NEG


def eager(q, k, v, bias, mask):
    """OpenFold-style: materialized logits, additive mask bias, softmax, matmul."""
    scale = q.shape[-1] ** -0.5
    logits = torch.matmul(q * scale, k.transpose(-1, -2))  # [1, R, H, N, N]
    logits = logits + bias.unsqueeze(1) + mask_bias(mask, q.dtype)[:, :, None, None, :]
    return torch.matmul(torch.softmax(logits, dim=-1), v)


def sdpa(q, k, v, bias, mask):
    import torch.nn.functional as F

    _, r, h, n, d = q.shape
    mbias = mask_bias(mask, q.dtype)  # [1, R, N]
    attn_mask = (bias.unsqueeze(1) + mbias[:, :, None, None, :]).reshape(r, h, n, n)
    o = F.scaled_dot_product_attention(q.reshape(r, h, n, d), k.reshape(r, h, n, d),
                                       v.reshape(r, h, n, d), attn_mask=attn_mask)
    return o.reshape(1, r, h, n, d)


def make_flex():
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    def flex(q, k, v, bias, mask):
        _, r, h, n, d = q.shape
        b2 = bias[0]  # [H, N, N]
        mbias = mask_bias(mask[0], torch.float32)  # [R, N]

        def score_mod(score, b, hh, qi, ki):
            return score + b2[hh, qi, ki] + mbias[b, ki]

        o = compiled(q.reshape(r, h, n, d), k.reshape(r, h, n, d), v.reshape(r, h, n, d),
                     score_mod=score_mod)
        return o.reshape(1, r, h, n, d)

    return flex


def make_trifast():
    from trifast import triangle_attention

    def tri(q, k, v, bias, mask):
        # trifast: q [B, H, I, J, D], bias [B, H, J, K], mask [B, I, K] with True = masked
        t = [x.transpose(1, 2) for x in (q, k, v)]
        o = triangle_attention(t[0], t[1], t[2], bias, ~mask)
        return o.transpose(1, 2)

    return tri


def ours(q, k, v, bias, mask):
    from fold_kernels import evo_attention

    return evo_attention(q, k, v, bias, mask)


# ----------------------------------------------------------------------------- measurement


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def measure(fn, q, k, v, bias, mask, do):
    from triton.testing import do_bench

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]

    def fwd():
        return fn(*leaves, mask)

    def fwd_bwd():
        o = fn(*leaves, mask)
        torch.autograd.backward(o, do)

    fwd_bwd()  # compile / tune
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    grads = [t.grad.clone() for t in leaves]  # do_bench accumulates into .grad while warming
    for t in leaves:
        t.grad = None
    out = fwd().detach()
    t_fwd = do_bench(fwd, warmup=10, rep=60, return_mode="median")
    t_fb = do_bench(fwd_bwd, warmup=10, rep=60, grad_to_none=leaves, return_mode="median")
    return {"fwd_ms": t_fwd, "fwd_bwd_ms": t_fb, "peak_mib": peak}, out, grads


def run(groups, contenders, out_path):
    results = {"device": device_name(), "torch": torch.__version__,
               "triton": triton_version(), "rows": []}
    makers = {"eager": lambda: eager, "sdpa": lambda: sdpa, "flex": make_flex,
              "trifast": make_trifast, "ours": lambda: ours}
    for group in groups:
        for r, n, h, d in SHAPES[group]:
            row = {"group": group, "R": r, "N": n, "H": h, "D": d, "results": {}}
            inputs = make_inputs(r, n, h, d)
            ref = None
            for name in contenders:
                if name == "trifast" and group != "triangle":
                    continue
                torch._dynamo.reset()
                torch.cuda.empty_cache()
                t0 = time.time()
                try:
                    fn = makers[name]()
                    res, o, grads = measure(fn, *inputs)
                    if name == "sdpa":
                        ref = (o, grads)
                    if name == "ours" and ref is not None:
                        res["err_vs_sdpa"] = [rel_err(o, ref[0])] + [
                            rel_err(a, b) for a, b in zip(grads, ref[1])]
                    del o, grads
                except torch.cuda.OutOfMemoryError:
                    res = {"error": "OOM"}
                except Exception as exc:  # a contender that cannot run this shape
                    res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                    traceback.print_exc(limit=2)
                res["wall_s"] = round(time.time() - t0, 1)
                row["results"][name] = res
                print(group, (r, n, h, d), name, res, flush=True)
            results["rows"].append(row)
            del inputs
            write_atomic(Path(out_path), json.dumps(results, indent=1))
    return results


def to_markdown(files):
    rows, devices = merged_rows(files)
    names = ["eager", "sdpa", "flex", "trifast", "ours"]
    out = ["# EvoAttention benchmark (bf16, median ms; peak MiB of fwd+bwd above the inputs)",
           "", "Device: " + "; ".join(sorted(devices)), ""]
    for kind in ("fwd_ms", "fwd_bwd_ms"):
        out += [f"## {kind}", "",
                "| shape | " + " | ".join(names) + " | ours vs best other |",
                "|---|" + "---|" * (len(names) + 1)]
        for row in rows:
            res = row["results"]
            cells, others = [], []
            for nm in names:
                x = res.get(nm)
                if x is None:
                    cells.append("-")
                elif "error" in x:
                    cells.append(x["error"][:30])
                else:
                    cells.append(f"{x[kind]:.3f} ({x['peak_mib']:.0f})")
                    if nm != "ours":
                        others.append(x[kind])
            mine = res.get("ours", {}).get(kind)
            ratio = f"{min(others) / mine:.2f}x" if mine and others else "-"
            shape = f"{row['group']} R={row['R']} N={row['N']} H={row['H']} D={row['D']}"
            out.append(f"| {shape} | " + " | ".join(cells) + f" | {ratio} |")
        out.append("")
    errs = [(r, r["results"].get("ours", {}).get("err_vs_sdpa")) for r in rows]
    out += ["## ours vs SDPA (both bf16): relative error of o, dq, dk, dv, dbias", ""]
    for r, e in errs:
        if e:
            out.append(f"- {r['group']} R={r['R']} N={r['N']}: " + ", ".join(f"{x:.1e}" for x in e))
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--groups", nargs="+", default=list(SHAPES))
    p.add_argument("--contenders", nargs="+", default=["eager", "sdpa", "flex", "trifast", "ours"])
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "attention.json"))
    p.add_argument("--md", nargs="+", help="merge these JSON files into a Markdown table")
    args = p.parse_args(argv)
    if args.md:
        sys.stdout.write(to_markdown(args.md))
        return
    run(args.groups, args.contenders, args.out)
    sys.stdout.write(to_markdown([args.out]))


if __name__ == "__main__":
    main()
