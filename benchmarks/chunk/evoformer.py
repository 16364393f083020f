"""AutoChunk vs no chunking vs expert chunking: Evoformer inference (FastFold section 6.4).

An AF2 Evoformer stack (default sizes of ``EvoformerConfig``: c_m 256, c_z 128, ...; ``--blocks``
blocks, default 2: the peak of a stack is the peak of one block plus the two streams, and time
per block is what matters) in bf16, eval mode, ``torch.no_grad()``, N_seq 128, masks with holes.
For each N_res (512, 1024, 2048, 3072, 4096), four modes, each one *row* of the results:

* (a) ``none``: no chunking;
* (b) ``manual64``: fold-model's expert chunking, ``set_chunk_size(64)``;
* (c) ``auto_equal``: ``fold_chunk`` AutoChunk with the budget set to (b)'s measured peak;
* (d) ``auto_min``: AutoChunk at the smallest budget it can meet (``--min-chunk``, default 16).

Built for a short GPU window. Rows run in order of importance: N_res 512, 1024, 2048 (all four
modes each), then 3072 and 4096. After every row a line is printed (flushed) and the JSON
(``--out``) and its markdown table (same name, ``.md``) are rewritten atomically, so whatever
finished survives a kill. Out of memory is caught per row (``"OOM"``), an unmeetable AutoChunk
budget is recorded as an error, and ``--budget-seconds`` stops starting rows whose predicted time
(from the rows already measured, scaled by N_res^3, else the model below) would pass the end.

Per row: one call measures the activation peak (``torch.cuda.max_memory_allocated()`` during the
call minus what was allocated before: weights, inputs, kept outputs) and its time (``first_ms``,
which includes the caching allocator's first ``cudaMalloc``s); then up to ``--reps`` timed calls
while the row stays under ``--row-seconds``; ``ms`` is their median (CUDA events), or the first
call's when none fit (``timed_calls`` 0). One small warm-up call of the stack at the start
initialises CUDA and cuBLAS. AutoChunk planning is timed apart: ``planner_s`` per N_res (trace
and FakeTensor run, shared by (c) and (d) through one ``fold_chunk.ChunkPlanner``) and
``plan_s`` per mode (search, code generation, fake run of the generated code; for (d) also the
smallest-peak search). Outputs of (b), (c), (d) are compared with (a), or with (b) where (a) runs
out of memory (bf16: relative norm error ~1e-2). Goals (issue): (d) at most 10% of (a)'s peak;
(c) at least 1.15x (b)'s speed; AutoChunk within 5% of (a)'s speed where (a) fits.

Expected cost of a full run on one H100 80GB (defaults: 2 blocks, N_seq 128, reps 3, row
seconds 30), from ``--plan-only`` on a CPU. Planning is the same work there as on the GPU host
(it sees shapes, not data, so it is flat in N_res); measured on a shared 2-core machine: the
planner (trace + fake run) 0.5-0.7 s (about 2 s for the first in a process: FakeTensor set-up),
(c) 0.6-0.9 s, (d) 0.7-1.1 s: about 2 s per N_res, 12 s in all (29 s for the same plans before
fold-chunk's ``ChunkPlanner`` and search memo, under the same load).

GPU time per call of the 2-block stack, from a roofline of the traced aten ops (FLOPs at 600
TFLOP/s, bytes at 2.6 TB/s, 4 us per op) scaled by 1.76, the factor that matches the eager
block measured on an H100 (``results/model/model_evoformer.md``: 6.9 ms at N_seq 128, N_res 256;
51.6 ms at 512, 512); per block that is about ``4.9e-10 s * N_seq * N_res^2 + 8.4e-11 s *
N_res^3`` (the triangle attention logits, ``4 N_res^3`` per module, dominate at large N_res).
Estimated peaks are AutoChunk's (FakeTensor) estimates:

    N_res  peak (a) / (b) / (d)        s per call (a) / (b),(c) / (d)   row time (b)-(d), calls
    512    2.2 / 0.8 / 0.29 GiB        0.06 / 0.06 / 0.07               0.25 s each, 4
    1024   16.8 / 2.6 / 1.08 GiB       0.31 / 0.32 / 0.34               1.3 s each, 4
    2048   131 GiB: OOM / 9.8 / 4.2    - / 2.1 / 2.1                    8 s each, 4
    3072   439 GiB: OOM / 21.5 / 9.3   - / 6.4 / 6.3                    26 s each, 4
    4096   1036 GiB: OOM / 37.8 / 16.4 - / 14.5 / 14.2                  29 s each, 2

Total: about 195 s of GPU work (3.3 min; (a)'s OOMs should fail within seconds) plus about
12 s of planning and 20-40 s of start-up (imports, CUDA init): about 4 min. The 512-2048 rows,
the ones that matter most, are done within about 1.5 min. Give ``--budget-seconds`` a minute
under the window (e.g. 360 for a 7-minute call; it counts from the end of the Python imports):
a row predicted to end later is recorded as skipped.

    python -m benchmarks.chunk.evoformer --budget-seconds 360 \\
        --out benchmarks/results/chunk/chunk_evoformer.json                # CUDA
    python -m benchmarks.chunk.evoformer --device cpu --small --out /tmp/chunk.json   # smoke
    python -m benchmarks.chunk.evoformer --plan-only                     # CPU, real sizes

``--plan-only`` plans every N_res on meta tensors (no memory, no GPU) and prints the planning
times, the estimated peaks and the predicted GPU time of each row. Op backend: ``--backend
torch`` (default) runs (a)-(d) on fold-model's PyTorch reference ops, like for like;
``--backend auto`` lets every contender use fold-kernels where installed (AutoChunk's code calls
the ops through the registry: they are leaf nodes of its traced graphs). On CPU the peak is
measured with ``fold_chunk.AllocationTracker`` (live tensor bytes).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import fold_chunk as fc
import torch
from fold_model import ops
from fold_model.af2.config import EvoformerConfig
from fold_model.af2.evoformer import EvoformerStack
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from benchmarks.common.machine import device_name
from benchmarks.common.results import RESULTS, write_atomic

N_RES = [512, 1024, 2048, 3072, 4096]
FIRST_TIER = 2048  # N_res up to this first, all modes; larger N_res after
SMALL_N_RES = [24, 37]
MODES = ("none", "manual64", "auto_equal", "auto_min")
MANUAL_CHUNK = 64
# Per-block eager time on an H100 in seconds, bf16 no-grad: a * N_seq * N_res^2 + b * N_res^3
# (roofline of the traced ops x 1.76, calibrated on results/model/model_evoformer.md; see the doc).
H100_BLOCK_S = (4.9e-10, 8.4e-11)
# Planning seconds per block before any is measured (planner; one plan): twice --plan-only's
# first-in-process times on a shared 2-core CPU (see the doc).
PLAN_GUESS_S_PER_BLOCK = (2.0, 1.5)
ROOFLINE = dict(flops=600e12, bytes=2.6e12, launch_s=4e-6, calibration=1.76)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """(ms, output) of one call."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        _sync(device)
        return start.elapsed_time(end), out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def measure(fn: Callable[[], Any], device: torch.device, reps: int, row_seconds: float,
            deadline: float) -> tuple[dict, Any]:
    """Peak and time of ``fn()`` (see the module doc); returns (result, output of the first
    call)."""
    t_row = time.monotonic()
    with torch.no_grad():
        if device.type == "cuda":
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            first_ms, out = _timed(fn, device)
            peak = torch.cuda.max_memory_allocated(device) - before
        else:  # live-tensor accounting; the tracked call is slower, so first_ms is indicative
            tracker = fc.AllocationTracker()
            with tracker:
                first_ms, out = _timed(fn, device)
            peak = tracker.peak
        times: list[float] = []
        last_s = first_ms / 1e3
        while len(times) < reps:
            now = time.monotonic()
            if now + last_s > deadline or (times and now - t_row + last_s > row_seconds):
                break
            ms, rep_out = _timed(fn, device)
            del rep_out
            times.append(ms)
            last_s = ms / 1e3
    res = {"ms": statistics.median(times) if times else first_ms, "first_ms": first_ms,
           "timed_calls": len(times), "peak_bytes": int(peak)}
    return res, out


def _rel_err(out: Any, ref: Any) -> float:
    """Largest relative norm error over the output tensors, accumulated in float64 slices (no
    whole fp32 copy of a 4096^2 pair tensor)."""
    errs = []
    for o, r in zip(out, ref):
        num = den = 0.0
        for k in range(0, o.shape[0], 64):
            a, b = o[k:k + 64].double(), r[k:k + 64].double()
            num += (a - b).pow(2).sum().item()
            den += b.pow(2).sum().item()
        errs.append((num / den) ** 0.5 if den > 0 else float("inf"))
    return max(errs)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def n_calls(call_s: float, reps: int, row_seconds: float) -> int:
    """Calls :func:`measure` makes of a ``call_s``-second function: the first, one timed call,
    and more timed calls (up to ``reps``) while the row stays under ``row_seconds``."""
    more = int(row_seconds // max(call_s, 1e-9)) - 1
    return 1 + min(reps, max(1, more))


def predicted_call_s(n_seq: int, n_res: int, blocks: int) -> float:
    a, b = H100_BLOCK_S
    return blocks * (a * n_seq * n_res**2 + b * n_res**3)


class _Roofline(TorchDispatchMode):
    """Sum over aten ops of ``max(flops / F, bytes / B, launch)`` (meta tensors: nothing runs)."""

    VIEWS = {"view", "_unsafe_view", "transpose", "permute", "expand", "unsqueeze", "squeeze",
             "slice", "select", "t", "alias", "as_strided", "split", "unbind", "detach",
             "split_with_sizes", "chunk", "narrow"}

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ in self.VIEWS:
            return out
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        count = flop_registry.get(func.overloadpacket)
        flops = count(*args, **kwargs, out_val=out) if count is not None else 0
        self.seconds += max(flops / ROOFLINE["flops"], nbytes / ROOFLINE["bytes"],
                            ROOFLINE["launch_s"])
        return out


def roofline_s(fn: Callable[[], Any]) -> float:
    """Predicted H100 seconds of ``fn()`` on meta tensors (calibrated, see the module doc)."""
    mode = _Roofline()
    with torch.no_grad(), mode:
        fn()
    return mode.seconds * ROOFLINE["calibration"]


class Benchmark:
    """Runs the rows in order, keeps one N_res's inputs, planner and reference output at a time,
    and writes the results after every row."""

    def __init__(self, stack: EvoformerStack, args: argparse.Namespace, device: torch.device,
                 dtype: torch.dtype, n_seq: int, min_chunk: int, meta: dict,
                 t_start: float | None = None) -> None:
        self.stack, self.opts, self.device, self.dtype = stack, args, device, dtype
        self.n_seq, self.min_chunk = n_seq, min_chunk
        self.t_start = time.monotonic() if t_start is None else t_start
        budget = args.budget_seconds
        self.deadline = self.t_start + budget if budget is not None else float("inf")
        self.result = meta | {"rows": []}
        self.rows: dict[int, dict] = {}
        self.call_s: dict[tuple[int, str], float] = {}  # measured seconds per call
        self.plan_s_max = self.planner_s_max = 0.0  # measured planning, for predictions
        self.n_res: int | None = None
        self.inputs: tuple | None = None
        self.planner: fc.ChunkPlanner | None = None
        self.ref: tuple[str, Any] | None = None

    # -- per-N_res state -------------------------------------------------------------------
    def _enter(self, n: int) -> None:
        if self.n_res == n:
            return
        self.inputs = self.planner = self.ref = None
        self._free()
        self.n_res = n
        c_m = self.stack.blocks[0].msa_att_row.layer_norm_m.weight.shape[0]
        c_z = self.stack.blocks[0].tri_mul_out.layer_norm_in.weight.shape[0]
        gen = torch.Generator().manual_seed(n)
        dev, dt, s = self.device, self.dtype, self.n_seq
        m = torch.randn(s, n, c_m, generator=gen).to(dev, dt)  # [N_seq, N_res, C_m]
        z = torch.randn(n, n, c_z, generator=gen).to(dev, dt)  # [N_res, N_res, C_z]
        msa_mask = (torch.rand(s, n, generator=gen) > 0.1).to(dev, dt)  # holes
        pair_mask = (torch.rand(n, n, generator=gen) > 0.1).to(dev, dt)
        self.inputs = (m, z, msa_mask, pair_mask)
        self._row(n)

    def _row(self, n: int) -> dict:
        """The results of N_res ``n`` (made on first use, kept in N_res order)."""
        if n not in self.rows:
            self.rows[n] = {"n_seq": self.n_seq, "n_res": n}
            self.result["rows"].append(self.rows[n])
            self.result["rows"].sort(key=lambda r: r["n_res"])
        return self.rows[n]

    def _planner(self) -> fc.ChunkPlanner:
        if self.planner is None:
            t0 = time.perf_counter()
            self.stack.set_chunk_size(None)
            self.planner = fc.ChunkPlanner(self.stack, self.inputs)
            row = self.rows[self.n_res]
            row["planner_s"] = time.perf_counter() - t0
            self.planner_s_max = max(self.planner_s_max, row["planner_s"])
            row["estimated_peak_none_bytes"] = self.planner.estimate_peak()
        return self.planner

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- prediction for --budget-seconds ---------------------------------------------------
    def predicted_row_s(self, n: int, mode: str) -> float:
        same_mode = [(k, v) for (k, md), v in self.call_s.items() if md == mode and k < n]
        same_n = [v for (k, _), v in self.call_s.items() if k == n]
        if same_mode:
            k, v = max(same_mode)
            call = v * (n / k) ** 3  # the triangle ops, N_res^3, dominate at large N_res
        elif same_n:
            call = max(same_n)
        else:
            call = predicted_call_s(self.n_seq, n, self.opts.blocks)
        calls = n_calls(call, self.opts.reps, self.opts.row_seconds)
        plan = 0.0
        if mode.startswith("auto"):  # this CPU's measured planning, else the guess
            guess_planner, guess_plan = (self.opts.blocks * g for g in PLAN_GUESS_S_PER_BLOCK)
            plan = self.plan_s_max or guess_plan
            if self.planner is None or self.n_res != n:  # the planner's trace and fake run
                plan += self.planner_s_max or guess_planner
        return plan + calls * call

    # -- rows ------------------------------------------------------------------------------
    def run_row(self, n: int, mode: str) -> None:
        predicted = self.predicted_row_s(n, mode)
        if time.monotonic() + predicted > self.deadline:
            self._record(n, mode, {"status": "skipped", "reason":
                                   f"time budget (predicted {predicted:.0f} s)"})
            return
        self._enter(n)
        res: dict[str, Any] = {}
        failure: dict[str, str] = {}
        out = None
        try:
            out = self._measure_mode(n, mode, res)
        except Exception as exc:  # noqa: BLE001 - one failed row must not end a short GPU window
            if _is_oom(exc):
                failure = {"status": "OOM", "message": str(exc).splitlines()[0][:300]}
            else:
                failure = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
                traceback.print_exc(file=sys.stderr)
        finally:
            self.stack.set_chunk_size(None)
        if failure or out is None:  # outside the except block: its traceback and tensors are gone
            out = None
            self._free()
            self._record(n, mode, res | (failure or {}))
            return
        res["status"] = "ok"
        self.call_s[(n, mode)] = res["ms"] / 1e3
        if self.ref is None:
            self.ref = (mode, out)
        else:
            res[f"rel_err_vs_{self.ref[0]}"] = _rel_err(out, self.ref[1])
        del out
        self._free()
        self._record(n, mode, res)

    def _measure_mode(self, n: int, mode: str, res: dict) -> Any:
        """Plan (AutoChunk modes) and measure one row into ``res``; its output, or None when the
        plan failed (``res`` then says why)."""
        fn: Callable[[], Any]
        if mode in ("none", "manual64"):
            self.stack.set_chunk_size(None if mode == "none" else MANUAL_CHUNK)
            stack, inputs = self.stack, self.inputs
            fn = lambda: stack(*inputs)  # noqa: E731
        else:
            chunked = self._plan(mode, self.rows[n], res)
            if chunked is None:
                return None
            inputs = self.inputs
            fn = lambda: chunked(*inputs)  # noqa: E731
        measured, out = measure(fn, self.device, self.opts.reps, self.opts.row_seconds,
                                self.deadline)
        res.update(measured)
        return out

    def _plan(self, mode: str, row: dict, res: dict) -> fc.AutoChunked | None:
        if mode == "auto_equal":
            b = row.get("manual64", {})
            if "peak_bytes" not in b or b.get("status") != "ok":
                res.update(status="error", error="no measured peak of (b) manual64")
                return None
        planner = self._planner()
        t1 = time.perf_counter()
        if mode == "auto_equal":
            budget = row["manual64"]["peak_bytes"]
        else:
            budget = planner.smallest_reachable_peak(min_chunk=self.min_chunk)
        try:
            chunked = planner.autochunk(budget, min_chunk=self.min_chunk)
        except fc.MemoryBudgetError as exc:
            res.update(status="error", error=str(exc), budget_bytes=budget)
            return None
        finally:
            res["plan_s"] = time.perf_counter() - t1
        self.plan_s_max = max(self.plan_s_max, res["plan_s"])
        report = chunked.report
        res.update(budget_bytes=budget, n_regions=len(report.regions),
                   estimated_peak_bytes=report.simulated_peak_after, report=str(report))
        return chunked

    def _record(self, n: int, mode: str, res: dict) -> None:
        row = self._row(n)
        row[mode] = res
        _goals(row)
        elapsed = time.monotonic() - self.t_start
        self.result["elapsed_s"] = elapsed
        print(f"[{elapsed:7.1f} s] N_res {n:5d} {mode:10s} {_fmt(res)}"
              + (f"  plan {res['plan_s']:.1f} s" if "plan_s" in res else ""), flush=True)
        write_results(self.result, self.opts.out)


def _goals(row: dict) -> None:
    a, b, c, d = (row.get(k) for k in MODES)
    ok = lambda x: isinstance(x, dict) and x.get("status") == "ok"  # noqa: E731
    goals: dict = {}
    if ok(a) and ok(d):
        goals["auto_min_peak_over_none"] = d["peak_bytes"] / a["peak_bytes"]
        goals["auto_min_peak_at_most_10pct"] = goals["auto_min_peak_over_none"] <= 0.10
    if ok(b) and ok(c):
        goals["auto_equal_speedup_over_manual64"] = b["ms"] / c["ms"]
        goals["auto_equal_at_least_1.15x"] = goals["auto_equal_speedup_over_manual64"] >= 1.15
        goals["auto_equal_peak_over_manual64"] = c["peak_bytes"] / b["peak_bytes"]
    if ok(a) and ok(c):
        goals["auto_equal_time_over_none"] = c["ms"] / a["ms"]
        goals["auto_within_5pct_of_none"] = goals["auto_equal_time_over_none"] <= 1.05
    row["goals"] = goals


def _fmt(x: Any) -> str:
    if not isinstance(x, dict):
        return "-" if x is None else str(x)
    if x.get("status") != "ok":
        return str(x.get("status", "error"))
    return f"{x['ms']:.1f} ms / {x['peak_bytes'] / 2**20:.1f} MiB"


def write_results(result: dict, out: Path) -> None:
    write_atomic(out, json.dumps(result, indent=2))
    write_markdown(result, out.with_suffix(".md"))


def write_markdown(result: dict, path: Path) -> None:
    lines = [
        f"# AutoChunk, Evoformer inference ({result['device_name']}, {result['dtype']}, "
        f"{result['blocks']} blocks, N_seq {result['n_seq']})",
        "",
        "| N_res | (a) none | (b) manual 64 | (c) auto, budget (b) | (d) auto, min budget |"
        " (d)/(a) peak | (b)/(c) speed | (c)/(a) time | plan s (trace; c; d) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        g = row.get("goals", {})
        cells = [str(row["n_res"])] + [_fmt(row.get(k)) for k in MODES]
        for key in ("auto_min_peak_over_none", "auto_equal_speedup_over_manual64",
                    "auto_equal_time_over_none"):
            cells.append(f"{g[key]:.3f}" if key in g else "-")
        plan = [row.get("planner_s")] + [(row.get(k) or {}).get("plan_s") for k in MODES[2:]]
        cells.append("; ".join("-" if p is None else f"{p:.1f}" for p in plan))
        lines.append("| " + " | ".join(cells) + " |")
    write_atomic(path, "\n".join(lines) + "\n")


def row_order(n_res: list[int]) -> list[tuple[int, str]]:
    """The most important rows first: N_res up to FIRST_TIER with all modes, then the rest."""
    first = sorted(n for n in n_res if n <= FIRST_TIER)
    later = sorted(n for n in n_res if n > FIRST_TIER)
    return [(n, mode) for n in first + later for mode in MODES]


def plan_only(stack: EvoformerStack, n_res: list[int], n_seq: int, blocks: int, min_chunk: int,
              reps: int, row_seconds: float) -> None:
    """Planning at the real sizes on meta tensors, and the predicted GPU time of each row."""
    stack = stack.to("meta")
    c_m = stack.blocks[0].msa_att_row.layer_norm_m.weight.shape[0]
    c_z = stack.blocks[0].tri_mul_out.layer_norm_in.weight.shape[0]
    total_gpu = total_plan = 0.0
    for n in sorted(n_res, key=lambda n: (n > FIRST_TIER, n)):
        kw = dict(device="meta", dtype=torch.bfloat16)
        inputs = (torch.empty(n_seq, n, c_m, **kw), torch.empty(n, n, c_z, **kw),
                  torch.empty(n_seq, n, **kw), torch.empty(n, n, **kw))
        stack.set_chunk_size(None)
        t0 = time.perf_counter()
        planner = fc.ChunkPlanner(stack, inputs)
        t_planner = time.perf_counter() - t0
        none_s = roofline_s(partial(stack, *inputs))
        stack.set_chunk_size(MANUAL_CHUNK)
        with torch.no_grad():
            manual_peak = fc.measure_peak_memory(stack, *inputs)  # meta: accounting only
        manual_s = roofline_s(partial(stack, *inputs))
        stack.set_chunk_size(None)
        plans = {}
        for mode, budget in (("auto_equal", manual_peak), ("auto_min", None)):
            t0 = time.perf_counter()
            if budget is None:
                budget = planner.smallest_reachable_peak(min_chunk=min_chunk)
            chunked = planner.autochunk(budget, min_chunk=min_chunk)
            plans[mode] = (time.perf_counter() - t0, chunked)
        gm = plans["auto_min"][1].graph_module(inputs)
        auto_s = roofline_s(partial(gm, *inputs))
        row_s = 0.0
        for call in (manual_s, manual_s, auto_s):  # (b), (c) ~ (b), (d)
            row_s += n_calls(call, reps, row_seconds) * call
        fits = planner.estimate_peak() <= 80 * 2**30
        if fits:
            row_s += n_calls(none_s, reps, row_seconds) * none_s
        total_gpu += row_s
        plan_s = t_planner + sum(p[0] for p in plans.values())
        total_plan += plan_s
        print(f"N_res {n}: planner {t_planner:.1f} s, (c) {plans['auto_equal'][0]:.1f} s, "
              f"(d) {plans['auto_min'][0]:.1f} s | est. peak (a) "
              f"{planner.estimate_peak() / 2**30:.1f} GiB, (b) {manual_peak / 2**30:.1f} GiB, "
              f"(d) {plans['auto_min'][1].report.simulated_peak_after / 2**30:.2f} GiB | H100 "
              f"per call: (a) {none_s:.2f} s{'' if fits else ' (OOM)'}, (b) {manual_s:.2f} s, "
              f"(d) {auto_s:.2f} s; rows {row_s:.0f} s", flush=True)
    print(f"total: planning {total_plan:.0f} s (this CPU), GPU {total_gpu:.0f} s (predicted)")


def main(argv: list[str] | None = None) -> None:
    t_main = time.monotonic()  # --budget-seconds counts from here (after the imports)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--plan-only", action="store_true",
                        help="plan on meta tensors at the real sizes, predict GPU times (CPU)")
    parser.add_argument("--n-res", type=int, nargs="*", default=None)
    parser.add_argument("--n-seq", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="timed calls after the first")
    parser.add_argument("--row-seconds", type=float, default=30.0,
                        help="no further timed calls once a row has taken this long")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="start no row predicted to end after this many seconds (counted "
                             "from the end of the imports)")
    parser.add_argument("--min-chunk", type=int, default=None)
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp32"])
    parser.add_argument("--backend", default="torch", help="fold-model op backend (see doc)")
    parser.add_argument("--out", type=Path, default=RESULTS / "chunk" / "chunk_evoformer.json")
    args = parser.parse_args(argv)

    if args.small:
        cfg = EvoformerConfig(c_m=16, c_z=8, c_s=8, no_blocks=args.blocks, c_hidden_msa_att=4,
                              no_heads_msa=2, c_hidden_opm=4, c_hidden_mul=8,
                              c_hidden_pair_att=4, no_heads_pair=2, transition_n=2)
        n_res, n_seq = args.n_res or SMALL_N_RES, args.n_seq or 8
        min_chunk, dtype_name = args.min_chunk or 2, args.dtype or "fp32"
    else:
        cfg = EvoformerConfig(no_blocks=args.blocks)
        n_res, n_seq = args.n_res or N_RES, args.n_seq or 128
        min_chunk, dtype_name = args.min_chunk or 16, args.dtype or "bf16"
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.manual_seed(0)
    stack = EvoformerStack(cfg).to(dtype=dtype).eval()
    if args.plan_only:
        with ops.use_backend(args.backend):
            plan_only(stack, n_res, n_seq, args.blocks, min_chunk, args.reps, args.row_seconds)
        return

    device = torch.device(args.device)
    t0 = time.monotonic()
    stack = stack.to(device)
    meta = {
        "benchmark": "chunk_evoformer",
        "device_name": device_name(device),
        "torch": torch.__version__, "dtype": dtype_name, "blocks": args.blocks,
        "backend": args.backend, "n_seq": n_seq, "min_chunk": min_chunk, "reps": args.reps,
        "row_seconds": args.row_seconds, "budget_seconds": args.budget_seconds,
    }
    with ops.use_backend(args.backend):
        if device.type == "cuda":  # CUDA context, cuBLAS handles and workspaces, once
            with torch.no_grad():
                w = (torch.randn(8, 32, cfg.c_m), torch.randn(32, 32, cfg.c_z),
                     torch.ones(8, 32), torch.ones(32, 32))
                stack(*[t.to(device, dtype) for t in w])
            _sync(device)
        meta["startup_s"] = time.monotonic() - t0
        print(f"start-up (model to device, warm-up) {meta['startup_s']:.1f} s", flush=True)
        bench = Benchmark(stack, args, device, dtype, n_seq, min_chunk, meta, t_start=t_main)
        for n, mode in row_order(n_res):
            bench.run_row(n, mode)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
