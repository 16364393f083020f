"""Where a block's forward+backward time goes, per GPU kernel, for each op backend.

A development tool next to the timing benchmarks: it profiles one training step (forward +
backward) of an AF2 Evoformer block, an AF3 Pairformer block or one EvoAttention call with
``torch.profiler`` and prints, for the ``torch`` backend (fold-model's reference ops) and the
``auto`` backend (fold-kernels' Triton kernels where installed), the kernels that took the most
GPU time, their share, and the CPU wall time of the step (launch overhead shows as wall time well
above the kernels' sum).

    python -m benchmarks.tools.profile_block evoformer:128,256 pairformer:256 attention:256,256,4,32
    python -m benchmarks.tools.profile_block pairformer:256 --out /tmp/profile.txt
    python -m benchmarks.tools.profile_block evoformer:128,256 --graphs   # replays: kernels only

Targets: ``evoformer:N_seq,N_res``, ``pairformer:N_token``, ``diffusion:N_token,samples``
(one diffusion transformer block), ``attention:R,N,H,D`` (bias with
gradient, key mask with holes). bf16 weights and inputs, training mode, after ``--warmup`` steps
(kernel compilation and autotuning happen there).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common.backends import ensure_kernels
from benchmarks.common.machine import add_pin_argument, device_name, pin_cpus, pin_note
from benchmarks.common.results import write_atomic
from benchmarks.common.targets import build


def host_profile(step, top: int) -> str:
    """The Python functions that took the most host time in one step (launch overhead)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    torch.cuda.synchronize()
    out = []
    for order in ("tottime", "cumulative"):  # own time per function, then time under it
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        out += [f"-- host profile by {order}"]
        out += [line for line in buf.getvalue().splitlines() if line.strip()]
    return "\n".join(out)


def profile_step(step, warmup: int, top: int, host: bool = False) -> str:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / 1e3
    n_launch = sum(e.count for e in events)
    lines = [f"wall {wall:.2f} ms, GPU kernels {total:.2f} ms in {n_launch} launches"]
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        ms = e.self_device_time_total / 1e3
        lines.append(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}% x{e.count:<4d} "
                     f"{e.key[:110]}")
    if host:
        lines.append(host_profile(step, top))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--backends", nargs="+", default=["torch", "auto"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--host", action="store_true", help="also cProfile the host side")
    ap.add_argument("--graphs", action="store_true",
                    help="profile CUDA-graph replays of the step (kernels without host overhead)")
    ap.add_argument("--out", type=Path, default=None)
    add_pin_argument(ap)
    args = ap.parse_args(argv)
    pinned = pin_cpus(args.pin_cpu)
    from fold_model import ops

    device, dtype = torch.device("cuda"), torch.bfloat16
    found = ensure_kernels(device, needed=any(b != "torch" for b in args.backends))
    report = [f"# {device_name()}, torch {torch.__version__}, "
              f"attention backends {found}; " + pin_note(pinned)]
    for target in args.targets:
        for backend in args.backends:
            ctx = contextlib.nullcontext() if backend == "auto" else ops.use_backend(backend)
            with ctx:
                text = profile_step(build(target, device, dtype, args.graphs), args.warmup,
                                    args.top, host=args.host and backend != "torch"
                                    and not args.graphs)
            tag = " (CUDA graph replay)" if args.graphs else ""
            report.append(f"\n## {target} backend={backend}{tag}\n{text}")
            print(report[-1], flush=True)
            torch.cuda.empty_cache()
    out = "\n".join(report) + "\n"
    if args.out:
        write_atomic(args.out, out)
    return out


if __name__ == "__main__":
    main()
