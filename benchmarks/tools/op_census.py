"""Which aten copies, casts and reductions a block's forward+backward runs around the kernels.

A development tool (CPU or GPU). It runs one training step of a tiny AF2 Evoformer block and a
tiny AF3 Pairformer block with the ``torch`` backend and with fold-kernels' ``triton`` backend,
records every aten op through a ``TorchDispatchMode`` (ops inside a Triton launch are not
counted: on CPU the interpreter's own host copies would otherwise show) and prints, for the
copy-like ops (``copy_``, ``clone``, ``_to_copy``, ``sum``, ...), how often each backend calls
them and from which line of fold_kernels / fold_model. That is how the ``direct_copy_kernel`` and
``reduce_kernel`` launches of the GPU profile are traced back to their source.

    TRITON_INTERPRET=1 python -m benchmarks.tools.op_census    # CPU (Triton interpreter)
    python -m benchmarks.tools.op_census --sites 12             # more call sites per op

On CPU the registry's ``supports`` predicates refuse CPU tensors, so this script (only) lets
them accept CPU tensors while the interpreter is on. bf16 weights and inputs as on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import traceback
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.common.backends import allow_cpu_in_interpreter  # noqa: E402
from benchmarks.common.blocks import evoformer_step, pairformer_step  # noqa: E402
from benchmarks.common.results import write_atomic  # noqa: E402

COPY_OPS = ("copy_", "clone", "_to_copy", "contiguous", "sum", "expand_copy", "cat",
            "index", "where", "fill_", "zero_", "ne", "mul")
_PKG_MARKERS = (f"fold_kernels{os.sep}", f"fold_model{os.sep}")


class Census(TorchDispatchMode):
    """Counts aten ops (by overload packet name) and the fold_* source line that issued each."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            self.counts[name] += 1
            if name in COPY_OPS:
                self.sites[name][_site()] += 1
        return func(*args, **(kwargs or {}))


def _site() -> str:
    """The innermost fold_kernels / fold_model frame of the current stack (file:line func)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if any(m in frame.filename for m in _PKG_MARKERS):
            short = frame.filename.split("src" + os.sep)[-1]
            return f"{short}:{frame.lineno} {frame.name}"
    return "(autograd engine / torch)"


_ACTIVE: list[Census] = []


def _pause_inside_launches(census: Census) -> None:
    """Do not count the ops that Triton's interpreter runs to stage a kernel's arguments."""
    _ACTIVE[:] = [census]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    run = InterpretedFunction.run
    if getattr(run, "_census", False):
        return

    def paused_run(self, *args, **kwargs):
        from torch.utils._python_dispatch import _disable_current_modes

        active = _ACTIVE[0]
        active.paused += 1
        try:
            with _disable_current_modes():  # every dispatch mode (host_syncs' too)
                return run(self, *args, **kwargs)
        finally:
            active.paused -= 1

    paused_run._census = True  # type: ignore[attr-defined]
    InterpretedFunction.run = paused_run


def census(step, backend: str) -> Census:
    from fold_model import ops

    with ops.use_backend(backend):
        step()  # warm-up: lazy initializations are not per-step work
        c = Census()
        _pause_inside_launches(c)
        with c:
            step()
    return c


def report(targets: dict, sites: int) -> str:
    lines = []
    for name, step in targets.items():
        res = {b: census(step, b) for b in ("torch", "triton")}
        total = {b: sum(c.counts.values()) for b, c in res.items()}
        lines.append(f"\n## {name}: aten ops per fwd+bwd step: torch {total['torch']}, "
                     f"triton {total['triton']} (Triton launches not counted)")
        lines.append("| op | torch | triton |")
        lines.append("|---|---|---|")
        for op in COPY_OPS:
            t, k = res["torch"].counts[op], res["triton"].counts[op]
            if t or k:
                lines.append(f"| {op} | {t} | {k} |")
        for op in COPY_OPS:
            top = res["triton"].sites.get(op)
            if not top:
                continue
            lines.append(f"\ntriton backend, {op} call sites:")
            for site, n in top.most_common(sites):
                lines.append(f"  {n:4d}  {site}")
    return "\n".join(lines)


def host_syncs_report(targets: dict) -> str:
    """fold_train.cuda_graphs.host_syncs of each step with each backend: the ops that would
    synchronize a GPU with the host (and so break CUDA-graph capture). Kernel launches are
    paused out of the count (the interpreter's own staging copies are not the GPU path's)."""
    from fold_model import ops
    from fold_train.cuda_graphs import host_syncs

    lines = ["\n## host synchronizations per step (fold_train.cuda_graphs.host_syncs)"]
    for name, step in targets.items():
        for backend in ("torch", "triton"):
            with ops.use_backend(backend):
                step()
                c = Census()
                _pause_inside_launches(c)  # only to exclude the interpreter's own copies
                with c:
                    found = host_syncs(step)
            lines.append(f"{name}, {backend}: {found or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sites", type=int, default=8, help="call sites shown per op")
    ap.add_argument("--syncs", action="store_true",
                    help="also list host synchronizations (fold_train.cuda_graphs.host_syncs)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    allow_cpu_in_interpreter()
    dtype = torch.bfloat16
    targets = {"evoformer (tiny, N_seq 6, N_res 10)": evoformer_step(device, dtype),
               "pairformer (tiny, N 10)": pairformer_step(device, dtype)}
    text = report(targets, args.sites)
    if args.syncs:
        text += "\n" + host_syncs_report(targets)
    print(text)
    if args.out:
        write_atomic(args.out, text + "\n")
    return text


if __name__ == "__main__":
    main()
