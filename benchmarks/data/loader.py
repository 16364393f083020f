"""Consumer idle time with a long tail of slow samples: ready-first vs in-order loading.

ScaleFold (section 3.2, Figure 5): with an in-order loader one slow sample blocks the training
step although later samples are ready. Workload: N samples, a fixed random 10% of them 10x slower
to prepare (the same samples for every loader, so the total preparation work is identical); the
consumer runs a fixed "training step" (a sleep standing in for the GPU step) per sample and we
measure the time it spends blocked in ``next()`` (idle) and the wall time of the epoch.

Preparation is simulated with ``time.sleep`` so that the numbers measure scheduling, not CPU
contention on a small shared machine; each sample still carries ~0.6 MB of numpy arrays through
the inter-process queue. Startup is excluded: timing starts when the first sample arrives.

Loaders, same worker count and the same number of samples in flight (``prefetch``):

* ``NonBlockingLoader`` best effort (fold_data.loader, the ScaleFold design);
* ``NonBlockingLoader(strict_order=True)`` (in order, as DataLoader);
* ``torch.utils.data.DataLoader`` (in order; ``prefetch_factor = prefetch / workers``), if torch
  is installed, and ``DataLoader(in_order=False)`` where the installed torch has it.

    python -m benchmarks.data.loader [--samples 200] [--workers 4] [--out benchmarks/results/data]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from fold_data.loader import NonBlockingLoader

from benchmarks.common.machine import host_info
from benchmarks.common.results import RESULTS, write_result


def make_schedule(n: int, slow_fraction: float, fast_s: float, slowdown: float, seed: int):
    """Per-sample preparation times: a fixed random subset is ``slowdown`` times slower."""
    rng = np.random.default_rng(seed)
    delays = np.full(n, fast_s)
    slow = rng.choice(n, size=int(round(n * slow_fraction)), replace=False)
    delays[slow] *= slowdown
    return delays.tolist()


def prepare(item: tuple[int, float]) -> dict[str, np.ndarray]:
    """A synthetic sample: wait the scheduled time, return ~0.6 MB of arrays."""
    index, delay = item
    time.sleep(delay)
    rng = np.random.default_rng(index)
    return {
        "index": np.int64(index),
        "msa_feat": rng.random((3, 16, 64, 49), dtype=np.float32),
        "aatype": rng.integers(0, 21, (3, 64)).astype(np.int32),
    }


class SleepDataset:
    """The same workload as a map-style dataset for torch's DataLoader."""

    def __init__(self, items):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return prepare(self.items[i])


def identity(sample):
    return sample  # keep numpy arrays (DataLoader would otherwise convert them to tensors)


def consume(iterable, step_s: float) -> dict:
    """Run the fixed training step per sample; measure the time blocked in next()."""
    it = iter(iterable)
    waits, order = [], []
    first = next(it)  # startup (process spawn, imports) is not what we measure
    order.append(int(first["index"]))
    t_start = time.perf_counter()
    while True:
        time.sleep(step_s)
        t0 = time.perf_counter()
        try:
            sample = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t0)
        order.append(int(sample["index"]))
    total = time.perf_counter() - t_start
    steps = len(order)
    ideal = steps * step_s
    inversions = sum(a > b for a, b in zip(order, order[1:]))
    ws = sorted(waits)
    return {
        "samples": steps,
        "complete": sorted(order) == list(range(steps)),
        "total_s": total,
        "idle_s": sum(waits),
        "idle_fraction": sum(waits) / total,
        "idle_per_step_ms": {
            "median": 1e3 * statistics.median(ws),
            "p99": 1e3 * ws[min(len(ws) - 1, int(0.99 * len(ws)))],
            "max": 1e3 * ws[-1],
        },
        "steps_idle_over_5ms": sum(w > 0.005 for w in waits),
        "overhead_vs_steps_only": total / ideal,
        "order_inversions": inversions,
    }


def big_prepare(i: int) -> dict[str, np.ndarray]:
    """A sample the size of an af2_initial one (~16 MB of float32), prepared in 10 ms."""
    time.sleep(0.01)
    return {"index": np.int64(i), "msa_feat": np.full((4, 1024, 1024), i, dtype=np.float32)}


def transport(args) -> dict:
    """Per-step consumer cost of receiving large samples: shared memory vs the result pipe."""
    out = {}
    for shm in (True, False):
        with NonBlockingLoader(args.big_samples, big_prepare, workers=2, prefetch=4,
                               shared_memory=shm) as loader:
            r = consume(loader, args.big_step_ms / 1e3)
        out["shared_memory" if shm else "pipe"] = {
            "sample_mb": 16.0,
            "idle_per_step_ms": r["idle_per_step_ms"],
            "idle_s": r["idle_s"],
            "total_s": r["total_s"],
        }
        print(f"transport {'shm' if shm else 'pipe':5s} median idle/step "
              f"{r['idle_per_step_ms']['median']:.2f} ms", flush=True)
    return out


def run(args) -> dict:
    delays = make_schedule(args.samples, args.slow_fraction, args.fast_ms / 1e3, args.slowdown,
                           args.seed)
    items = list(enumerate(delays))
    step_s = args.step_ms / 1e3
    results = {}

    for name, strict in (("nonblocking_best_effort", False), ("nonblocking_strict", True)):
        with NonBlockingLoader(items, prepare, workers=args.workers, prefetch=args.prefetch,
                               strict_order=strict) as loader:
            results[name] = consume(loader, step_s)
        print(f"{name:28s} {results[name]['idle_s']:6.2f} s idle / "
              f"{results[name]['total_s']:6.2f} s", flush=True)

    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        torch = None
    if torch is not None:
        # torch suggests <= CPU-count workers; the work here is sleep, so 4 on 2 CPUs is fine.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        variants = [("torch_dataloader", {})]
        if "in_order" in inspect.signature(DataLoader.__init__).parameters:
            variants.append(("torch_dataloader_in_order_false", {"in_order": False}))
        for name, extra in variants:
            loader = DataLoader(SleepDataset(items), batch_size=None, shuffle=False,
                                num_workers=args.workers, collate_fn=identity,
                                prefetch_factor=max(1, args.prefetch // args.workers), **extra)
            results[name] = consume(loader, step_s)
            print(f"{name:28s} {results[name]['idle_s']:6.2f} s idle / "
                  f"{results[name]['total_s']:6.2f} s", flush=True)

    base = results.get("torch_dataloader", results["nonblocking_strict"])
    for r in results.values():
        r["idle_ratio_vs_in_order"] = r["idle_s"] / base["idle_s"] if base["idle_s"] else None
        r["speedup_vs_in_order"] = base["total_s"] / r["total_s"]
    return {
        "benchmark": "data_loader",
        "machine": host_info(),
        "config": {
            "samples": args.samples,
            "workers": args.workers,
            "prefetch": args.prefetch,
            "fast_prepare_ms": args.fast_ms,
            "slow_fraction": args.slow_fraction,
            "slowdown": args.slowdown,
            "step_ms": args.step_ms,
            "seed": args.seed,
            "big_step_ms": args.big_step_ms,
            "mean_prepare_ms": 1e3 * float(np.mean(delays)),
            "baseline": "torch_dataloader" if "torch_dataloader" in results
            else "nonblocking_strict",
        },
        "results": results,
        "transport": transport(args),
    }


def markdown(doc: dict) -> str:
    m, c = doc["machine"], doc["config"]
    lines = [
        "# Non-blocking loader: consumer idle time with a long tail of slow samples",
        "",
        f"Date {m['date']}. Machine: {m['cpu']}, {m['usable_cpus']} usable of "
        f"{m['logical_cpus']} logical CPUs ({m['os']}); shared with other jobs. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in m['versions'].items() if v)}.",
        "",
        f"Workload: {c['samples']} samples, {int(c['slow_fraction'] * 100)}% of them "
        f"{c['slowdown']:g}x slower ({c['fast_prepare_ms']:g} ms vs "
        f"{c['fast_prepare_ms'] * c['slowdown']:g} ms, simulated with sleep; mean "
        f"{c['mean_prepare_ms']:.1f} ms), {c['workers']} worker processes, {c['prefetch']} samples "
        f"in flight, a {c['step_ms']:g} ms training step per sample. Idle = time the consumer is "
        f"blocked in next(); startup excluded. Ratios are against {c['baseline']}.",
        "",
        "| loader | idle (s) | idle % of wall | idle/step median, p99, max (ms) | steps idle >5 ms "
        "| wall (s) | wall / (steps x step) | idle vs in-order | speedup | order inversions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["results"].items():
        p = r["idle_per_step_ms"]
        ratio = r["idle_ratio_vs_in_order"]
        lines.append(
            f"| {name} | {r['idle_s']:.3f} | {100 * r['idle_fraction']:.1f} | "
            f"{p['median']:.2f}, {p['p99']:.1f}, {p['max']:.1f} | {r['steps_idle_over_5ms']} | "
            f"{r['total_s']:.2f} | {r['overhead_vs_steps_only']:.3f} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} | {r['speedup_vs_in_order']:.2f}x | "
            f"{r['order_inversions']} |"
        )
    t = doc["transport"]
    lines += [
        "",
        "## Transport of large samples",
        "",
        "Best-effort loader, 2 workers, 16 MB samples (about an `af2_initial` sample), "
        f"{doc['config'].get('big_step_ms', 50):g} ms step: time the consumer spends in next() "
        "per step, i.e. receiving a sample that is already prepared.",
        "",
        "| transport | idle/step median (ms) | p99 (ms) |",
        "|---|---|---|",
    ]
    for name, r in t.items():
        p = r["idle_per_step_ms"]
        lines.append(f"| {name} | {p['median']:.2f} | {p['p99']:.1f} |")
    lines += [
        "",
        "Goal: idle near zero while any sample is ready. The best-effort loader only waits when "
        "no sample at all is ready; the in-order loaders wait for each slow sample in turn.",
        "",
        "Reproduce: `python -m benchmarks.data.loader`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=8)
    p.add_argument("--fast-ms", type=float, default=20.0)
    p.add_argument("--slowdown", type=float, default=10.0)
    p.add_argument("--slow-fraction", type=float, default=0.1)
    p.add_argument("--step-ms", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--big-samples", type=int, default=40, help="transport test: 16 MB samples")
    p.add_argument("--big-step-ms", type=float, default=50.0)
    p.add_argument("--out", type=Path, default=RESULTS / "data")
    args = p.parse_args(argv)
    doc = run(args)
    md = markdown(doc)
    write_result(args.out / "data_loader.json", doc, md, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
