"""Where ``fold-train predict``'s GPU time goes, per piece and per kernel (AF3, 768 tokens).

A development tool beside ``train/predict_graphs.py`` (same checkpoint, input and predictor):
one prediction captures the graphs (CUDA graphs on, as the CLI runs on a GPU), then during a
second prediction the first replay of each piece (``trunk_inputs``, ``trunk_cycle``,
``pair_conditioning``, ``sampler_step``) is replayed once more under ``torch.profiler``. For
each piece it prints the wall time of that replay, the sum of its kernels, and the kernels that
took the most GPU time, each tagged with who wrote it:

* ``fold``: a fold-kernels Triton kernel;
* ``cublas``: a cuBLAS / cuBLASLt GEMM or its split-K reduction;
* ``torch``: a PyTorch (ATen) kernel, i.e. an op on fold-model's reference path, a copy, a cast;
* ``other``: memcpy / memset and the rest.

    source benchmarks/gpu_setup.sh
    python -m benchmarks.tools.profile_predict --out /tmp/profile_predict_af3.txt
    python -m benchmarks.tools.profile_predict --tiny --device cpu      # smoke (CPU: ATen ops)

The extra replay moves the sampler's state one step further; the prediction's numbers are not
the point here. On the CPU (``--tiny``) the capture is fold-train's ``EagerCapture`` and the
profile lists ATen ops by their own CPU time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common.machine import device_name, triton_version
from benchmarks.common.predict_inputs import af3_prediction
from benchmarks.common.results import write_atomic

PIECES = ("trunk_inputs", "trunk_cycle", "pair_conditioning", "sampler_step")


def origin(kernel: str) -> str:
    """Who wrote a kernel, from its name (see the module docstring)."""
    if "at::native" in kernel or kernel.startswith(("void at::", "at::", "aten::")):
        return "torch"
    if any(k in kernel for k in ("nvjet", "gemm", "cublas", "cutlass", "splitKreduce")):
        return "cublas"
    if kernel.startswith("_") or kernel.startswith("triton"):
        return "fold"
    return "other"


def _kernel_table(prof, device: torch.device) -> tuple[float, int, list[tuple[str, float, int]]]:
    """``(total ms, launches, [(name, ms, count)] by time)`` of the profile's device kernels
    (CPU: ATen ops by their own CPU time)."""
    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            if e.device_type.name != "CUDA":
                continue
            us = e.self_device_time_total
        else:
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        rows.append((e.key, us / 1e3, e.count))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), sum(r[2] for r in rows), rows


_PACKAGES = ("fold_model/", "fold_train/", "fold_kernels/", "fold_ops/")


def _short(frame: str) -> str:
    return frame.split("/src/")[-1].split("site-packages/")[-1]


_SITE = "site: "


class SiteAnnotations(TorchDispatchMode):
    """Runs every ATen op inside a profiler range named after the innermost project frame that
    called it (``site: fold_model/af3/embedders.py:156 queries``): the profiler then links each
    op's kernels to its source line whether or not it records Python stacks (torch 2.11 on CUDA
    kept none for the ops)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with record_function(_SITE + _project_frame()):
            return func(*args, **(kwargs or {}))


def _project_frame() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(pkg in name for pkg in _PACKAGES):
            return f"{_short(name)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _caller(event) -> str:
    """The innermost Python frame of the project that (indirectly) called a profiled op: the
    :class:`SiteAnnotations` range above it, else the op's recorded stack, else the
    Python-function events above it."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(_SITE):
            return parent.name[len(_SITE):]
        parent = parent.cpu_parent
    for frame in event.stack or ():
        if any(pkg in frame for pkg in _PACKAGES):
            return _short(frame)
    parent = event.cpu_parent
    while parent is not None:
        if any(pkg in parent.name for pkg in _PACKAGES):
            return _short(parent.name)
        parent = parent.cpu_parent
    return "?"


def _by_source(prof, device: torch.device, top: int) -> list[str]:
    """The ATen ops of an eager run whose own kernels took the most device time (CPU: own CPU
    time), each with the project's source line that called it."""
    rows: dict[tuple[str, str], list[float]] = {}
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        if any(c.name.startswith(_SITE) for c in e.cpu_children):
            continue  # the op's entry into the annotating mode: its own op is inside
        us = e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total
        if us <= 0:
            continue
        row = rows.setdefault((e.name, _caller(e)), [0.0, 0])
        row[0] += us / 1e3
        row[1] += 1
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]
    return [f"  {ms:8.3f} ms x{int(n):<4d} {op:24s} {where}" for (op, where), (ms, n) in ranked]


PROFILE_TRIES = 3  # see profile_piece: a profiler whose results cannot be read


def profile_piece(replay, facts, device: torch.device, top: int, stacks: bool = False) -> str:
    """One replay of a piece under the profiler: its kernels by time and their share by
    origin; with ``stacks`` (an eager run), also the ATen ops by source line."""
    from fold_model.host_values import known_slots

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    for attempt in range(PROFILE_TRIES):
        t0 = time.perf_counter()
        with profile(activities=activities, with_stack=stacks) as prof, known_slots(facts), \
                (SiteAnnotations() if stacks else contextlib.nullcontext()):
            replay()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        wall = (time.perf_counter() - t0) * 1e3
        try:
            total, launches, rows = _kernel_table(prof, device)
            by_source = _by_source(prof, device, top) if stacks else []
            break
        except UnicodeDecodeError:
            # torch's Python tracer (with_stack) keeps frame names as pointers into code
            # objects and reads them when the results are parsed; a code object freed inside
            # the profiled run leaves garbage there (pytorch/pytorch#64345; seen once in CI,
            # in parallel with other tests). The piece is replayed under a fresh profiler.
            if attempt == PROFILE_TRIES - 1:
                raise
    share: dict[str, float] = collections.Counter()
    for name, ms, _ in rows:
        share[origin(name)] += ms
    what = "GPU kernels" if device.type == "cuda" else "ATen ops (own CPU time)"
    lines = [f"wall {wall:.2f} ms (under the profiler), {what} {total:.2f} ms in {launches} "
             "calls; by origin: " + ", ".join(f"{k} {v:.2f} ms ({100 * v / max(total, 1e-9):.0f}%)"
                                              for k, v in sorted(share.items(),
                                                                 key=lambda kv: -kv[1]))]
    for name, ms, count in rows[:top]:
        lines.append(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}% x{count:<4d} "
                     f"{origin(name):6s} {name[:100]}")
    if stacks:
        lines.append("-- ATen ops by the source line that called them")
        lines += by_source
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny preset and input (CPU smoke)")
    p.add_argument("--sampler-steps", type=int, default=None, help="default 50 (3 with --tiny)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--stacks", action="store_true",
                   help="CUDA graphs off and Python stacks recorded: the ATen ops' kernels by "
                        "the source line that called them (eager; slower)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    steps = args.sampler_steps or (3 if args.tiny else 50)
    from fold_train.predict_af3 import predict_af3
    from fold_train.predict_graphs import AF3Predictor

    report: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        model, cfg, raw, preset, n_token, samples = af3_prediction(device, args.tiny, Path(tmp))
        if device.type == "cuda":
            predictor = AF3Predictor(model, device, precision=cfg.system.precision,
                                     cuda_graphs=not args.stacks)
        elif args.stacks:
            predictor = AF3Predictor(model, device, precision=cfg.system.precision,
                                     cuda_graphs=False)
        else:
            from fold_train.cuda_graphs import EagerCapture

            predictor = AF3Predictor(model, device, precision=cfg.system.precision,
                                     backend=EagerCapture())
        run = dict(seed=0, device=device, precision=cfg.system.precision, no_samples=samples,
                   no_steps=steps, predictor=predictor)
        predict_af3(model, raw, **run)  # captures the graphs, autotunes the kernels
        seen: dict[str, str] = {}
        plain_run = predictor._run

        def profiled_run(state, name, fn):
            out = plain_run(state, name, fn)
            if name in PIECES and name not in seen:
                seen[name] = profile_piece(state["graphs"][name][0], predictor._facts,
                                           device, args.top, args.stacks)
            return out

        predictor._run = profiled_run
        t0 = time.perf_counter()
        predict_af3(model, raw, **run)
        total = time.perf_counter() - t0
    report.append(f"# fold-train predict, AF3 {preset}, {n_token} tokens / "
                  f"{len(raw['atom_to_token'])} atoms, {samples} samples x {steps} steps, "
                  f"precision {cfg.system.precision}, CUDA graphs "
                  f"{'on' if device.type == 'cuda' and not args.stacks else 'off'}")
    report.append(f"# {device_name(device)}, torch {torch.__version__}, triton "
                  f"{triton_version()}, {time.strftime('%Y-%m-%dT%H:%M')}; the profiled "
                  f"prediction took {total:.2f} s (profiling included)")
    for name in PIECES:
        if name in seen:
            report.append(f"\n## {name}\n{seen[name]}")
    out = "\n".join(report) + "\n"
    print(out)
    if args.out:
        write_atomic(args.out, out)
    return out


if __name__ == "__main__":
    main()
