"""EvoAttention vs eager PyTorch, SDPA (float mask), FlexAttention (compiled), cuEquivariance's
``triangle_attention`` and trifast.

All contenders run in one process on one GPU, bf16, on the same inputs: q, k, v ``[1, R, H, N,
D]``, a pair bias ``[1, H, N, N]`` shared by the R rows (with gradient) and a key mask
``[1, R, N]`` with about 5% holes. For each shape and contender: forward and forward+backward
median times (``triton.testing.do_bench``), forward+backward as a CUDA graph replay, and the
peak memory of forward+backward above the inputs; the backward is seeded by one fixed random
output gradient for every contender. Every contender's output and gradients are checked against
a float32 reference on every shape (``attention_inputs.reference``). Ours runs once per variant
(``OURS``: the bias gradient, ``FOLD_EVO_DBIAS``, and dQ, ``FOLD_EVO_DQ``, each by a
deterministic pass or by atomics), and its per-kernel device times are recorded.

    python -m benchmarks.kernels.attention --groups triangle msa extra
    python -m benchmarks.kernels.attention --md results.json [more.json ...] > results.md

trifast is only defined for triangle attention (R = N). FlexAttention is compiled once per
shape, with the compiler reset between shapes so it never falls back to eager; it takes the key
mask as its users would (``--mask``: the additive term with holes, no term when every key is
kept, a BlockMask for a padded mask; ``benchmarks.common.attention_inputs.make_flex``). Peers
that are not installed give a row "not installed", never a number from elsewhere.
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

from benchmarks.common.attention_inputs import make_flex, make_inputs, mask_bias, reference
from benchmarks.common.blocks import MASKS
from benchmarks.common.graphs import capture
from benchmarks.common.kernel_time import kernel_times
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import RESULTS, write_result

SHAPES = {
    # name: (R, N, H, D)
    "triangle": [(256, 256, 4, 32), (384, 384, 4, 32), (768, 768, 4, 32), (1536, 1536, 4, 32)],
    "msa": [(128, 256, 8, 32), (512, 384, 8, 32)],
    "extra": [(1024, 256, 8, 8), (5120, 384, 8, 8)],
}
# H100 SXM ceilings for the roofline column: dense bf16 tensor-core rate (TFLOP/s)
H100_BF16_TFLOPS = 766.0


# ----------------------------------------------------------------------------- contenders


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


def make_trifast():
    from trifast import triangle_attention

    def tri(q, k, v, bias, mask):
        # trifast: q [B, H, I, J, D], bias [B, H, J, K], mask [B, I, K] with True = masked
        t = [x.transpose(1, 2) for x in (q, k, v)]
        o = triangle_attention(t[0], t[1], t[2], bias, ~mask)
        return o.transpose(1, 2)

    return tri


def make_cueq():
    from cuequivariance_torch import triangle_attention

    def cueq(q, k, v, bias, mask):
        # cuEquivariance: q [B, N_rows, H, Q, D], bias [B, 1, H, Q, K], mask [B, N_rows, 1, 1, K]
        # (True = attend); the bias is cast to fp32 inside, as its users call it
        return triangle_attention(q, k, v, bias.unsqueeze(1), mask[:, :, None, None, :])

    return cueq


def make_ours(dbias_mode, dkdv_tiles, dq_mode):
    from fold_kernels import evo_attention

    def ours(q, k, v, bias, mask):
        # read per call (fold_ops.env.EnvVar): each variant of ours runs in this one process
        os.environ["FOLD_EVO_DBIAS"] = dbias_mode
        os.environ["FOLD_EVO_DKDV"] = dkdv_tiles
        os.environ["FOLD_EVO_DQ"] = dq_mode
        return evo_attention(q, k, v, bias, mask)

    return ours


# ours_qpass: the kernels before key-major dK/dV tiles and atomic dbias (query-major tiles, the
# separate deterministic dbias pass); ours_pass: the tuner's pick of query- or key-major tiles,
# deterministic dbias and dQ (the default under torch.use_deterministic_algorithms); ours_atomic:
# the same with the bias gradient by atomics, dQ by its own pass (the default from head dim 16
# up); ours_fused: dQ by atomics in the dK/dV pass too (FOLD_EVO_DQ=atomic, the default under 16)
OURS = {"ours_qpass": ("pass", "query", "pass"), "ours_pass": ("pass", "auto", "pass"),
        "ours_atomic": ("atomic", "auto", "pass"), "ours_fused": ("atomic", "auto", "atomic")}


# ----------------------------------------------------------------------------- measurement


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def step_kernels(fn, leaves, mask, do):
    """Device ms per kernel name (60 characters) over one forward+backward, largest first
    (:func:`benchmarks.common.kernel_time.kernel_times`)."""
    def step():
        torch.autograd.backward(fn(*leaves, mask), do)
    times: dict[str, float] = {}
    for k in kernel_times(step, leaves[0].device):
        times[k["name"][:60]] = times.get(k["name"][:60], 0.0) + k["ms"]
    for t in leaves:
        t.grad = None
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def measure(fn, q, k, v, bias, mask, do, profile_kernels=False):
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
    res = {"fwd_ms": t_fwd, "fwd_bwd_ms": t_fb, "peak_mib": peak}
    for t in leaves:
        t.grad = None
    try:  # the same step as one CUDA graph (launch gaps gone), gradients as graph outputs
        def body():
            return torch.autograd.grad(fn(*leaves, mask), leaves, do)
        replay, _ = capture(body, q.device)
        res["fwd_bwd_graph_ms"] = do_bench(replay, warmup=10, rep=60, return_mode="median")
        del replay
    except Exception as exc:  # a contender that cannot be captured keeps its eager numbers
        res["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    if profile_kernels:
        res["kernels_ms"] = step_kernels(fn, leaves, mask, do)
    return res, out, grads


def nominal_tflops(r, n, h, d, kind, ms):
    """Achieved TFLOP/s by the usual attention count: forward 4 R H N^2 D (QK^T and PV),
    forward+backward 3.5x that (the backward's five products less the recomputed logits)."""
    flops = 4.0 * r * h * n * n * d * (1.0 if kind == "fwd_ms" else 3.5)
    return flops / (ms * 1e-3) / 1e12


def peer_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("cuequivariance-torch", "cuequivariance-ops-torch-cu13", "trifast"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def run(groups, contenders, out_path, mask: str = "holes"):
    import datetime

    results = {"device": device_name(), "torch": torch.__version__,
               "triton": triton_version(), "peers": peer_versions(),
               "date": datetime.datetime.now(datetime.UTC).isoformat(
                   timespec="minutes"), "mask": mask, "rows": []}
    makers = {"eager": lambda: eager, "sdpa": lambda: sdpa, "flex": lambda: make_flex(mask),
              "cueq": make_cueq, "trifast": make_trifast,
              **{nm: (lambda m=m: make_ours(*m)) for nm, m in OURS.items()}}
    for group in groups:
        for r, n, h, d in SHAPES[group]:
            row = {"group": group, "R": r, "N": n, "H": h, "D": d, "results": {}}
            inputs = make_inputs(r, n, h, d, mask=mask)
            ref = reference(*inputs)  # float32 o, dq, dk, dv, dbias
            for name in contenders:
                if name == "trifast" and group != "triangle":
                    continue
                torch._dynamo.reset()
                torch.cuda.empty_cache()
                t0 = time.time()
                try:
                    fn = makers[name]()
                    res, o, grads = measure(fn, *inputs, profile_kernels=name in OURS)
                    res["err_vs_ref"] = [rel_err(a, b) for a, b in zip([o, *grads], ref)]
                    del o, grads
                except torch.cuda.OutOfMemoryError:
                    res = {"error": "OOM"}
                except ImportError as exc:
                    res = {"error": f"not installed: {exc}"}
                except Exception as exc:  # a contender that cannot run this shape
                    res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                    traceback.print_exc(limit=2)
                res["wall_s"] = round(time.time() - t0, 1)
                row["results"][name] = res
                print(group, (r, n, h, d), name, res, flush=True)
            results["rows"].append(row)
            del inputs, ref
            write_result(Path(out_path), results, to_markdown_docs([results]))
    return results


NAMES = ["eager", "sdpa", "flex", "cueq", "trifast", *OURS]
KINDS = ("fwd_ms", "fwd_bwd_ms", "fwd_bwd_graph_ms")


def _cell(x, kind):
    if x is None:
        return "-"
    if "error" in x:
        return x["error"][:40]
    if kind not in x:
        return x.get("graph_error", "-")[:40]
    return f"{x[kind]:.3f} ({x['peak_mib']:.0f})"


def to_markdown_docs(docs):
    rows = [r for d in docs for r in d["rows"]]
    devices = sorted({f"{d['device']}, torch {d['torch']}, triton {d['triton']}, "
                      + ", ".join(f"{k} {v}" for k, v in d.get("peers", {}).items())
                      + (f"; {d['date']}" if d.get("date") else "")
                      + f"; key mask: {d.get('mask', 'holes')}" for d in docs})
    out = ["# EvoAttention benchmark (bf16, median ms; peak MiB of fwd+bwd above the inputs)",
           "", "Device: " + "; ".join(devices), ""]
    for kind in KINDS:
        out += [f"## {kind}", "",
                "| shape | " + " | ".join(NAMES) + " | best ours vs best other | ours TFLOP/s |",
                "|---|" + "---|" * (len(NAMES) + 2)]
        for row in rows:
            res = row["results"]
            others = [res[nm][kind] for nm in NAMES
                      if nm not in OURS and kind in res.get(nm, {})]
            mine = [res[nm][kind] for nm in OURS if kind in res.get(nm, {})]
            ratio = f"{min(others) / min(mine):.2f}x" if mine and others else "-"
            tflops = "-"
            if mine and kind != "fwd_bwd_graph_ms":
                tf = nominal_tflops(row["R"], row["N"], row["H"], row["D"], kind, min(mine))
                tflops = f"{tf:.0f} ({100 * tf / H100_BF16_TFLOPS:.0f}%)"
            shape = f"{row['group']} R={row['R']} N={row['N']} H={row['H']} D={row['D']}"
            cells = [_cell(res.get(nm), kind) for nm in NAMES]
            out.append(f"| {shape} | " + " | ".join(cells) + f" | {ratio} | {tflops} |")
        out.append("")
    out += ["## relative error of o, dq, dk, dv, dbias against the float32 reference (masked "
            "logits as constants; earlier files: ours against SDPA, both bf16). FlexAttention "
            "with a BlockMask (padded) gives rows that keep no key 0 where the reference gives "
            "the mean of v", ""]
    for r in rows:
        for nm in NAMES:
            res = r["results"].get(nm, {})
            e, against = res.get("err_vs_ref"), ""
            if e is None and nm in OURS and res.get("err_vs_sdpa"):
                e, against = res["err_vs_sdpa"], " (against SDPA)"
            if e:
                out.append(f"- {nm} {r['group']} R={r['R']} N={r['N']}{against}: "
                           + ", ".join(f"{x:.1e}" for x in e))
    out += ["", "## ours: device ms per kernel in one forward+backward (torch.profiler)", ""]
    for r in rows:
        for nm in OURS:
            ks = r["results"].get(nm, {}).get("kernels_ms")
            if ks:
                top = ", ".join(f"{k.split('(')[0]} {v:.3f}" for k, v in list(ks.items())[:6])
                out.append(f"- {nm} {r['group']} R={r['R']} N={r['N']}: {top}")
    return "\n".join(out) + "\n"


def to_markdown(files):
    return to_markdown_docs([json.loads(Path(f).read_text()) for f in files])


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--groups", nargs="+", default=list(SHAPES))
    p.add_argument("--contenders", nargs="+", default=NAMES, choices=NAMES)
    p.add_argument("--out", default=str(RESULTS / "kernels" / "kernels_attention.json"))
    p.add_argument("--md", nargs="+", help="merge these JSON files into a Markdown table")
    p.add_argument("--mask", default="holes", choices=MASKS,
                   help="the key mask: ~5%% random holes (default), a padded input's (the last "
                        "tenth of the rows and keys masked: each row keeps a prefix) or none")
    args = p.parse_args(argv)
    if args.md:
        sys.stdout.write(to_markdown(args.md))
        return
    run(args.groups, args.contenders, args.out, args.mask)
    sys.stdout.write(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
