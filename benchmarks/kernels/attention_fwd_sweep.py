"""EvoAttention's forward: every launch candidate, the tuned op and FlexAttention, side by side in
one process on one GPU (bf16, D 32).

For each shape, on the inputs of ``benchmarks/kernels/attention.py`` (q, k, v ``[1, R, H, N,
D]``, a pair bias ``[1, H, N, N]`` shared by the R rows, a key mask with about 5% holes, one fixed
output gradient), it times the forward and the forward+backward (median of ``--reps`` calls,
each timed with CUDA events) at triangle N 768 and 1536 (H 4), MSA rows (512, 384) (H 8), then
the small shapes (triangle 256, 384, MSA (128, 256)), of:

* ``flex``: FlexAttention compiled with a bias ``score_mod``
  (``benchmarks.common.attention_inputs``);
* ``tuned``: ``fold_kernels.evo_attention`` as a user runs it, the tuner picking the forward;
* ``fwd[BMxBN wW sS rR]``: ``fold_kernels.evo_attention`` with the forward pinned to each of its
  candidates in turn (``tuning.pinned``), so every candidate is measured, not only the pick.

The backward of every EvoAttention row runs the same pinned kernels (by default the tuner's
picks recorded on an H100 in kernels_attention_dq_tuning.json: dK/dV 64 x 64, 4 warps, 3
stages, two rows, key-major, dbias by atomics; dQ 64 x 32 two rows), so forward+backward rows
differ by their forward only. ``--tune-backward`` lets the tuners pick instead (slower: every
backward candidate is compiled). Outputs and gradients of every candidate are compared with the
tuned op's (both bf16). The committed 2026-11-25 results also have a ``v0`` row, the kernels of
commit 5912db1 before issue 21's forward work (a frozen copy then; check that commit out to
time them again).

    python -m benchmarks.kernels.attention_fwd_sweep \\
        --out benchmarks/results/kernels/kernels_attention_fwd_sweep.json

Writes the JSON and a Markdown table beside it (``benchmarks.common.results.write_result``) after
each shape, with the ratio ``flex ms / ours ms`` (above 1: faster than FlexAttention).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.attention_inputs import make_flex, make_inputs
from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.results import RESULTS, write_result
from benchmarks.common.timing import median_ms

SHAPES = {
    # name: (group, R, N, H, D)
    "triangle768": ("triangle", 768, 768, 4, 32),
    "triangle1536": ("triangle", 1536, 1536, 4, 32),
    "msa512": ("msa", 512, 384, 8, 32),
    # where the kernels before this work already beat FlexAttention: the new candidates must not
    # lose there (the tuner picks among all of them)
    "triangle256": ("triangle", 256, 256, 4, 32),
    "triangle384": ("triangle", 384, 384, 4, 32),
    "msa128": ("msa", 128, 256, 8, 32),
    # head dim 8 (extra MSA; FlexAttention cannot run it): the arithmetic changes at D < 16,
    # same candidates as before; not a default (the backward pins are D 32's)
    "extra1024": ("extra", 1024, 256, 8, 8),
    "tiny": ("triangle", 5, 24, 1, 32),  # CPU smoke test (Triton's interpreter)
}
# the shapes first: results are written after each shape
DEFAULT_SHAPES = ["triangle768", "triangle1536", "msa512", "triangle256", "triangle384", "msa128"]
# The backward's launch configurations for every EvoAttention row (see the module docstring):
# (kernel, block_m, block_n, num_warps, num_stages, rows, transpose)
BACKWARD_PINS = [("dkdv_atomic", 64, 64, 4, 3, 2, True), ("dq", 64, 32, 4, 3, 2, False)]
H100_BF16_TFLOPS = 766.0


def cfg_name(cfg) -> str:
    return f"fwd[{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} r{cfg.rows}]"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def forward_candidates(device: torch.device, head_dim: int) -> list:
    """Every forward candidate the tuner may pick for bf16 inputs of this head dim."""
    from fold_kernels import tuning

    return list(tuning.attention_configs("fwd", tuning.arch(device), head_dim, itemsize=2))


@contextlib.contextmanager
def pinned_backward(enabled: bool):
    """Pin the backward kernels (``evo_*`` tuner keys)."""
    from fold_kernels import tuning

    with contextlib.ExitStack() as stack:
        if enabled and not tuning.interpreting():
            for kernel, bm, bn, w, s, rows, t in BACKWARD_PINS:
                cfg = tuning.Config(bm, bn, w, s, rows=rows, transpose=t)
                stack.enter_context(tuning.pinned("evo_" + kernel, cfg))
        yield


def time_one(fn, inputs, device, reps: int, reference=None) -> tuple[dict, tuple]:
    """Forward and forward+backward medians (ms) of ``fn(q, k, v, bias, mask)``; its output and
    gradients, and their relative errors against ``reference`` (output, gradients) if given. A
    backward that fails leaves the forward's numbers and records its error."""
    q, k, v, bias, mask, do = inputs
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]

    def fwd():
        with torch.no_grad():
            return fn(*leaves, mask)

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        torch.autograd.backward(fn(*leaves, mask), do)

    out = fwd().detach()  # compile, tune, allocate
    res = {"fwd_ms": median_ms(fwd, device, reps, warmup=2)}
    grads = None
    try:
        fwd_bwd()
        grads = [t.grad.detach().clone() for t in leaves]
        res["fwd_bwd_ms"] = median_ms(fwd_bwd, device, reps, warmup=2)
    except Exception as exc:  # FlexAttention has no CPU backward; out of memory; ...
        res["fwd_bwd_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if reference is not None:
        res["err_vs_tuned"] = [rel_err(out, reference[0])]
        if grads is not None and reference[1] is not None:
            res["err_vs_tuned"] += [rel_err(a, b) for a, b in zip(grads, reference[1])]
    for t in leaves:
        t.grad = None
    return res, (out, grads)


def run_shape(name: str, contenders: list[str], device: torch.device, reps: int,
              pin_backward: bool) -> dict:
    from fold_kernels import evo_attention, tuning

    group, r, n, h, d = SHAPES[name]
    row = {"shape": name, "group": group, "R": r, "N": n, "H": h, "D": d, "results": {}}
    inputs = make_inputs(r, n, h, d, device=device.type)
    ref = None

    def record(label, fn, pin=None):
        nonlocal ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t0 = time.time()
        try:
            with pinned_backward(pin_backward), (tuning.pinned("evo_fwd", pin) if pin
                                                 else contextlib.nullcontext()):
                res, outs = time_one(fn, inputs, device, reps, ref)
            if label == "tuned":
                ref = outs
            del outs
        except torch.cuda.OutOfMemoryError:
            res = {"error": "OOM"}
        except Exception as exc:  # a candidate that does not fit (shared memory, registers)
            res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        if pin is not None:
            res["config"] = [pin.block_m, pin.block_n, pin.num_warps, pin.num_stages, pin.rows]
        res["wall_s"] = round(time.time() - t0, 1)
        row["results"][label] = res
        print(name, label, {k: v for k, v in res.items() if k != "err_vs_tuned"}, flush=True)

    if "flex" in contenders:
        torch._dynamo.reset()
        record("flex", make_flex())
    if "tuned" in contenders:  # first: the candidates' reference
        record("tuned", evo_attention)
        picks = [cfg for key, cfg in tuning.chosen("evo_fwd").items() if key[1:3] == (r, n)]
        row["tuner_pick"] = cfg_name(picks[0]) if picks else None
    if "candidates" in contenders:
        for cfg in forward_candidates(device, d):
            record(cfg_name(cfg), evo_attention, pin=cfg)
    return row


@contextlib.contextmanager
def environment(**values: str):
    """Set environment variables for the block, then restore them (a test calls main())."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ms(res: dict | None, kind: str) -> float | None:
    return None if not res or kind not in res else res[kind]


def to_markdown(doc: dict) -> str:
    out = ["# EvoAttention forward: every launch candidate vs FlexAttention (bf16, median ms)", "",
           f"Device: {doc['device']}, torch {doc['torch']}, triton {doc['triton']}; "
           f"{doc['date']}; median of {doc['reps']} calls (CUDA events on a GPU); backward "
           f"{'pinned to ' + doc['backward'] if doc['backward'] != 'tuned' else 'tuned'}.", "",
           "Ratio = FlexAttention ms / ours ms (above 1: faster than FlexAttention). TFLOP/s: "
           "forward 4 R H N^2 D, forward+backward 3.5x that.", ""]
    for row in doc["rows"]:
        res = row["results"]
        flex = res.get("flex", {})
        out += [f"## {row['group']} R={row['R']} N={row['N']} H={row['H']} D={row['D']}"
                + (f" (tuner's pick: {row.get('tuner_pick')})" if row.get("tuner_pick") else ""),
                "", "| contender | fwd ms | fwd vs flex | fwd TFLOP/s | fwd+bwd ms | fwd+bwd vs "
                "flex | max rel err vs tuned (o, dq, dk, dv, dbias) |",
                "|---|---|---|---|---|---|---|"]
        for label, x in res.items():
            if "error" in x:
                out.append(f"| {label} | {x['error'][:60]} | | | | | |")
                continue
            cells = [label]
            for kind in ("fwd_ms", "fwd_bwd_ms"):
                if kind not in x:
                    cells += [x.get("fwd_bwd_error", "-")[:60], "-"]
                    continue
                ms = x[kind]
                ref = _ms(flex, kind)
                cells += [f"{ms:.3f}", f"{ref / ms:.2f}x" if ref else "-"]
                if kind == "fwd_ms":
                    tf = 4.0 * row["R"] * row["H"] * row["N"] ** 2 * row["D"] / (ms * 1e-3) / 1e12
                    cells.append(f"{tf:.0f} ({100 * tf / H100_BF16_TFLOPS:.0f}%)")
            err = x.get("err_vs_tuned", x.get("err_vs_v0"))  # v0: the 2026-11-25 files
            cells.append(f"{max(err):.1e}" if err else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    p.add_argument("--contenders", nargs="+", default=["flex", "tuned", "candidates"],
                   choices=["flex", "tuned", "candidates"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tune-backward", action="store_true",
                   help="let the tuners pick the backward kernels (compiles every candidate)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path,
                   default=RESULTS / "kernels" / "kernels_attention_fwd_sweep.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("attention_fwd_sweep: --device cuda requested but CUDA is not available")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise SystemExit("attention_fwd_sweep: --device cpu runs the kernels in Triton's "
                         "interpreter: set TRITON_INTERPRET=1 before starting Python")
    pins = ", ".join(f"{k} {bm}x{bn} w{w} s{s} r{rows}{' key-major' if t else ''}"
                     for k, bm, bn, w, s, rows, t in BACKWARD_PINS)
    doc = {"device": device_name(device), "torch": torch.__version__,
           "triton": triton_version(), "reps": args.reps,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
           "backward": "tuned" if args.tune_backward else pins, "rows": []}
    t0 = time.time()
    # the tuners' choices of this run only (no stale cache read, nothing left in ~/.cache);
    # dbias by atomics and dQ by its own pass: the defaults at D 32 outside deterministic mode,
    # fixed so that every row runs the same backward
    with tempfile.TemporaryDirectory() as tmp, environment(
            FOLD_KERNELS_CACHE=str(Path(tmp) / "tuning.json"), FOLD_KERNELS_AUTOTUNE="1",
            FOLD_EVO_DBIAS="atomic", FOLD_EVO_DQ="pass"):
        for name in args.shapes:
            doc["rows"].append(run_shape(name, args.contenders, device, args.reps,
                                         not args.tune_backward))
            doc["wall_s"] = round(time.time() - t0, 1)
            write_result(args.out, doc, to_markdown(doc))
    sys.stdout.write(args.out.with_suffix(".md").read_text())
    return doc


if __name__ == "__main__":
    main()
