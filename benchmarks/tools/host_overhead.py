"""Host (Python) time per call of fold-kernels' wrappers and fold-model's dispatch, kernels stubbed.

A development tool for CPU: Triton runs in its interpreter (``TRITON_INTERPRET=1``) and every
kernel launch is replaced by a no-op, so what is timed is only what the GPU path also pays on the
host per call: the registry's backend choice (``supports``), argument checks, layout views, launch
metadata, autograd bookkeeping and the allocation of outputs. Tiny tensors keep the remaining
aten work (allocations, views, the model's own small matmuls) small. Outputs are garbage (the
kernels do not run): only timings are printed.

    python -m benchmarks.tools.host_overhead              # us per call, best of --reps rounds
    python -m benchmarks.tools.host_overhead --calls 500 --reps 7

Rows: each op's forward+backward through ``fold_model.ops`` (backend ``triton``, and ``torch``
for scale), the registry's ``resolve`` alone, and one tiny Evoformer / Pairformer block step.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: launches become Python calls

import torch  # noqa: E402

from benchmarks.common.backends import allow_cpu_in_interpreter  # noqa: E402
from benchmarks.common.blocks import evoformer_step, pairformer_step  # noqa: E402


def stub_launches() -> None:
    """Every Triton launch returns at once (the interpreter would run the kernel in numpy)."""
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None


def _time_us(fn, calls: int, reps: int) -> float:
    fn()
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return min(out)  # the least-disturbed round: the machine is shared


def op_cases():
    from fold_model import ops

    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dt).requires_grad_()

    q, k, v, gate = (rnd(1, 4, 2, 16, 8) for _ in range(4))
    bias = rnd(1, 2, 16, 16)
    mask = (torch.rand(1, 4, 16, generator=g) > 0.2).to(dt)
    x = rnd(1, 4, 16, 32)
    w, b = rnd(32), rnd(32)
    lin = rnd(64, 32)
    res = rnd(1, 4, 16, 32)
    drop = (torch.rand(1, 1, 16, 32, generator=g) > 0.2).to(dt)

    def fb(fn):
        def run():
            fn().float().sum().backward()
        return run

    return {
        "attention (bias, mask, gate)": fb(lambda: ops.attention(q, k, v, bias, mask, None,
                                                                  gate)),
        "layer_norm": fb(lambda: ops.layer_norm(x, w, b)),
        "layer_norm_linear": fb(lambda: ops.layer_norm_linear(x, w, b, lin)),
        "bias_sigmoid_gate": fb(lambda: ops.bias_sigmoid_gate(x, res)),
        "bias_dropout_residual": fb(lambda: ops.bias_dropout_residual(x, res, None, drop)),
        "softmax_mask_bias": fb(lambda: ops.softmax_mask_bias(x, None, res)),
        "resolve('attention') only": lambda: ops.resolve("attention", q, k, v, bias, mask,
                                                         None, gate),
    }


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from fold_model import ops

    allow_cpu_in_interpreter()
    stub_launches()
    cases = op_cases()
    lines = ["| call (fwd+bwd unless noted) | triton us | torch us |", "|---|---|---|"]
    for name, fn in cases.items():
        row = []
        for backend in ("triton", "torch"):
            with ops.use_backend(backend):
                row.append(_time_us(fn, args.calls, args.reps))
        lines.append(f"| {name} | {row[0]:.1f} | {row[1]:.1f} |")
        print(lines[-1], flush=True)
    for name, make in (("evoformer block step (tiny)", evoformer_step),
                       ("pairformer block step (tiny)", pairformer_step)):
        step = make(torch.device("cpu"), torch.bfloat16)
        row = []
        for backend in ("triton", "torch"):
            with ops.use_backend(backend):
                row.append(_time_us(step, max(1, args.calls // 20), args.reps))
        lines.append(f"| {name} | {row[0]:.0f} | {row[1]:.0f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
