"""Ablation of the training-step optimizations (as ScaleFold's figure 8): the full ``af2_initial``
training step (N_res 256, N_clust 128, N_extra 1024, 4 templates, R = 4 recycling copies), first
with everything off, then adding one optimization per row, cumulatively:

====  ==========================  =============================================================
row   switch                      what changes
====  ==========================  =============================================================
0     baseline                    ops backend ``torch``, fp32 weights + bf16 autocast, per-block
                                  activation checkpointing, ``torch.optim.Adam`` +
                                  ``clip_grad_norm_`` + an EMA loop over the parameter list
1     fused kernels               ops backend ``triton`` (fold-kernels: EvoAttention, LayerNorm,
                                  gating / dropout-residual fusions), forward and recompute
2     tensor fusion               ``FlatParams``: parameters and gradients are views of one flat
                                  buffer; ``FlatAdam``'s PyTorch path over it
3     fused Adam+EMA              ``FlatAdam`` with fold-kernels' one-launch Adam + clip + EMA
4     bf16 parameters             weights of the embedders and the Evoformer / extra MSA /
                                  template stacks in bf16 with an fp32 master copy in
                                  ``FlatAdam``; the structure module and heads keep fp32
                                  weights (fold-model runs them in fp32)
5     no checkpointing            activation checkpointing off; if that runs out of memory or
                                  peaks over 60% of the device (the CUDA-graph rows need the
                                  rest), the Evoformer's last k blocks without it, k planned
                                  from the measured memory of one step (``plan_uncheckpointed``)
6     CUDA Graphs                 forward + loss + backward replayed from one graph per N_cycle
                                  (``fold_train.cuda_graphs``; every N_cycle in 1..R captured)
7     torch.compile SM            ``torch.compile`` of the structure module
8     GC off                      Python garbage collection off during steps
====  ==========================  =============================================================

Every row times steps of N_cycle = R (R - 1 passes without gradients, one with, as
``model_full.py``) on the same synthetic batch (``model_full.synthetic_batch``: needs numpy and
fold-data's ground-truth builder, not gemmi/RDKit), after warm-up steps (with CUDA Graphs: one
per N_cycle, which captures the whole cache). Reported per row: median step time, peak allocated
and reserved memory (the graphs' private pool shows in the latter), the loss, speedup over the
baseline and over the previous row. A row that fails (out of memory, a capture error) is
recorded with its error and its switch is left off for the rows after it.

    python benchmarks/train_ablation.py --out benchmarks/results/train_ablation.json   # CUDA
    python benchmarks/train_ablation.py --device cpu --tiny                             # smoke

One H100: about 5-7 minutes with the default 3 timed steps per row (a step is 2-5 s; the
compile row compiles for about a minute). The CPU smoke mode runs the tiny model and skips the
CUDA-only rows (CUDA Graphs) and torch.compile (minutes on CPU), saying so in the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _backends import ensure_kernels  # noqa: E402
from fold_model.af2 import AlphaFold2, config  # noqa: E402
from fold_model.af2.loss import AlphaFold2Loss  # noqa: E402
from fold_train.cuda_graphs import CudaGraphBackend, GraphedStep  # noqa: E402
from fold_train.family import AF2Family  # noqa: E402
from fold_train.optim import AdamConfig, FlatAdam, FlatParams, learning_rate  # noqa: E402
from model_full import FULL, TINY, synthetic_batch  # noqa: E402

_BACKEND_ENV = "FOLD_OPS_BACKEND"  # read on every dispatch, also by autograd's device threads


@dataclasses.dataclass(frozen=True)
class Switches:
    backend: str = "torch"
    flat: bool = False
    fused_adam: bool = False
    bf16_params: bool = False
    checkpointing: bool = True
    uncheckpointed: int = 0  # with checkpointing: the Evoformer's last blocks that run without
    cuda_graphs: bool = False
    compile_sm: bool = False
    gc_off: bool = False


ROWS: list[tuple[str, str, dict]] = [
    ("baseline", "eager baseline", {}),
    ("kernels", "+ fused kernels (Triton where supported)", {"backend": "auto"}),
    ("flat", "+ tensor fusion (flat buffers)", {"flat": True}),
    ("fused_adam", "+ fused Adam+EMA", {"fused_adam": True}),
    ("bf16", "+ bf16 parameters (fp32 master)", {"bf16_params": True}),
    ("no_ckpt", "- activation checkpointing", {"checkpointing": False}),
    ("graphs", "+ CUDA Graphs (per N_cycle)", {"cuda_graphs": True}),
    ("compile", "+ torch.compile structure module", {"compile_sm": True}),
    ("gc_off", "+ GC off", {"gc_off": True}),
]


class RowSkipped(Exception):
    """The row cannot run on this device (said in the table)."""


@contextmanager
def _ops_backend(name: str):
    old = os.environ.get(_BACKEND_ENV)
    os.environ[_BACKEND_ENV] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_BACKEND_ENV, None)
        else:
            os.environ[_BACKEND_ENV] = old


class Runner:
    """One configuration's training step: ``step(n_cycle) -> loss``."""

    def __init__(self, sw: Switches, batch: dict, truth: dict, device: torch.device,
                 tiny: bool) -> None:
        self.sw, self.device = sw, device
        cuda = device.type == "cuda"
        if sw.cuda_graphs and not cuda:
            raise RowSkipped("CUDA Graphs need a CUDA device")
        if sw.compile_sm and not cuda:
            raise RowSkipped("torch.compile takes minutes on CPU; GPU only")
        # on CPU the Triton kernels do not apply: "auto" falls back to the torch reference
        self.backend = sw.backend if cuda or sw.backend == "torch" else "auto"
        self.notes = []
        if self.backend != sw.backend:
            self.notes.append("kernels: torch reference on CPU")
        if sw.fused_adam and not cuda:
            self.notes.append("Adam: PyTorch path on CPU")
        torch.manual_seed(0)
        cfg = config("tiny" if tiny else "af2_initial", checkpoint_blocks=sw.checkpointing,
                     uncheckpointed_blocks=sw.uncheckpointed)
        self.model = AlphaFold2(cfg).to(device).train()
        if sw.bf16_params:  # as fold-train's bf16_weights=true (structure module, heads: fp32)
            AF2Family().to_bf16_weights(self.model)
        if sw.compile_sm:
            self.model.structure_module.compile()
        self.loss_fn = AlphaFold2Loss(cfg.loss)
        self.batch, self.truth = batch, truth
        adam = AdamConfig()
        if sw.flat:
            self.flat = FlatParams(self.model)
            # fused: fold-kernels on CUDA (None falls back to the PyTorch path on CPU)
            use = (True if cuda else None) if sw.fused_adam else False
            self.opt = FlatAdam(self.flat, adam, use_kernels=use)
        else:
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.adam = torch.optim.Adam(self.params, lr=adam.lr, betas=(adam.beta1, adam.beta2),
                                         eps=adam.eps)
            self.ema = [p.detach().clone() for p in self.params]
        self.adam_cfg, self.n_updates = adam, 0
        self.max_cycle = AF2Family().n_cycle_max(batch)  # R: the graphs' warm-up count
        self.graphed = (GraphedStep(self._body, CudaGraphBackend(device, warmup=2))
                        if sw.cuda_graphs else None)

    def _zero_grad(self) -> None:
        if self.sw.flat:
            self.flat.zero_grad()
        else:
            for p in self.params:
                p.grad = None

    def _body(self, n_cycle: int, batch: dict | None = None) -> dict[str, torch.Tensor]:
        """Forward + loss + backward (what CUDA Graphs capture)."""
        batch = self.graphed.static_inputs if batch is None else batch
        self._zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            cache_enabled=not self.sw.cuda_graphs):
            out = self.model(batch, num_recycles=n_cycle)
            loss, _ = self.loss_fn(out, self.truth)
        loss.backward()
        return {"loss": loss.detach()}

    def _update(self) -> None:
        """Clip to global norm 0.1, Adam, EMA 0.999; skipped when the norm is not finite (the
        host check every real step makes)."""
        if self.sw.flat:
            norm = self.opt.grad_norm()
            if bool(torch.isfinite(norm)):
                self.opt.step(norm)
            return
        norm = torch.nn.utils.clip_grad_norm_(self.params, 0.1)
        if bool(torch.isfinite(norm)):
            self.n_updates += 1  # AF2's warm-up schedule, as FlatAdam applies it
            for group in self.adam.param_groups:
                group["lr"] = learning_rate(self.n_updates, self.adam_cfg)
            self.adam.step()
            with torch.no_grad():
                for e, p in zip(self.ema, self.params):
                    e.lerp_(p, 1 - 0.999)

    def step(self, n_cycle: int) -> float:
        with _ops_backend(self.backend):
            if self.graphed is not None:
                self.graphed.load(self.batch)
                loss = self.graphed(n_cycle, warmup_n_cycle=self.max_cycle)["loss"]
            else:
                loss = self._body(n_cycle, self.batch)["loss"]
            self._update()
        if self.sw.gc_off:
            gc.collect(0)  # the young generation, between steps (as fold-train's loop)
        return float(loss)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(sw: Switches, batch: dict, truth: dict, device: torch.device, tiny: bool,
            r: int, reps: int) -> dict:
    runner = Runner(sw, batch, truth, device, tiny)
    cuda = device.type == "cuda"
    gc_was = gc.isenabled()
    if sw.gc_off:
        gc.disable()
    try:
        warm = list(range(1, r + 1)) if sw.cuda_graphs else [r]  # graphs: the whole cache
        for n in warm:
            loss = runner.step(n)
        _sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            loss = runner.step(r)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        if sw.gc_off and gc_was:
            gc.enable()
    row = {"step_ms": statistics.median(times), "times_ms": times, "loss": loss,
           "peak_alloc_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
           "reserved_mib": torch.cuda.memory_reserved(device) / 2**20 if cuda else None}
    if runner.graphed is not None:
        row["graphs_captured"] = runner.graphed.captured
    if not torch.isfinite(torch.tensor(loss)):
        runner.notes.append(f"non-finite loss {loss}")
    if runner.notes:
        row["note"] = "; ".join(runner.notes)
    return row


def _step_peak(sw: Switches, batch: dict, truth: dict, device: torch.device, tiny: bool,
               r: int) -> float:
    """Peak allocated bytes of one training step at N_cycle ``r``."""
    runner = Runner(sw, batch, truth, device, tiny)
    try:
        runner.step(r)
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step(r)
        _sync(device)
        return float(torch.cuda.max_memory_allocated(device))
    finally:
        del runner
        _free(device)


PLAN_FILL = 0.6  # of the device's memory, for the training step without checkpointing


def plan_uncheckpointed(sw: Switches, batch: dict, truth: dict, device: torch.device,
                        tiny: bool, r: int, fill: float = PLAN_FILL) -> tuple[Switches, dict]:
    """How many of the Evoformer's last blocks can skip checkpointing: the step's peak with none
    and with ``probe`` blocks uncheckpointed gives the bytes one block keeps; ``k`` blocks fill
    ``fill`` of the device's memory (headroom for the CUDA-graph pools of the later rows). Halved
    while the step runs out of memory."""
    n_blocks = config("tiny" if tiny else "af2_initial").evoformer.no_blocks
    probe = max(1, n_blocks // 12)
    p0 = _step_peak(sw, batch, truth, device, tiny, r)
    p1 = _step_peak(dataclasses.replace(sw, uncheckpointed=probe), batch, truth, device, tiny, r)
    per_block = max((p1 - p0) / probe, 1.0)
    total = torch.cuda.get_device_properties(device).total_memory
    k = int(min(n_blocks, max(0, (fill * total - p0) // per_block)))
    tried = []
    while k > 0:
        tried.append(k)
        try:
            _step_peak(dataclasses.replace(sw, uncheckpointed=k), batch, truth, device, tiny, r)
            break
        except torch.cuda.OutOfMemoryError:
            pass
        _free(device)  # after the except block: its traceback held the failed step's tensors
        k //= 2
    plan = {"n_blocks": n_blocks, "peak_none_mib": p0 / 2**20, "probe_blocks": probe,
            "peak_probe_mib": p1 / 2**20, "per_block_mib": per_block / 2**20, "fill": fill,
            "tried": tried, "uncheckpointed": k}
    return dataclasses.replace(sw, uncheckpointed=k), plan


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _versions(device: torch.device) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton_version,
            "date": datetime.date.today().isoformat()}


def ablate(device: torch.device, tiny: bool, reps: int, rows: list[str],
           log: Callable[[str], None] = print,
           on_row: Callable[[dict], None] | None = None,
           assume: tuple[str, ...] = (), uncheckpointed: int | None = None) -> dict:
    """Time ``rows`` cumulatively. ``assume``: rows whose switches are applied without timing
    them (a sweep continued in another process); an assumed ``no_ckpt`` keeps checkpointing
    on the first blocks when ``uncheckpointed`` (the k an earlier plan found) is given."""
    sizes = TINY if tiny else FULL
    found = ensure_kernels(device, needed="kernels" in rows)
    batch, truth = synthetic_batch(**sizes, device=device)
    sw = Switches()
    results, base_ms, prev_ms = [], None, None
    header = {**_versions(device), "preset": "tiny" if tiny else "af2_initial", **sizes,
              "n_cycle": sizes["r"], "reps": reps,
              "attention_backends": found, "assumed": list(assume)}
    for key, label, change in ROWS:
        if key in assume and key not in rows:
            if key == "no_ckpt" and uncheckpointed is not None:
                change = {"uncheckpointed": uncheckpointed}
            sw = dataclasses.replace(sw, **change)
            continue
        if key not in rows:
            continue
        trial = dataclasses.replace(sw, **change)
        entry = {"row": key, "label": label, "switches": dataclasses.asdict(trial)}
        t0 = time.perf_counter()
        try:
            why = None
            try:
                entry.update(run_row(trial, batch, truth, device, tiny, sizes["r"], reps))
            except torch.cuda.OutOfMemoryError:
                if key != "no_ckpt":
                    raise
                why = "ran out of memory"  # planned below, once the failed step is released
            if key == "no_ckpt" and why is None and device.type == "cuda":
                limit = PLAN_FILL * torch.cuda.get_device_properties(device).total_memory
                if entry["peak_alloc_mib"] * 2**20 > limit:  # no room for the graphs' pools
                    why = (f"peaked at {entry['peak_alloc_mib']:.0f} MiB, over {PLAN_FILL:.0%} "
                           f"of the device")
            if why is not None:
                _free(device)
                trial, plan = plan_uncheckpointed(sw, batch, truth, device, tiny, sizes["r"])
                entry.update(label="- activation checkpointing (partly: memory)",
                             switches=dataclasses.asdict(trial), plan=plan)
                entry.update(run_row(trial, batch, truth, device, tiny, sizes["r"], reps))
                entry["note"] = (f"all blocks uncheckpointed {why}; the last "
                                 f"{trial.uncheckpointed} of {plan['n_blocks']} Evoformer blocks "
                                 f"run without checkpointing")
            sw = trial  # kept for the following rows
        except RowSkipped as e:
            entry["skipped"] = str(e)
        except torch.cuda.OutOfMemoryError:
            entry["error"] = "out of memory"
        except Exception as e:  # a row that fails is reported; the sweep goes on without it
            entry["error"] = f"{type(e).__name__}: {e}"[:500]
        _free(device)
        entry["row_s"] = time.perf_counter() - t0
        if "step_ms" in entry:
            base_ms = base_ms or entry["step_ms"]
            entry["speedup_vs_baseline"] = base_ms / entry["step_ms"]
            entry["speedup_vs_previous"] = (prev_ms or entry["step_ms"]) / entry["step_ms"]
            prev_ms = entry["step_ms"]
        results.append(entry)
        log(json.dumps({k: v for k, v in entry.items() if k != "switches"}))
        if on_row is not None:  # a sweep cut short by a time limit keeps the rows it made
            on_row(header | {"rows": results})
    return header | {"rows": results}


def to_markdown(result: dict) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = [
        f"# Training-step ablation ({result['preset']})",
        "",
        f"Device: {result['device']}, PyTorch {result['torch']}, Triton {result['triton']}, "
        f"{result['date']}. N_res {result['n_res']}, N_clust {result['n_clust']}, N_extra "
        f"{result['n_extra']}, {result['n_templ']} templates, N_cycle {result['n_cycle']} "
        f"(timed), median of {result['reps']} steps; each row adds its switch to the rows above"
        + (f" (switches on from the start, untimed here: {', '.join(result['assumed'])})"
           if result.get("assumed") else "") + ".",
        "",
        "| row | step ms | speedup vs baseline | vs previous | peak alloc MiB | reserved MiB "
        "| loss | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result["rows"]:
        note = e.get("skipped") or e.get("error") or e.get("note") or ""
        if "graphs_captured" in e:
            note = (note + f" graphs for N_cycle {e['graphs_captured']}").strip()
        lines.append(
            f"| {e['label']} | {num(e.get('step_ms'), '.1f')} | "
            f"{num(e.get('speedup_vs_baseline'), '.2f')} | "
            f"{num(e.get('speedup_vs_previous'), '.2f')} | "
            f"{num(e.get('peak_alloc_mib'), '.0f')} | {num(e.get('reserved_mib'), '.0f')} | "
            f"{num(e.get('loss'), '.4f')} | {note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shapes (smoke test)")
    parser.add_argument("--reps", type=int, default=3, help="timed steps per row")
    parser.add_argument("--rows", default=",".join(k for k, _, _ in ROWS),
                        help="comma-separated subset of rows (default all): "
                             + ", ".join(k for k, _, _ in ROWS))
    parser.add_argument("--assume", default="",
                        help="rows whose switches are on without being timed (continue a sweep "
                             "in another process), e.g. kernels,flat,fused_adam,bf16,no_ckpt")
    parser.add_argument("--uncheckpointed", type=int, default=None,
                        help="with --assume no_ckpt: the Evoformer's last K blocks without "
                             "checkpointing (the rest keep it), as an earlier plan found")
    parser.add_argument("--out", type=Path, default=None, help="JSON here, Markdown beside it")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_ablation: --device cuda requested but CUDA is not available")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - {k for k, _, _ in ROWS})
    if unknown:
        raise SystemExit(f"train_ablation: unknown rows {unknown}")
    def save(result: dict) -> None:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(args.out, json.dumps(result, indent=2))
            _write_atomic(args.out.with_suffix(".md"), to_markdown(result))

    assume = tuple(r.strip() for r in args.assume.split(",") if r.strip())
    unknown = sorted(set(assume) - {k for k, _, _ in ROWS})
    if unknown:
        raise SystemExit(f"train_ablation: unknown rows in --assume {unknown}")
    result = ablate(device, args.tiny, args.reps, rows, on_row=save, assume=assume,
                    uncheckpointed=args.uncheckpointed)
    print(to_markdown(result))
    save(result)
    return result


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
