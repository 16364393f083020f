"""Where one AF3 training iteration's time and peak memory go, for rows of train/af3.py.

A development tool beside ``train/af3.py`` (same model, batch, switches and step): for each row
it runs one warm-up iteration, then

* ``--time``: one iteration under ``torch.profiler``: the wall time, the sum of GPU kernel time
  (wall well above it means the host launch path is the bottleneck), and the kernels that took
  the most GPU time;
* ``--memory``: one iteration with the CUDA caching allocator's history recorded; the alloc/free
  trace is replayed to find the peak of live bytes, and the blocks alive at that moment are
  grouped by the innermost fold-model / fold-train source line that allocated them.

    python -m benchmarks.tools.profile_af3_step --rows eager bf16 --time --memory --out prof.txt
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.af3_batch import make_batch
from benchmarks.common.af3_training import FULL, cumulative, free, make_trainer, train_iteration
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.machine import device_name
from benchmarks.common.results import write_atomic


def _where(frames: list[dict]) -> str:
    """The innermost frame in the project's packages (else the innermost frame)."""
    for f in frames:
        name = f.get("filename", "")
        if "/fold_model/" in name or "/fold_train/" in name or "/fold_kernels/" in name:
            short = name.split("/src/")[-1] if "/src/" in name else name.rsplit("/", 3)[-1]
            short = short.split("site-packages/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "(no project frame) " + (f"{frames[0].get('filename')}:{frames[0].get('line')}"
                                    if frames else "")


def memory_at_peak(step, device: torch.device, top: int) -> str:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    try:
        step()
        torch.cuda.synchronize(device)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][device.index or 0]
    # pass 1: the index of the peak of live bytes allocated during the step
    live, cur, peak, peak_at = {}, 0, 0, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > peak:
                peak, peak_at = cur, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])
    # pass 2: the blocks alive at the peak, grouped by where they were allocated
    alive: dict[int, dict] = {}
    for e in trace[:peak_at + 1]:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
        elif e["action"] == "free_completed":
            alive.pop(e["addr"], None)
    groups: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for e in alive.values():
        key = _where(e.get("frames", []))
        groups[key] += e["size"]
        counts[key] += 1
    lines = [f"allocated before the step {base / 2**20:.0f} MiB; peak of the step's own "
             f"allocations {peak / 2**20:.0f} MiB (trace of {len(trace)} events; history kept "
             f"from the step's start, so blocks allocated earlier are in the first figure)"]
    for key, nbytes in groups.most_common(top):
        lines.append(f"  {nbytes / 2**20:9.0f} MiB  x{counts[key]:<5d} {key}")
    return "\n".join(lines)


def time_profile(step, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / 1e3
    n = sum(e.count for e in events)
    lines = [f"wall {wall:.0f} ms (under the profiler), GPU kernels {total:.0f} ms in {n} "
             f"launches"]
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        ms = e.self_device_time_total / 1e3
        lines.append(f"  {ms:9.1f} ms {100 * ms / max(total, 1e-9):5.1f}% x{e.count:<6d} "
                     f"{e.key[:100]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", default=["eager", "bf16"])
    ap.add_argument("--n-token", type=int, default=384)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    ensure_kernels(device)
    sizes = dict(FULL, n_token=args.n_token, cycles=args.cycles)
    batch = make_batch(sizes["n_token"], sizes, device)
    report = [f"# {device_name()}, torch {torch.__version__}, N_token "
              f"{args.n_token}, N_cycle {args.cycles}"]
    for key, sw in cumulative(args.rows).items():
        with tempfile.TemporaryDirectory(prefix="profile_af3_") as run_dir:
            trainer, _ = make_trainer(sw, False, device, run_dir, sizes["cycles"])

            def step(trainer=trainer) -> None:  # one fold-train Trainer step, as train/af3.py
                train_iteration(trainer, batch, sizes["cycles"], seed=0)

            step()  # warm-up: compilation, autotuning, allocator (and the checkpointing plan)
            if args.time:
                report.append(f"\n## {key}: time\n{time_profile(step, args.top)}")
                print(report[-1], flush=True)
            if args.memory:
                try:
                    text = memory_at_peak(step, device, args.top)
                except Exception as e:  # e.g. out of memory with the allocator history on
                    text = f"failed: {type(e).__name__}: {str(e)[:300]}"
                report.append(f"\n## {key}: memory at the peak\n{text}")
                print(report[-1], flush=True)
            if args.out:
                write_atomic(args.out, "\n".join(report) + "\n")
            del trainer, step
        free(device)


if __name__ == "__main__":
    main()
