"""Host (Python) time per call of fold-kernels' wrappers and fold-model's dispatch.

Two modes, both on tiny tensors so that a call's time is its host work:

* **CPU** (default): Triton runs in its interpreter (``TRITON_INTERPRET=1``) and every kernel
  launch is replaced by a no-op. What is timed is only the host work that the GPU path also pays
  per call: the registry's backend choice (``supports``), argument checks, layout views, launch
  metadata, autograd bookkeeping and the allocation of outputs. The interpreter's own argument
  binding is included; the GPU's cached launcher (``fold_kernels.launch``) skips it. Outputs are
  garbage (the kernels do not run).
* **GPU** (``--gpu``): real launches on a CUDA device. A round of calls is timed without a
  synchronization inside it, so what it measures is everything a user's eager step pays on the
  host: the above, plus Triton's C launcher, the driver and the autograd engine's backward call.
  Also timed: each op's forward alone under ``no_grad``, and the fixed cost of a backward call
  (PyTorch alone: ``(x * 2).sum().backward()``).

    python -m benchmarks.tools.host_overhead              # CPU, us per call, best of --reps rounds
    python -m benchmarks.tools.host_overhead --calls 500 --reps 7
    python -m benchmarks.tools.host_overhead --gpu --out results/host_overhead_gpu.json
    python -m benchmarks.tools.host_overhead --gpu --sections ops,chain   # no block rows

Rows: each op's forward+backward through ``fold_model.ops`` (backend ``triton``, and ``torch``
for scale), the registry's ``resolve`` alone, chains of 32 nodes with one backward at the
end (what a block step pays per op: the fixed cost of a backward call spread over the chain,
beside PyTorch's native nodes and a Python autograd Function as the floors), and one tiny
Evoformer / Pairformer / diffusion transformer block step.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def stub_launches() -> None:
    """Every Triton launch returns at once (the interpreter would run the kernel in numpy)."""
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None


def _time_us(fn, calls: int, reps: int, sync=None) -> float:
    """Best of ``reps`` rounds of ``calls`` calls, in microseconds per call. ``sync`` (the GPU's)
    runs before a round starts and after its last call: the launches of a round queue up, the
    round's time is the host's."""
    fn()
    fn()
    out = []
    for _ in range(reps):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync is not None:
            sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return min(out)  # the least-disturbed round: the machine is shared


def _inputs(device) -> dict:
    """The tiny bf16 inputs of :func:`op_cases` and :func:`chain_cases`, the float ones leaves
    with gradients: attention's ``q, k, v, gate [1, 4, 2, 16, 8]``, ``bias [1, 2, 16, 16]`` and
    key ``mask``; ``x``, ``res [1, 4, 16, 32]``, LayerNorm ``w, b [32]``, ``lin [64, 32]`` and
    a row-shared dropout mask ``drop``."""
    import torch

    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device, dt).requires_grad_()

    t = {name: rnd(1, 4, 2, 16, 8) for name in ("q", "k", "v", "gate")}
    t["bias"] = rnd(1, 2, 16, 16)
    t["mask"] = (torch.rand(1, 4, 16, generator=g) > 0.2).to(device, dt)
    t["x"] = rnd(1, 4, 16, 32)
    t["w"], t["b"] = rnd(32), rnd(32)
    t["lin"] = rnd(64, 32)
    t["square"] = rnd(32, 32)  # a chain's F.linear weight: [32, 32] keeps x's shape
    t["res"] = rnd(1, 4, 16, 32)
    t["drop"] = (torch.rand(1, 1, 16, 32, generator=g) > 0.2).to(device, dt)
    return t


def op_cases(device=None):
    """``({name: forward}, resolve)``: one call of each op on tiny bf16 tensors, and the
    registry's choice of backend alone for the attention call."""
    import torch
    from fold_model import ops

    device = torch.device("cpu") if device is None else torch.device(device)
    t = _inputs(device)
    q, k, v, gate, bias, mask = (t[n] for n in ("q", "k", "v", "gate", "bias", "mask"))
    x, w, b, res = t["x"], t["w"], t["b"], t["res"]
    forwards = {
        "attention (bias, mask, gate)": lambda: ops.attention(q, k, v, bias, mask, None, gate),
        "layer_norm": lambda: ops.layer_norm(x, w, b),
        "layer_norm_linear": lambda: ops.layer_norm_linear(x, w, b, t["lin"]),
        "bias_sigmoid_gate": lambda: ops.bias_sigmoid_gate(x, res),
        "bias_dropout_residual": lambda: ops.bias_dropout_residual(x, res, None, t["drop"]),
        "softmax_mask_bias": lambda: ops.softmax_mask_bias(x, None, res),
    }
    return forwards, lambda: ops.resolve("attention", q, k, v, bias, mask, None, gate)


def _forward_backward(fn):
    def run():
        fn().float().sum().backward()
    return run


CHAIN = 32  # nodes per chain
CHAIN_MODES = ((True, "chain fwd+bwd, per node"), (False, "chain fwd no_grad, per node"))
LINEAR = "F.linear + bias (PyTorch node)"  # the chain row that _blas_rows times per BLAS


def chain_cases(device):
    """``{name: (node, x0, fold_op)}``: one node of a chain ``x = node(x)`` on a tiny bf16
    ``x0``, and whether it goes through fold-model's dispatch (then timed on both backends).
    The PyTorch rows are the floor a fold op is compared with: a native node, a Python
    autograd Function around the same native op (what any Python-level op pays), and PyTorch's
    own LayerNorm."""
    import torch
    import torch.nn.functional as F
    from fold_model import ops

    class PyMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    t = _inputs(device)
    x0, q0 = t["x"].detach(), t["q"].detach()  # a chain's start: [1, 4, 16, 32], [B, R, H, N, D]
    w, b, res, k, v, gate, bias, mask = (
        t[n] for n in ("w", "b", "res", "k", "v", "gate", "bias", "mask"))
    return {
        "x * 2 (PyTorch node)": (lambda x: x * 2, x0, False),
        # a GEMM through cuBLAS: what every projection of a block pays on the host
        LINEAR: (lambda x: F.linear(x, t["square"], b), x0, False),
        "Python autograd Function (x * 2)": (PyMul.apply, x0, False),
        "F.layer_norm (PyTorch node)": (lambda x: F.layer_norm(x, (32,), w, b), x0, False),
        "layer_norm": (lambda x: ops.layer_norm(x, w, b), x0, True),
        "bias_sigmoid_gate": (lambda x: ops.bias_sigmoid_gate(x, res), x0, True),
        "attention (bias, mask, gate)": (
            lambda x: ops.attention(x, k, v, bias, mask, None, gate), q0, True),
    }


def chain_rows(device, steps: int, reps: int, sync=None) -> list[dict]:
    """Host microseconds per node of a chain of :data:`CHAIN` nodes with one backward at its
    end, as a block's training step runs its ops: the fixed cost of the backward call is
    spread over the chain, each node pays its forward, its backward in the autograd engine
    and the gradient accumulation into the shared leaves (weights, biases)."""
    import torch
    from fold_model import ops

    def chain(node, x0, grad):
        def run():
            x = x0.clone().requires_grad_(grad)
            for _ in range(CHAIN):
                x = node(x)
            if grad:
                x.float().sum().backward()
        return run

    def per_node(run, grad):
        with torch.set_grad_enabled(grad):
            return round(_time_us(run, steps, reps, sync) / CHAIN, 1)

    rows = []
    cases = chain_cases(device)
    for name, (node, x0, fold_op) in cases.items():
        for grad, mode in CHAIN_MODES:
            row = {"call": name, "mode": mode, "triton_us": None}
            if fold_op:
                for backend in ("triton", "torch"):
                    with ops.use_backend(backend):
                        row[f"{backend}_us"] = per_node(chain(node, x0, grad), grad)
            else:
                row["torch_us"] = per_node(chain(node, x0, grad), grad)
            rows.append(row)
            print(rows[-1], flush=True)
    if device.type == "cuda":
        rows += _blas_rows(*cases[LINEAR][:2], per_node, chain)
    return rows


def _blas_rows(node, x0, per_node, chain) -> list[dict]:
    """The chain's ``F.linear`` node (:data:`LINEAR`) under each of PyTorch's GPU BLAS back
    ends (``torch.backends.cuda.preferred_blas_library``): how much host time a GEMM node costs
    through cuBLAS and through cuBLASLt (the bias epilogue's path)."""
    import torch

    prefer = getattr(torch.backends.cuda, "preferred_blas_library", None)
    if prefer is None:
        return []
    before = prefer()
    rows = []
    try:
        for lib in ("cublas", "cublaslt"):
            try:
                prefer(lib)
            except RuntimeError as err:  # a build without it (ROCm, or no cuBLASLt)
                print(f"host_overhead: no {lib} row: {err}", flush=True)
                continue
            for grad, mode in CHAIN_MODES:
                rows.append({"call": f"F.linear + bias, {lib} (PyTorch node)", "mode": mode,
                             "triton_us": None, "torch_us": per_node(chain(node, x0, grad), grad)})
                print(rows[-1], flush=True)
    finally:
        prefer(before)
    return rows


SECTIONS = ("ops", "chain", "blocks")


def profile(device, name: str, calls: int, top: int = 25) -> str:
    """cProfile of ``calls`` calls of the op case ``name`` (:func:`op_cases`) on the triton
    backend, forward under ``no_grad`` and forward + backward, sorted by own time."""
    import cProfile
    import io
    import pstats

    import torch
    from fold_model import ops

    cases, _ = op_cases(device)
    if name not in cases:
        raise SystemExit(f"host_overhead --profile: unknown call {name!r}; one of {list(cases)}")
    out = []
    for mode, fn, grad in (("fwd, no_grad", cases[name], False),
                           ("fwd+bwd", _forward_backward(cases[name]), True)):
        with ops.use_backend("triton"), torch.set_grad_enabled(grad):
            for _ in range(3):
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                fn()
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        out += [f"## {name}, {mode}, {calls} calls"]
        out += [line for line in buf.getvalue().splitlines() if line.strip()]
    return "\n".join(out)


def measure(device, calls: int, reps: int, sections=SECTIONS) -> list[dict]:
    """Rows ``{"call", "mode", "triton_us", "torch_us"}`` of the ``sections`` asked for: "ops",
    each op forward+backward and forward alone under ``no_grad`` (on a GPU also the fixed cost
    of a backward call, ``torch_us`` only) and ``resolve``; "chain", :func:`chain_rows`;
    "blocks", the tiny block steps and forwards."""
    import torch
    from fold_model import ops

    from benchmarks.common.blocks import diffusion_step, evoformer_step, pairformer_step

    gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if gpu else None

    def both(fn, n):
        row = {}
        for backend in ("triton", "torch"):
            with ops.use_backend(backend):
                row[f"{backend}_us"] = round(_time_us(fn, n, reps, sync), 1)
        return row

    rows = []
    if "ops" in sections:
        cases, resolve = op_cases(device)
        for name, fwd in cases.items():
            rows.append({"call": name, "mode": "fwd+bwd", **both(_forward_backward(fwd), calls)})
            print(rows[-1], flush=True)
        for name, fwd in cases.items():  # inference: no autograd graph
            with torch.no_grad():
                rows.append({"call": name, "mode": "fwd, no_grad", **both(fwd, calls)})
            print(rows[-1], flush=True)
        if gpu:
            x = torch.randn(64, 128, device=device, requires_grad=True)
            backward = _forward_backward(lambda: x * 2)
            rows.append({"call": "(x * 2).sum().backward(), PyTorch alone", "mode": "fwd+bwd",
                         "triton_us": None, "torch_us": round(_time_us(backward, calls, reps, sync),
                                                              1)})
            print(rows[-1], flush=True)
        rows.append({"call": "resolve('attention') only", "mode": "-", **both(resolve, calls)})
        print(rows[-1], flush=True)
    if "chain" in sections:
        rows += chain_rows(device, max(1, calls // 10), reps, sync)
    if "blocks" not in sections:
        return rows
    for name, make in (("evoformer block step (tiny)", evoformer_step),
                       ("pairformer block step (tiny)", pairformer_step),
                       ("diffusion transformer block step (tiny)", diffusion_step)):
        step = make(device, torch.bfloat16)
        rows.append({"call": name, "mode": "fwd+bwd", **both(step, max(1, calls // 20))})
        print(rows[-1], flush=True)
        forward = make(device, torch.bfloat16, forward_only=True)
        with torch.no_grad():
            rows.append({"call": name.replace("step", "forward"), "mode": "fwd, no_grad",
                         **both(forward, max(1, calls // 20))})
        print(rows[-1], flush=True)
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    from benchmarks.common.machine import pin_note

    def cell(v):
        return "-" if v is None else f"{v:.1f}"

    lines = [f"# Host time per call, {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, Triton {meta['triton']}; mode {meta['mode']}; best of "
             f"{meta['reps']} rounds of {meta['calls']} calls (block steps: calls / 20); "
             + pin_note(meta.get("cpus_pinned")),
             "",
             "| call | mode | triton us | torch us |", "|---|---|---|---|"]
    lines += [f"| {r['call']} | {r['mode']} | {cell(r['triton_us'])} | {cell(r['torch_us'])} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    # torch, not Triton: TRITON_INTERPRET can still be set below
    from benchmarks.common.machine import add_pin_argument, pin_cpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--gpu", action="store_true",
                    help="real launches on the current CUDA device (default: CPU, stubbed)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside it)")
    ap.add_argument("--profile", default=None, metavar="CALL",
                    help="instead of timing: cProfile CALL (an op row's name, e.g. layer_norm) "
                         "on the triton backend, forward alone under no_grad and forward + "
                         "backward, and print where the host time goes")
    add_pin_argument(ap)
    args = ap.parse_args(argv)
    pinned = pin_cpus(args.pin_cpu)
    if not args.gpu:
        # before triton is imported (fold-kernels imports it): launches become Python calls
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from benchmarks.common.backends import allow_cpu_in_interpreter, ensure_kernels
    from benchmarks.common.machine import versions
    from benchmarks.common.results import publish

    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("host_overhead --gpu: no CUDA device")
        device = torch.device("cuda")
        ensure_kernels(device)
    else:
        from fold_kernels import tuning

        if not tuning.interpreting():
            raise SystemExit("host_overhead: Triton was imported before TRITON_INTERPRET=1 "
                             "could be set; run it as its own process (python -m ...)")
        torch.set_num_threads(1)
        device = torch.device("cpu")
        allow_cpu_in_interpreter()
        stub_launches()
    if args.profile is not None:
        text = profile(device, args.profile, args.calls)
        print(text)
        if args.out is not None:
            from benchmarks.common.results import write_atomic

            write_atomic(args.out, text + "\n")
        return []
    sections = tuple(x.strip() for x in args.sections.split(",") if x.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"host_overhead: unknown --sections {sorted(unknown)}; "
                         f"choose from {','.join(SECTIONS)}")
    rows = measure(device, args.calls, args.reps, sections)
    meta = {**versions(device), "mode": "gpu" if args.gpu else "cpu, launches stubbed",
            "cpus_pinned": pinned,
            "calls": args.calls, "reps": args.reps, "sections": list(sections)}
    publish(args.out, meta, rows, markdown(meta, rows))
    return rows


if __name__ == "__main__":
    main()
