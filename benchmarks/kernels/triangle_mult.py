"""Triangle multiplicative update (AF3 Alg. 12-13, outgoing and incoming): fold's layer against
cuEquivariance's fused ``triangle_multiplicative_update``, as one op each, forward and
forward+backward (gradients of the pair and of every parameter), on one GPU in one process.

Both compute the same function with the same weights (LayerNorm in, the four gated projections
a, b with the pair mask, the product over k, LayerNorm out, output projection and gate; c_z =
c_hidden = 128 as in AF3): fold's ``TriangleMultiplication{Outgoing,Incoming}`` with bf16
parameters and inputs and the ``auto`` op backend (fold-kernels' Triton ops), cuEquivariance
with fp32 parameters and input under bf16 autocast, as Protenix calls it. The backward is seeded
by one fixed random output gradient for both. Cells: median ms (``triton.testing.do_bench``),
eager and as a CUDA graph replay (every row's eager timings before any capture: :func:`phases`);
the two outputs are compared (relative error, both bf16).

    python -m benchmarks.kernels.triangle_mult --n 256 384 512 768 1024 1536
    python -m benchmarks.kernels.triangle_mult --device cpu --tiny     # smoke (fold only)
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.blocks import triangle_multiplication_layer
from benchmarks.common.cli import device_arg
from benchmarks.common.graphs import capture
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import RESULTS, write_result

CONTENDERS = ("fold", "cueq")
MODES = ("fwd_ms", "fwd_bwd_ms", "fwd_bwd_graph_ms")


def _bench(fn, device, reps):
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=max(reps, 20) * 3, return_mode="median")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fold_case(layer, z, mask):
    layer = layer.to(torch.bfloat16)
    z = z.to(torch.bfloat16).requires_grad_()
    m = mask.to(torch.bfloat16)
    leaves = [z, *layer.parameters()]
    return (lambda: layer(z, m)), leaves


def cueq_case(layer, z, mask):
    from cuequivariance_torch import triangle_multiplicative_update

    layer = layer.float()
    z = z.float().requires_grad_()
    m = mask.float()
    direction = "outgoing" if layer.outgoing else "incoming"
    L = layer

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return triangle_multiplicative_update(
                z, direction=direction, mask=m,
                norm_in_weight=L.layer_norm_in.weight, norm_in_bias=L.layer_norm_in.bias,
                p_in_weight=torch.cat([L.linear_a_p.weight, L.linear_b_p.weight]),
                p_in_bias=torch.cat([L.linear_a_p.bias, L.linear_b_p.bias]),
                g_in_weight=torch.cat([L.linear_a_g.weight, L.linear_b_g.weight]),
                g_in_bias=torch.cat([L.linear_a_g.bias, L.linear_b_g.bias]),
                norm_out_weight=L.layer_norm_out.weight, norm_out_bias=L.layer_norm_out.bias,
                p_out_weight=L.linear_z.weight, p_out_bias=L.linear_z.bias,
                g_out_weight=L.linear_g.weight, g_out_bias=L.linear_g.bias)

    return fwd, [z, *layer.parameters()]


def measure(fwd, leaves, dout, device, reps, graph: bool = False):
    """``({mode: ms}, output)``: eagerly (``fwd_ms``, ``fwd_bwd_ms`` and the forward's output),
    or with ``graph`` the forward+backward as a CUDA-graph replay (``fwd_bwd_graph_ms``, CUDA
    only; no output)."""
    def fwd_bwd():
        return torch.autograd.grad(fwd(), leaves, dout)

    res = {}
    if graph:
        try:
            replay, _ = capture(fwd_bwd, device)
            res["fwd_bwd_graph_ms"] = _bench(replay, device, reps)
            del replay
        except Exception as exc:  # keeps the eager numbers
            res["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return res, None
    with torch.no_grad():
        out = fwd()
    res["fwd_ms"] = _bench(lambda: fwd(), device, reps)
    fwd_bwd()
    res["fwd_bwd_ms"] = _bench(fwd_bwd, device, reps)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return res, out.detach().float()


def phases(device) -> tuple[bool, ...]:
    """``graph`` per phase: every row's eager timings first, then (CUDA) every replay. A peer's
    host-bound eager step was slower after CUDA-graph captures in the same process
    (results/model/model_peers_h200_evoformer_order_*), so no contender's eager row follows a
    capture that another's did not."""
    return (False, True) if device.type == "cuda" else (False,)


def _inputs(n: int, n_c: int, device):
    """The row's pair ``z``, mask with ~5% holes and output gradient (seeded by ``n``)."""
    g = torch.Generator().manual_seed(n)
    z = torch.randn(1, n, n, n_c, generator=g).to(device)
    mask = (torch.rand(1, n, n, generator=g) > 0.05).float().to(device)  # holes
    dout = torch.randn(1, n, n, n_c, generator=g).to(device)
    return z, mask, dout


def peer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuequivariance-ops-torch-cu13")
    except PackageNotFoundError:
        return "not installed"


def run(sizes, device, reps, contenders, n_c=128):
    doc = {"device": device_name(device), "torch": torch.__version__, "triton": triton_version(),
           "cuequivariance-ops-torch-cu13": peer_version(),
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
           "backends": ensure_kernels(device), "rows": []}
    rows = {(n, outgoing): {"n": n, "direction": "outgoing" if outgoing else "incoming",
                            "results": {}}
            for n in sizes for outgoing in (True, False)}
    for graph in phases(device):
        for (n, outgoing), row in rows.items():
            z, mask, dout = _inputs(n, n_c, device)
            outs = {}
            for name in contenders:
                done = row["results"].setdefault(name, {})
                if "error" in done:
                    continue  # not built eagerly: no replay either
                torch.cuda.empty_cache() if device.type == "cuda" else None
                try:
                    layer = triangle_multiplication_layer(n_c, outgoing, device)
                    fwd, leaves = (fold_case if name == "fold" else cueq_case)(layer, z, mask)
                    res, outs[name] = measure(fwd, leaves, dout.to(leaves[0].dtype), device,
                                              reps, graph)
                except ImportError as exc:
                    res = {"error": f"not installed: {exc}"}
                except Exception as exc:  # a contender that cannot run this shape
                    res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                done.update(res)
                print(n, row["direction"], name, res, flush=True)
            if not graph and "fold" in outs and "cueq" in outs:
                a, b = outs["fold"], outs["cueq"]
                row["fold_vs_cueq_rel_err"] = ((a - b).norm() / b.norm()).item()
    doc["rows"] = list(rows.values())
    return doc


def to_markdown(doc) -> str:
    out = ["# Triangle multiplication as one op: fold vs cuEquivariance (c_z = c_hidden = 128)",
           "", f"Device: {doc['device']}, torch {doc['torch']}, triton {doc['triton']}, "
           f"cuequivariance-ops-torch-cu13 {doc['cuequivariance-ops-torch-cu13']}; "
           f"{doc['date']}. Median ms; fold bf16, cuEquivariance fp32 weights under bf16 "
           "autocast; forward+backward: gradients of z and every parameter.", ""]
    out += ["| N | direction | " + " | ".join(f"fold {m} | cueq {m}" for m in MODES)
            + " | cueq/fold fwd | cueq/fold fwd+bwd | cueq/fold graph | rel err |",
            "|---|---|" + "---|" * (2 * len(MODES) + 4)]
    for row in doc["rows"]:
        res = row["results"]
        cells, ratios = [], []
        for m in MODES:
            for name in CONTENDERS:
                x = res.get(name, {})
                cells.append(f"{x[m]:.3f}" if m in x else (x.get("error", "-")[:30]))
        for m in MODES:
            f, c = res.get("fold", {}).get(m), res.get("cueq", {}).get(m)
            ratios.append(f"{c / f:.2f}x" if f and c else "-")
        err = row.get("fold_vs_cueq_rel_err")
        out.append(f"| {row['n']} | {row['direction']} | " + " | ".join(cells) + " | "
                   + " | ".join(ratios) + f" | {'-' if err is None else f'{err:.1e}'} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[256, 384, 512, 768, 1024, 1536])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="N 12, c 16, fold only (CPU smoke)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--out", default=str(RESULTS / "kernels" / "kernels_triangle_mult.json"))
    args = p.parse_args(argv)
    device = device_arg(args.device, "kernels.triangle_mult")
    if args.tiny:
        doc = run([12], device, args.reps, ["fold"], n_c=16)
    else:
        doc = run(args.n, device, args.reps, args.contenders)
    md = to_markdown(doc)
    write_result(Path(args.out), doc, md)
    print(md)
    return doc


if __name__ == "__main__":
    main()
