"""Backwards that sum a ``[C]`` bias's gradient in their own launch, against the column sums
they replace, in one process on one GPU (bf16, pair ``N^2 x 128``).

``bias_sigmoid_gate``'s backward with ``x_bias`` and ``bias`` (triangle multiplication's
output gate) is timed with its sums from ``--per-sm`` grids (programs per SM that walk the row
tiles; ``elementwise._sum_programs`` set for each), with the sums off
(``FOLD_KERNELS_GATE_SUMS=0``: the plain kernel, then two column sums), and without biases (the
plain kernel alone); beside them the floor of three pair tensors' bytes
(``torch.add(x, dy, out=dx)``). EvoAttention's packed, gated backward (triangle attention's
shape, H 4, D 32) with its gate-bias sum on and off. Each figure is one CUDA-graph replay of
``--calls`` back-to-back backward calls (the op's own backward, not autograd's engine), per
call, best of ``--rounds`` alternating rounds.

    python -m benchmarks.tools.bias_sums_ab --n 256 512 \\
        --out benchmarks/results/tools/bias_sums_ab_h200.json
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

from benchmarks.common.cli import add_ab_options, device_arg
from benchmarks.common.graphs import capture_calls
from benchmarks.common.machine import versions
from benchmarks.common.results import publish, rounds_cell
from benchmarks.common.timing import alternating_rounds

SWITCH = "FOLD_KERNELS_GATE_SUMS"


def _setting(elementwise, default_programs, sums: str, per_sm: int | None):
    """Entering a setting: the switch's value and the sums' grid (None: the default's)."""
    def enter() -> None:
        os.environ[SWITCH] = sums
        if per_sm is None:
            elementwise._sum_programs = default_programs
        else:
            elementwise._sum_programs = lambda n_tiles, n_cblk, device: max(1, min(
                n_tiles, per_sm * _sms(device) // n_cblk))
    return enter


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else 1


def _time(settings: dict, device, rounds: int, reps: int, calls: int) -> dict:
    steps = {}
    for name, (enter, fn) in settings.items():
        enter()
        fn()  # compiled and tuned under this setting
        steps[name] = (enter, capture_calls(fn, calls, device))
    times = alternating_rounds(steps, device, rounds, reps)
    return {name: [round(t / calls * 1e3, 2) for t in ts] for name, ts in times.items()}


def measure(n: int, per_sm: list[int], device, rounds: int, reps: int, calls: int) -> dict:
    elementwise = importlib.import_module("fold_kernels.elementwise")
    evo = importlib.import_module("fold_kernels.evo_attention")
    default_programs = elementwise._sum_programs
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, torch.bfloat16).requires_grad_()

    x, gate, dy = rand(1, n, n, 128), rand(1, n, n, 128), rand(1, n, n, 128).detach()
    bias, x_bias = rand(128), rand(128)
    y = elementwise.bias_sigmoid_gate(x, gate, bias, x_bias)
    y_plain = elementwise.bias_sigmoid_gate(x, gate)
    gate_bwd = lambda: y.grad_fn.apply(dy)  # noqa: E731
    settings = {"column sums": (_setting(elementwise, default_programs, "0", None), gate_bwd)}
    for k in per_sm:
        settings[f"{k} per SM"] = (_setting(elementwise, default_programs, "1", k), gate_bwd)
    settings["no biases"] = (_setting(elementwise, default_programs, "1", None),
                             lambda: y_plain.grad_fn.apply(dy))
    out = torch.empty_like(dy)
    settings["floor"] = (_setting(elementwise, default_programs, "1", None),
                         lambda: torch.add(x.detach(), dy, out=out))
    gate_us = _time(settings, device, rounds, reps, calls)

    h, d = 4, 32
    proj, pair_bias, gate_bias = rand(1, n, n, 4 * h * d), rand(1, h, n, n), rand(h * d)
    mask = (torch.rand(1, n, n, generator=g) > 0.05).to(device)
    o = evo.evo_attention_packed(proj, h, pair_bias, mask, gate_bias=gate_bias)
    do = torch.randn(o.shape, generator=g).to(device, o.dtype)
    attn_bwd = lambda: o.grad_fn.apply(do)  # noqa: E731
    attn_us = _time({"sums on": (_setting(elementwise, default_programs, "1", None), attn_bwd),
                     "sums off": (_setting(elementwise, default_programs, "0", None), attn_bwd)},
                    device, rounds, reps, calls)
    elementwise._sum_programs = default_programs
    row = {"N": n, "C": 128, "gate_us_per_call": gate_us, "attention_us_per_call": attn_us}
    print(row, flush=True)
    return row


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Bias gradients summed in the backward's launch, {meta['device']}, "
             f"{meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; bf16, pair N^2 x 128. Each "
             f"figure: one CUDA-graph replay of {meta['calls']} back-to-back backward calls, "
             f"median of {meta['reps']}, per call (us); {meta['rounds']} alternating rounds, "
             "in order. Gate: `bias_sigmoid_gate(x, gate, bias, x_bias)`'s backward; floor: "
             "`torch.add` over three pair tensors. Attention: `evo_attention_packed` at "
             "(N, N, H 4, D 32), gated, gate bias.", ""]
    names = list(rows[0]["gate_us_per_call"])
    lines += ["| N | " + " | ".join(f"gate, {k}" for k in names) + " |",
              "|---|" + "---|" * len(names)]
    for r in rows:
        lines.append(f"| {r['N']} | " + " | ".join(rounds_cell(r["gate_us_per_call"][k])
                                                   for k in names) + " |")
    lines += ["", "| N | attention, sums on | attention, sums off |", "|---|---|---|"]
    for r in rows:
        a = r["attention_us_per_call"]
        lines.append(f"| {r['N']} | {rounds_cell(a['sums on'])} | "
                     f"{rounds_cell(a['sums off'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--per-sm", type=int, nargs="+", default=[1, 2, 4, 8])
    add_ab_options(ap, reps=15, calls=10, smoke=True)
    args = ap.parse_args(argv)
    device = device_arg(args.device, "bias_sums_ab")
    before = os.environ.get(SWITCH)
    try:
        rows = [measure(n, args.per_sm, device, args.rounds, args.reps, args.calls)
                for n in args.n]
    finally:
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before
    meta = {**versions(device), "rounds": args.rounds, "reps": args.reps,
            "calls": args.calls, "per_sm": args.per_sm}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
