"""EvoAttention from another copy of its module against the current one, in one process on one
GPU: forward + backward as CUDA-graph replays, alternating rounds, and the gradients compared.

A kernel change that keeps no switch of its own (a rewrite of a kernel's indexing, say) is timed
against the code it replaced by loading that code's ``fold_kernels/evo_attention.py`` from a
file beside the installed package: each copy compiles its own kernels, the rest of fold-kernels
(tuning, launch, reductions) is shared. Get the old copy with git, e.g.

    git show 1f5402f:packages/fold-kernels/src/fold_kernels/evo_attention.py > evo_old.py
    python -m benchmarks.tools.attention_ab evo_old.py 256,256,4,32 768,768,4,32 --gate \\
        --out benchmarks/results/tools/attention_ab_h200.json

Shapes are ``R,N,H,D`` (bf16 ``[1, R, H, N, D]`` q, k, v, a ``[1, H, N, N]`` bias with gradient,
a key mask, ``--mask``: 5% holes, padded or all ones; ``--gate``: a gate too). Each figure is
one replay of ``--calls`` forward + backward calls, median of ``--reps``, per call; the ratio
compares the best rounds (above 1: the current module is faster). The copies share the
tuner's choices (its keys name the kernel, not the module), so both run the tiles tuned for
the first copy: a like-for-like comparison of kernels whose tiles did not change
(``FOLD_KERNELS_AUTOTUNE=0`` in the environment: both run the default tiles).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from pathlib import Path

import torch

from benchmarks.common.blocks import MASKS, pattern_mask
from benchmarks.common.cli import add_ab_options, device_arg
from benchmarks.common.graphs import capture_calls
from benchmarks.common.machine import versions
from benchmarks.common.results import publish, rounds_cell
from benchmarks.common.timing import alternating_rounds


def load_copy(path: Path):
    """The module in ``path`` (a copy of ``fold_kernels/evo_attention.py``), imported under its
    own name so that it does not replace the installed one."""
    spec = importlib.util.spec_from_file_location("evo_attention_other_copy", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"attention_ab: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "evo_attention"):
        raise SystemExit(f"attention_ab: {path} has no evo_attention (not a copy of "
                         "fold_kernels/evo_attention.py?)")
    return module


def parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        r, n, h, d = (int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"attention_ab: a shape is R,N,H,D, got {text!r}") from None
    return r, n, h, d


def measure(modules: dict, shape: tuple[int, int, int, int], gate: bool, device: torch.device,
            rounds: int, reps: int, calls: int, mask_pattern: str = "holes") -> dict:
    r, n, h, d = shape
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*dims):
        return torch.randn(*dims, generator=g).to(device, torch.bfloat16).requires_grad_()

    q, k, v = (rand(1, r, h, n, d) for _ in range(3))
    bias = rand(1, h, n, n)
    gates = rand(1, r, h, n, d) if gate else None
    mask = pattern_mask((1, r, n), g, mask_pattern).to(device)
    dout = torch.randn(1, r, h, n, d, generator=g).to(device, torch.bfloat16)
    leaves = (q, k, v, bias) + ((gates,) if gate else ())
    settings, grads = {}, {}
    for name, module in modules.items():
        def step(module=module):
            o = module.evo_attention(q, k, v, bias, mask, gate=gates)
            return torch.autograd.grad(o, leaves, dout)

        grads[name] = [t.float() for t in step()]  # compiles and tunes this copy's kernels
        settings[name] = (lambda: None, capture_calls(step, calls, device))
    times = alternating_rounds(settings, device, rounds, reps)
    per_call = {name: [round(t / calls, 4) for t in ts] for name, ts in times.items()}
    other, current = modules
    row = {"shape": list(shape), "gate": gate, "mask": mask_pattern, "ms_per_call": per_call,
           "other_over_current": round(min(per_call[other]) / min(per_call[current]), 4),
           "max_abs_grad_diff": max(float((a - b).abs().max())
                                    for a, b in zip(grads[other], grads[current]))}
    print(row, flush=True)
    return row


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# EvoAttention, {meta['other']} against the current module, {meta['device']}, "
             f"{meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16; forward + backward (bias "
             f"with gradient, key mask: {meta.get('mask', 'holes')}); each figure: one CUDA-graph "
             f"replay of {meta['calls']} calls, median of {meta['reps']}, ms per call; "
             f"{meta['rounds']} alternating rounds. Ratio: best rounds, other / current "
             "(above 1: the current module is faster).", "",
             "| R, N, H, D | gate | other (ms) | current (ms) | other/current | "
             "max abs grad diff |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms_per_call"]
        lines.append(f"| {', '.join(map(str, r['shape']))} | {'yes' if r['gate'] else 'no'} | "
                     f"{rounds_cell(ms['other'])} | {rounds_cell(ms['current'])} | "
                     f"{r['other_over_current']} | "
                     f"{r['max_abs_grad_diff']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("other", type=Path, help="a copy of fold_kernels/evo_attention.py")
    ap.add_argument("shapes", nargs="+", help="R,N,H,D")
    ap.add_argument("--gate", action="store_true", help="gated attention (AF2 / AF3 blocks)")
    ap.add_argument("--mask", default="holes", choices=MASKS,
                    help="the key mask: ~5%% random holes, a padded input's (the last tenth of "
                         "the rows keep no key, every row masks the last tenth of the keys), "
                         "or all ones")
    add_ab_options(ap, reps=20, calls=5, smoke=True)
    args = ap.parse_args(argv)
    device = device_arg(args.device, "attention_ab")
    shapes = [parse_shape(s) for s in args.shapes]
    current = importlib.import_module("fold_kernels.evo_attention")  # the module

    modules = {"other": load_copy(args.other), "current": current}
    rows = [measure(modules, s, args.gate, device, args.rounds, args.reps, args.calls,
                    args.mask) for s in shapes]
    meta = {**versions(device), "other": str(args.other), "mask": args.mask,
            "rounds": args.rounds, "reps": args.reps, "calls": args.calls}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
