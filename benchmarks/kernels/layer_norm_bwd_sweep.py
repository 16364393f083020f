"""LayerNorm's backward: every launch candidate of fold-kernels' kernel, the tuned op and
PyTorch's, as CUDA-graph replays in one process on one GPU (bf16), with the bandwidth each
reaches.

The backward reads x and dy and writes dx (plus the fp32 row statistics and the small weight
and bias gradients): ``3 * rows * C * 2`` bytes in bf16, a memory-bound pass. Each candidate
(``tuning.pinned``: rows a block, programs per multiprocessor, warps, the weight / bias partial
sums as row tiles or per-block column sums) runs through ``fold_kernels.layer_norm.ln_backward``
itself; ``tuned`` is what the tuner picks; ``torch`` is PyTorch's backward kernel
(``aten.native_layer_norm_backward``); ``floor`` is ``torch.add(x, dy, out=dx)``, the same
bytes with no arithmetic to speak of. Every candidate's gradients are compared with the tuned
op's.

    python -m benchmarks.kernels.layer_norm_bwd_sweep \\
        --out benchmarks/results/kernels/layer_norm_bwd_sweep_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from pathlib import Path

import torch

from benchmarks.common.graphs import capture
from benchmarks.common.machine import versions
from benchmarks.common.results import publish
from benchmarks.common.timing import median_ms

SHAPES = {  # name: (rows, C)
    "pair 256^2 x 128": (256 * 256, 128),
    "pair 384^2 x 128": (384 * 384, 128),
    "pair 768^2 x 128": (768 * 768, 128),
    "MSA 512 x 384 x 256": (512 * 384, 256),
    "single 384 x 384": (384, 384),
}


def label(cfg) -> str:
    return (f"{cfg.block_m}r x{cfg.block_n}/SM w{cfg.num_warps}"
            + (" tile" if cfg.acc_tile else ""))


def sweep(name: str, rows: int, c: int, device: torch.device, reps: int) -> dict:
    from fold_kernels import tuning

    ln = importlib.import_module("fold_kernels.layer_norm")  # the module, not the function

    g = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, c, generator=g) * 2 + 1).to(device, torch.bfloat16)
    dy = torch.randn(rows, c, generator=g).to(device, torch.bfloat16)
    w = torch.randn(c, generator=g).to(device, torch.bfloat16)
    b = torch.randn(c, generator=g).to(device, torch.bfloat16)
    _, mean, rstd = ln.ln_forward(x, w, b, 1e-5)
    gbytes = (3 * rows * c * 2 + rows * 8) / 1e9

    def ours():
        return ln.ln_backward(dy, x, w, mean, rstd, torch.bfloat16, torch.bfloat16)

    ref = [t.float() for t in ours()]  # the tuner picks here
    times = {}
    for cfg in (*ln._bwd_configs_for(c, False), None):
        key = "tuned" if cfg is None else label(cfg)
        with tuning.pinned("ln_bwd", cfg) if cfg is not None else contextlib.nullcontext():
            replay, out = capture(ours, device)
            ms = median_ms(replay, device, reps)
        err = max(((o.float() - r).norm() / r.norm().clamp_min(1e-30)).item()
                  for o, r in zip(out, ref))
        times[key] = {"ms": round(ms, 5), "TB_s": round(gbytes / ms, 3), "rel_err": err}

    # PyTorch's backward kernel called as the op (not through autograd, whose backward would
    # run on the forward's stream, outside the graph being captured)
    _, t_mean, t_rstd = torch.ops.aten.native_layer_norm(x, [c], w, b, 1e-5)
    replay, _ = capture(lambda: torch.ops.aten.native_layer_norm_backward(
        dy, x, [c], t_mean, t_rstd, w, b, [True, True, True]), device)
    ms = median_ms(replay, device, reps)
    times["torch"] = {"ms": round(ms, 5), "TB_s": round(gbytes / ms, 3), "rel_err": None}
    # the floor: the same bytes moved by the simplest kernel that reads two such tensors and
    # writes one (no statistics, no reductions)
    dx = torch.empty_like(x)
    replay, _ = capture(lambda: torch.add(x, dy, out=dx), device)
    ms = median_ms(replay, device, reps)
    times["floor: x + dy -> dx"] = {"ms": round(ms, 5), "TB_s": round(gbytes / ms, 3),
                                    "rel_err": None}
    picked = [label(cfg) for key, cfg in tuning.chosen("ln_bwd").items()
              if key[:2] == (rows, c)]
    row = {"shape": name, "rows": rows, "C": c, "GB": round(gbytes, 4), "times": times,
           "picked": picked[0] if picked else None}
    print(row, flush=True)
    return row


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# LayerNorm backward, every candidate, {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16, CUDA-graph replays, median of "
             f"{meta['reps']}; TB/s counts x and dy read and dx written. `tile`: the weight and "
             "bias partial sums kept as row tiles (`ACC_TILE`).", ""]
    for r in rows:
        lines += [f"## {r['shape']} ({r['rows']} rows, C {r['C']}); tuner's pick: "
                  f"{r['picked']}", "", "| candidate | us | TB/s | rel. err vs tuned |",
                  "|---|---|---|---|"]
        for k, v in sorted(r["times"].items(), key=lambda kv: kv[1]["ms"]):
            err = "-" if v["rel_err"] is None else f"{v['rel_err']:.1e}"
            lines.append(f"| {k} | {v['ms'] * 1e3:.1f} | {v['TB_s']:.2f} | {err} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    if not torch.cuda.is_available():
        raise SystemExit("layer_norm_bwd_sweep: needs a CUDA GPU (the candidates are GPU "
                         "launch configurations)")
    rows = [sweep(n, *SHAPES[n], device, args.reps) for n in args.shapes.split(",")]
    meta = {**versions(device), "reps": args.reps}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
