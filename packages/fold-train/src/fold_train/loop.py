"""The training loop (AF2 supplement 1.11) over fold-data samples, a model family
(:mod:`fold_train.families`) and the flat optimizer; the loop itself knows no family.

One step (:meth:`Trainer.train_step`):

1. draw ``N_cycle`` uniformly from ``1..R`` with a generator seeded by ``(seed, step)``, so every
   sample of the batch and every data-parallel rank uses the same number (supplement 1.10);
2. forward with recycling: passes ``1..N_cycle-1`` without gradients, the last with (fold-model);
   bf16 autocast when ``precision=bf16`` (the weights stay fp32: they are the master copy);
   a family with diffusion noise (AF3) draws it from a generator seeded by
   ``(seed, step, dp_rank)`` (:func:`noise_seed`), dropout from the global RNG seeded per
   data-parallel replica;
3. the family's loss (AF2: on the ground truth of the last pass); backward;
4. data parallel: average the flat gradient buffer over the ranks, its global norm computed as
   the buckets arrive (:mod:`fold_train.distributed`);
5. a non-finite loss or gradient norm on any rank skips the update on every rank and is logged;
   more than ``max_nonfinite_steps`` skipped steps in a row stop training
   (:class:`NonFiniteError`);
6. clip to the global norm, Adam, EMA (:class:`~fold_train.optim.FlatAdam`: one fused launch per
   buffer on GPU, a few PyTorch ops on CPU).

Around it: a tqdm progress bar (step, loss, step time, samples/s), one JSON line of metrics per
logged step in ``<run>/metrics.jsonl`` (and TensorBoard when installed), checkpoints every
``checkpoint_every`` steps and at the end (model, optimizer + EMA, RNG states, data position;
``resume`` continues exactly), evaluation of the EMA weights on an in-memory evaluation set (in a
background thread with ``async_eval``), garbage collection off during steps (ScaleFold), and a
PNG of the loss terms and lDDT-Ca at the end.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import gc
import json
import math
import signal
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fold_train import checkpoint as ckpt
from fold_train.buckets import Bucket, BucketPolicy, fit_to_bucket
from fold_train.ckpt_plan import CheckpointPlan, CudaMemory, MemorySource, plan_checkpointing
from fold_train.config import ConfigError, TrainConfig
from fold_train.cuda_graphs import CaptureBackend, GraphedStep
from fold_train.data import SampleStream
from fold_train.distributed import DistContext, all_reduce_gradients, all_true, gather_objects
from fold_train.families import make_family
from fold_train.optim import FlatAdam, FlatParams
from fold_train.parallelize import Techniques, parallelize
from fold_train.param_adam import ParamAdam, ParamList
from fold_train.runtime import autocast, ops_backend

__all__ = ["CHECKPOINT_FORMAT", "NonFiniteError", "Trainer", "TrainingInterrupted",
           "draw_n_cycle", "noise_seed"]

CHECKPOINT_FORMAT = "fold-train/1"


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def draw_n_cycle(seed: int, step: int, n_max: int) -> int:
    """``N_cycle`` of training step ``step``: uniform in ``1..n_max``, seeded by ``(seed, step)``
    (the same on every rank and for every sample of the batch)."""
    return int(np.random.default_rng([seed, 1, step]).integers(1, n_max + 1))


def noise_seed(seed: int, step: int, dp_rank: int) -> int:
    """Seed of the diffusion-noise generator of training step ``step`` on data-parallel replica
    ``dp_rank`` (AF3: noise levels, noised copies, augmentation and the mini-rollout). Each
    replica draws its own noise; the DAP ranks of one replica draw the same (they share the
    sample); a resumed run draws what the uninterrupted run drew."""
    return int(np.random.SeedSequence([seed, 104729, step, dp_rank]).generate_state(1)[0])


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class Trainer:
    """Train the model of ``cfg``'s family (:mod:`fold_train.families`: what differs between
    AF2 and AF3 lives there) on ``stream`` with outputs in ``run_dir``.

    ``stream``: the training samples of :meth:`fit` (None: the caller feeds batches to
    :meth:`train_step` / :meth:`run_steps` itself, e.g. a benchmark's synthetic batch; no
    :meth:`fit`, :meth:`save` or :meth:`resume` then). ``eval_set``: inference samples
    ``[(name, sample)]`` scored with the EMA weights every ``run.eval_every`` steps and at the
    end. ``ctx``: the data-parallel context (single process when None). The model's techniques
    are applied by :func:`fold_train.parallelize.parallelize`: with ``system.cuda_graphs`` the
    forward + loss + backward of a step is replayed from a CUDA graph per ``N_cycle``
    (:mod:`fold_train.cuda_graphs`); ``graph_backend`` replaces the CUDA capture (tests). With
    ``system.activation_checkpointing="auto"`` the first step plans the checkpointing
    (:mod:`fold_train.ckpt_plan`, result in :attr:`ckpt_plan`) from ``ckpt_memory`` (default:
    the CUDA device's memory; on CPU without it the preset's checkpointing is kept). ``init_from``:
    start from the weights of a fold checkpoint, AF2 ``.npz`` or OpenFold ``.pt``
    (:mod:`fold_train.init_from`); the optimizer and everything else start fresh.
    """

    def __init__(
        self, cfg: TrainConfig, run_dir: str | Path, stream: SampleStream | None, *,
        ctx: DistContext | None = None, eval_set: Sequence[tuple[str, dict]] = (),
        progress: bool = True, graph_backend: CaptureBackend | None = None,
        ckpt_memory: MemorySource | None = None, init_from: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx or DistContext()
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.stream = stream
        self.eval_set = list(eval_set)
        self.progress = progress
        self.device = self.ctx.device
        torch.manual_seed(cfg.run.seed)  # same initial weights on every rank
        self.model_config = cfg.model_config()
        self.family = make_family(cfg.model.family, self.model_config)
        self.model = self.family.build_model(self.model_config).to(self.device)
        if init_from is not None:  # weight-only start: before bf16 weights and the flat buffers
            from fold_train.init_from import load_init_weights

            load_init_weights(self.model, init_from, cfg.model.family)
        if cfg.system.cuda_graphs and (cfg.parallel.dap > 1 or cfg.parallel.bp > 1):
            raise ConfigError("cuda_graphs=true with dap/bp > 1 is not supported: the DAP/BP "
                              "collectives inside the step are not captured")
        if graph_backend is not None and not cfg.system.cuda_graphs:
            raise ValueError("graph_backend given but cfg.system.cuda_graphs is false")
        # AF3: the diffusion noise's generator, reseeded every step (noise_seed); one object, so
        # that captured steps can register it and draw fresh noise on every replay.
        self._noise_gen = torch.Generator(self.device) if self.family.seeded_noise else None
        # bf16 weights, DAP / BP, the checkpointing plan, compile and the graph backend, in
        # parallelize's fixed order (before the flat buffers: one group per weight dtype)
        done = parallelize(self.model, self.family, Techniques(
            bf16_weights=cfg.system.bf16_weights, groups=self.ctx.groups, dao=cfg.parallel.dao,
            plan_checkpointing=cfg.system.activation_checkpointing == "auto",
            compile=cfg.system.compile_structure_module, cuda_graphs=cfg.system.cuda_graphs,
            device=self.device,
            generators=(self._noise_gen,) if self._noise_gen is not None else ()),
            graph_backend=graph_backend)
        self._parallel_handles = done.parallel_handles
        self.loss_fn = self.family.make_loss(self.model, self.model_config)
        if cfg.system.tensor_fusion:
            self.flat = FlatParams(self.model)
            self.opt = FlatAdam(self.flat, cfg.optim, use_kernels=cfg.system.use_kernels)
        else:  # the eager baseline: per-tensor Adam, clipping and EMA (one process only)
            if self.ctx.distributed:
                raise ConfigError("tensor_fusion=false runs in one process: the data-parallel "
                                  "gradient average works on the flat gradient buffer")
            self.flat = ParamList(self.model)
            self.opt = ParamAdam(self.flat, cfg.optim)
        # activation_checkpointing=auto: planned on the first batch (_plan_checkpointing)
        self.ckpt_plan: CheckpointPlan | None = None
        self._ckpt_memory = ckpt_memory
        self._ckpt_pending = done.checkpoint_plan_pending
        # Under CUDA graphs: one GraphedStep (graphs per N_cycle, static inputs) per shape bucket
        # (fold_train.buckets), all in one pool; AF3: the pair-list capacities of each bucket.
        self._graphs: dict[Bucket, GraphedStep] = {}
        self._loss_caps: dict[Bucket, Any] = {}
        self._graph_backend: CaptureBackend | None = done.graph_backend
        self.bucket_policy = BucketPolicy()
        self.step = 0
        self.consecutive_skips = 0
        self.skipped_total = 0
        self._own_ckpts: list[Path] = []  # this run's checkpoints, oldest first (pruning)
        self._stop_signal: int | None = None  # SIGTERM/SIGINT received during fit
        # Different dropout for each data-parallel replica, the same on the DAP/BP ranks of one
        # replica (DAP needs equal masks along a split axis), reproducible.
        torch.manual_seed(cfg.run.seed * 1000 + 1 + self.ctx.dp_rank)
        self._writer = None
        self._eval_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._eval_futures: list[tuple[int, concurrent.futures.Future]] = []

    @property
    def captured_graphs(self) -> list[int]:
        """With ``cuda_graphs``: the ``N_cycle`` values captured, over all shape buckets."""
        return sorted({n for graphed in self._graphs.values() for n in graphed.captured})

    # -- one step -------------------------------------------------------------------------------
    def train_step(self, batch: dict[str, torch.Tensor], *, n_cycle: int | None = None
                   ) -> dict[str, Any]:
        """One optimizer step on ``batch`` (AF2 ``[B, R, ...]``, AF3 ``[B, ...]``); returns its
        metrics. ``n_cycle``: the trunk passes of this step (default: drawn from
        ``1..n_cycle_max`` seeded by ``(seed, step)``, as training does; a benchmark fixes it)."""
        with ops_backend(self.cfg.system.ops_backend):
            return self._train_step(batch, n_cycle)

    def run_steps(self, batches: Iterable[dict[str, torch.Tensor]], *,
                  n_cycle: int | None = None) -> list[dict[str, Any]]:
        """:meth:`train_step` on each of ``batches`` with the loop's per-step system switches
        (``gc_off``: garbage collection off during the steps, the young generation collected
        after each), without checkpoints, evaluation or logs: the steps of :meth:`fit` on
        batches the caller provides. Returns their records."""
        records = []
        with self._gc_paused():
            for batch in batches:
                records.append(self.train_step(batch, n_cycle=n_cycle))
                if self.cfg.system.gc_off:
                    gc.collect(0)
        return records

    @contextlib.contextmanager
    def _gc_paused(self) -> Iterator[None]:
        """Garbage collection off inside the block when ``gc_off`` (ScaleFold 3.3: no
        collection pauses inside a step)."""
        was_enabled = gc.isenabled()
        if self.cfg.system.gc_off:
            gc.disable()
        try:
            yield
        finally:
            if self.cfg.system.gc_off and was_enabled:
                gc.enable()

    def _plan_checkpointing(self, batch: dict[str, torch.Tensor]) -> None:
        """``activation_checkpointing=auto``: how many of each checkpointed stack's last blocks
        run without recompute (:func:`fold_train.ckpt_plan.plan_checkpointing`), measured with
        forward + backward passes of one trunk pass on ``batch`` (the no-gradient recycling
        passes free their activations, so the peak is one pass's). The RNG streams and the
        gradients are left as they were: the run trains as one given the plan as a setting."""
        self._ckpt_pending = False
        memory = self._ckpt_memory
        if memory is None and self.device.type == "cuda":
            memory = CudaMemory(self.device, self.cfg.system.ckpt_memory_fraction)
        if memory is None:
            return  # CPU: the preset's checkpointing
        devices = [self.device] if self.device.type == "cuda" else []
        noise_state = None if self._noise_gen is None else self._noise_gen.get_state()

        def step() -> None:
            self._forward_backward(batch, 1)

        try:
            with torch.random.fork_rng(devices=devices):
                self.ckpt_plan = plan_checkpointing(self.model, step, memory,
                                                    device_type=self.device.type)
        finally:
            if noise_state is not None:
                self._noise_gen.set_state(noise_state)
            self.flat.zero_grad()
        if self.ctx.is_main:
            print(f"fold-train: {self.ckpt_plan.describe()}")

    def _train_step(self, batch: dict[str, torch.Tensor], n_cycle: int | None
                    ) -> dict[str, Any]:
        cfg = self.cfg
        self.model.train()
        if n_cycle is None:
            n_cycle = draw_n_cycle(cfg.run.seed, self.step, self.family.n_cycle_max(batch))
        elif not 1 <= n_cycle <= self.family.n_cycle_max(batch):
            raise ValueError(f"n_cycle must be in 1..{self.family.n_cycle_max(batch)}, got "
                             f"{n_cycle}")
        batch = _to_device(batch, self.device)
        if self._ckpt_pending:
            self._plan_checkpointing(batch)
        reseed = None
        if self._noise_gen is not None:
            seed = noise_seed(cfg.run.seed, self.step, self.ctx.dp_rank)
            reseed = lambda: self._noise_gen.manual_seed(seed)  # noqa: E731
            reseed()
        if self._graph_backend is not None:
            # padded to its shape bucket: batches of other crop sizes / MSA depths in the same
            # bucket replay the same graphs
            batch, bucket = fit_to_bucket(batch, self.family.name, self.bucket_policy)
            graphed = self._graph_for(bucket)
            graphed.load({**batch, **self._static_loss_inputs(batch, bucket)})
            # a registered generator's replay starts at its seed and offset of the moment, so
            # reseeding first replays the eager step's noise (warm-up and capture advance it)
            outs = graphed(n_cycle, warmup_n_cycle=self.family.n_cycle_max(batch),
                           before_replay=reseed)
            loss = outs["loss"]
            aux = {k.removeprefix("aux/"): v for k, v in outs.items() if k.startswith("aux/")}
            terms = {k.removeprefix("term/"): v for k, v in outs.items() if k.startswith("term/")}
        else:
            loss, terms, aux = self._forward_backward(batch, n_cycle)
        if self.ctx.distributed:
            # the norm is accumulated while the buckets' all-reduces complete (overlap_clip), or
            # taken afterwards over the whole averaged buffer
            norm = all_reduce_gradients(self.flat, self.ctx, with_norm=cfg.system.overlap_clip)
            if norm is None:
                norm = self.opt.grad_norm()
        else:
            norm = self.opt.grad_norm()  # fold-kernels' two-stage reduction on GPU
        finite = all_true(bool(torch.isfinite(loss)) and bool(torch.isfinite(norm)), self.ctx)
        record: dict[str, Any] = {"n_cycle": n_cycle}
        if finite:
            info = self.opt.step(norm)
            self.consecutive_skips = 0
            record["lr"] = info["lr"]
            self._check_parameters()
        else:
            self.consecutive_skips += 1
            self.skipped_total += 1
            record["skipped"] = True
        self.step += 1
        record.update({k: float(v.detach()) for k, v in terms.items()})
        record["grad_norm"] = float(norm)
        record.update(self.family.step_metrics(batch, n_cycle, aux))
        if not finite:
            print(f"fold-train: step {self.step}: non-finite loss {record['loss']} or gradient "
                  f"norm {record['grad_norm']}; update skipped ({self.consecutive_skips} in a row)")
            if self.consecutive_skips > cfg.run.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self.consecutive_skips} consecutive steps with a non-finite loss or "
                    f"gradient (limit max_nonfinite_steps={cfg.run.max_nonfinite_steps}); stopping "
                    f"at step {self.step}")
        return record

    def _check_parameters(self) -> None:
        """A finite loss and gradient can still leave non-finite weights (a huge learning rate):
        stop before such weights reach a checkpoint."""
        # one flag on the device, one read: not a host sync per weight tensor
        ok = bool(torch.stack([torch.isfinite(t).all() for t in self.flat.tensors()]).all())
        if not all_true(ok, self.ctx):
            raise NonFiniteError(
                f"the parameters are non-finite after the update of step {self.step + 1} (loss "
                "and gradient norm were finite; the learning rate is probably too large); no "
                f"checkpoint written, the last good one is in {self.ckpt_dir}")

    def _forward_backward(
        self, batch: dict[str, torch.Tensor], n_cycle: int, *, autocast_cache: bool = True,
        **loss_inputs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Zero the flat gradient, forward with ``n_cycle`` passes, the family's loss (AF2: on
        the last pass's truth), backward. Returns ``(loss, loss terms, aux)`` (detached; AF2's
        aux: ``final_atom_positions [B, N_res, 37, 3]``)."""
        self.flat.zero_grad()
        kwargs = dict(loss_inputs)
        if self._noise_gen is not None:  # AF3: the step's diffusion noise (seeded by train_step)
            kwargs["generator"] = self._noise_gen
        with autocast(self.device, self.cfg.system.precision, cache=autocast_cache):
            loss, terms, aux = self.family.forward_loss(self.model, self.loss_fn, batch, n_cycle,
                                                        **kwargs)
        loss.backward()
        terms = {k: v.detach() for k, v in terms.items()}
        return loss.detach(), terms, aux

    @property
    def graph_buckets(self) -> list[Bucket]:
        """The shape buckets with captured steps (CUDA graphs), in first-use order."""
        return list(self._graphs)

    def _graph_for(self, bucket: Bucket) -> GraphedStep:
        """The captured steps of ``bucket`` (created on its first batch)."""
        graphed = self._graphs.get(bucket)
        if graphed is None:
            assert self._graph_backend is not None
            graphed = GraphedStep(lambda n_cycle: self._graph_body(graphed, n_cycle),
                                  self._graph_backend)
            self._graphs[bucket] = graphed
        return graphed

    def _graph_body(self, graphed: GraphedStep, n_cycle: int) -> dict[str, torch.Tensor]:
        """The captured work of a step: :meth:`_forward_backward` on the static batch (AF3:
        with the static, padded pair lists of the loss)."""
        batch, extra = self.family.split_static_inputs(graphed.static_inputs)
        loss, terms, aux = self._forward_backward(batch, n_cycle, autocast_cache=False, **extra)
        return {"loss": loss, **{f"aux/{k}": v for k, v in aux.items()},
                **{f"term/{k}": v for k, v in terms.items()}}

    def _static_loss_inputs(self, batch: dict[str, torch.Tensor],
                            bucket: Bucket) -> dict[str, torch.Tensor]:
        """The family's data-dependent loss inputs (AF3: the loss's atom-pair lists), built
        outside the graph and padded to fixed capacities (one set per bucket), as static inputs.
        A batch whose inputs outgrow its bucket's capacities drops the captured graphs (of every
        bucket: they share one pool, which is released): they are captured again, that bucket's
        for the larger capacities."""
        tensors, caps, note = self.family.static_loss_inputs(batch, self._loss_caps.get(bucket))
        if note is not None:
            print(f"fold-train: step {self.step + 1}: {note}; capturing the step again")
            for graphed in self._graphs.values():
                graphed.reset()
        self._loss_caps[bucket] = caps
        return tensors

    # -- the run --------------------------------------------------------------------------------
    def fit(self, *, stop_at: int | None = None) -> list[dict[str, Any]]:
        """Train until ``cfg.run.steps`` (or ``stop_at``, to interrupt a run on purpose); returns
        the records of the steps run now."""
        with ops_backend(self.cfg.system.ops_backend):  # evaluation too (its thread included)
            return self._fit(stop_at)

    def _fit(self, stop_at: int | None) -> list[dict[str, Any]]:
        cfg = self.cfg
        if self.stream is None:
            raise ValueError("Trainer.fit needs a sample stream (this Trainer was built with "
                             "stream=None: feed batches to train_step / run_steps)")
        end = min(cfg.run.steps, stop_at) if stop_at is not None else cfg.run.steps
        main = self.ctx.is_main
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _write_json(self.run_dir / "config.json", cfg.to_dict())
            self._open_tensorboard()
        bar = _progress_bar(total=cfg.run.steps, initial=self.step,
                            enabled=self.progress and main)
        records = []
        samples_per_step = cfg.run.batch_size * self.ctx.dp_size
        # no collection pauses inside a step; collected between steps
        restore_signals = _catch_stop_signals(self)
        with self._gc_paused(), contextlib.ExitStack() as closing:
            closing.callback(bar.close)
            closing.callback(restore_signals)
            t_prev = time.perf_counter()
            for batch, names in self.stream.batches(end - self.step):
                t_data = time.perf_counter() - t_prev
                record = self.train_step(batch)
                dt = time.perf_counter() - t_prev
                record.update(step=self.step, step_time=dt, data_time=t_data,
                              samples_per_s=samples_per_step / dt, chains=names)
                records.append(record)
                if main and (self.step % cfg.run.log_every == 0 or self.step == end):
                    self._log(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}",
                                **({"lddt": f"{record['lddt_ca']:.3f}"}
                                   if "lddt_ca" in record else {}),
                                s_per_step=f"{dt:.2f}", samples_s=f"{samples_per_step / dt:.2f}")
                bar.update()
                if cfg.run.eval_every and self.step % cfg.run.eval_every == 0 and self.step < end:
                    self._evaluate()
                stop = self._stop_requested()
                if self.step % cfg.run.checkpoint_every == 0 or self.step == end or stop:
                    self.save()
                if stop:
                    break
                if cfg.system.gc_off:
                    gc.collect(0)  # the young generation only: cheap, between steps
                self._drain_eval(block=False)
                t_prev = time.perf_counter()
        if self._stop_signal is not None:
            self._drain_eval(block=True)
            raise TrainingInterrupted(self._stop_signal, self.step, self.ckpt_dir)
        if self.step == cfg.run.steps and self.eval_set:
            self._evaluate()
        self._drain_eval(block=True)
        if main and self.step == cfg.run.steps:
            from fold_train.plot import plot_metrics

            plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir / "training.png")
        if self._writer is not None:
            self._writer.flush()
        return records

    # -- evaluation -----------------------------------------------------------------------------
    def _evaluate(self) -> None:
        if not self.eval_set:
            return
        if self.ctx.groups is not None:
            # DAP/BP: the model's collectives need every rank of the replica, so all ranks
            # evaluate the live module with the EMA weights swapped in, synchronously.
            with self.opt.swap_ema():
                result = self.family.evaluate(self.model, self.eval_set, self.device,
                                             self.cfg.system.precision)
            self._log({"step": self.step, **result})
            return
        if not self.ctx.is_main:
            return
        with self.opt.swap_ema():
            snapshot = copy.deepcopy(self.model)  # the EMA weights, frozen at this step
        if self.cfg.system.async_eval:
            # ScaleFold's asynchronous evaluation: training goes on while a background thread
            # scores the snapshot.
            if self._eval_pool is None:
                self._eval_pool = concurrent.futures.ThreadPoolExecutor(1)
            fut = self._eval_pool.submit(self.family.evaluate, snapshot, self.eval_set,
                                         self.device, self.cfg.system.precision)
            self._eval_futures.append((self.step, fut))
        else:
            result = self.family.evaluate(snapshot, self.eval_set, self.device,
                                          self.cfg.system.precision)
            self._log({"step": self.step, **result})

    def _drain_eval(self, *, block: bool) -> None:
        keep = []
        for step, fut in self._eval_futures:
            if block or fut.done():
                self._log({"step": step, **fut.result()})
            else:
                keep.append((step, fut))
        self._eval_futures = keep
        if block and self._eval_pool is not None:
            self._eval_pool.shutdown()
            self._eval_pool = None

    # -- logging --------------------------------------------------------------------------------
    def _open_tensorboard(self) -> None:
        if self._writer is not None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard not installed: JSON lines only
            return
        self._writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def _log(self, record: dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")
        if self._writer is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._writer.add_scalar(k, v, record["step"])

    # -- checkpoints ----------------------------------------------------------------------------
    def _rng_states(self) -> dict[str, Any]:
        """Every rank's RNG states (the dropout streams differ per rank), gathered to all."""
        local = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            local["cuda"] = torch.cuda.get_rng_state(self.device)
        if not self.ctx.distributed:
            return {k: [v] for k, v in local.items()}
        import torch.distributed as dist

        comm_dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        out = {}
        for k, v in local.items():  # fixed-size uint8 tensors: one all_gather each
            parts = [torch.empty_like(v, device=comm_dev) for _ in range(self.ctx.world_size)]
            dist.all_gather(parts, v.to(comm_dev), group=self.ctx.group)
            out[k] = [p.cpu() for p in parts]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The whole training state (call on every rank: the RNG states are gathered)."""
        rng = self._rng_states()
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "consecutive_skips": self.consecutive_skips,
            "skipped_total": self.skipped_total,
            "config": self.cfg.to_dict(),
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.opt.state_dict(),
            "rng": rng,
            # one per rank; None: a Trainer fed by its caller (stream=None) has no data position
            "data": (gather_objects(self.stream.state_dict(), self.ctx)
                     if self.stream is not None else None),
            "world_size": self.ctx.world_size,
        }

    def save(self) -> Path | None:
        """Write ``checkpoints/step_<step>.ckpt`` and prune old ones (every rank calls this; rank
        0 writes)."""
        if self.consecutive_skips:  # same on every rank: the skip decision is all-reduced
            if self.ctx.is_main:
                print(f"fold-train: step {self.step}: no checkpoint while updates are being "
                      f"skipped ({self.consecutive_skips} in a row); the good ones are kept")
            return None
        state = self.state_dict()
        path = None
        if self.ctx.is_main:
            path = ckpt.save_checkpoint(ckpt.checkpoint_path(self.ckpt_dir, self.step), state)
            self._own_ckpts = [p for p in self._own_ckpts if p != path] + [path]
            keep = self.cfg.run.keep_checkpoints
            ckpt.prune_checkpoints(self.ckpt_dir, keep, own=self._own_ckpts)
            self._own_ckpts = self._own_ckpts[-keep:]
        if self.ctx.distributed:
            import torch.distributed as dist

            dist.barrier()  # no rank goes on (or resumes) before the file is complete
        return path

    def resume(self, path: str | Path | None = None) -> int:
        """Load ``path`` (default: the latest checkpoint of the run directory) and continue from
        it; returns the step. Metrics logged after that step by the interrupted run are dropped."""
        if self.stream is None:
            raise ValueError("Trainer.resume needs the sample stream whose position it restores")
        if path is not None:  # named by the user: that one or an error
            path = Path(path)
            state = ckpt.load_checkpoint(path, map_location="cpu")
            _check_format(path, state)
        else:  # the newest checkpoint that loads; newer junk is skipped with a warning
            path, state, rejected = ckpt.load_latest_valid(self.ckpt_dir, _check_format)
            for err in rejected:
                warnings.warn(f"skipping an unusable checkpoint: {err}; resuming from {path}",
                              ckpt.CheckpointWarning, stacklevel=2)
        if self.ctx.is_main:
            ckpt.clean_stale_tmp(self.ckpt_dir)
        saved = TrainConfig.from_dict(state["config"])
        for key in ("model.family", "run.preset", "model.overrides", "data.overrides",
                    "run.seed", "run.batch_size", "parallel.dap", "parallel.bp"):
            section, name = key.split(".")
            was, now = (getattr(getattr(c, section), name) for c in (saved, self.cfg))
            if was != now:
                raise ckpt.CheckpointError(
                    path, f"was written with {key}={was!r}, this run has {now!r}; resume needs "
                          "the same model and data")
        if state["world_size"] != self.ctx.world_size:
            raise ckpt.CheckpointError(
                path, f"was written by {state['world_size']} ranks, this run has "
                      f"{self.ctx.world_size}; the data position would not carry over")
        try:
            self.model.load_state_dict(state["model"])  # copies into the flat buffers
            self.opt.load_state_dict(state["optimizer"])
            self.stream.load_state_dict(state["data"][self.ctx.rank])
        except (RuntimeError, ValueError, KeyError) as e:
            raise ckpt.CheckpointError(path, f"does not fit this model: {e}") from e
        self.flat.check()
        torch.set_rng_state(state["rng"]["torch"][self.ctx.rank])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"][self.ctx.rank], self.device)
        self.step = int(state["step"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self.skipped_total = int(state["skipped_total"])
        # this run's history: the checkpoints up to the one resumed from (pruned oldest first)
        ours = path.resolve().parent == self.ckpt_dir.resolve()
        self._own_ckpts = [p for p in sorted(self.ckpt_dir.glob("step_*.ckpt"))
                           if p.name <= path.name] if ours else []
        if self.ctx.is_main:
            _truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        return self.step

    def _stop_requested(self) -> bool:
        """A SIGTERM/SIGINT on any rank stops every rank after the same step."""
        return not all_true(self._stop_signal is None, self.ctx)


class TrainingInterrupted(RuntimeError):
    """SIGTERM/SIGINT during :meth:`Trainer.fit`: the step in progress finished, a checkpoint
    was written (unless updates were being skipped), then training stopped."""

    def __init__(self, signum: int, step: int, ckpt_dir: Path) -> None:
        self.signum = signum
        self.step = step
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint in {ckpt_dir} "
                         "(continue with --resume)")


def _catch_stop_signals(trainer: Trainer):
    """Record SIGTERM/SIGINT on ``trainer`` instead of dying mid-step (main thread only; other
    threads cannot set handlers). Returns the function that restores the old handlers; a
    second signal of the same kind gets the old behaviour."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {}

    def handler(signum, frame):
        trainer._stop_signal = signum
        signal.signal(signum, old[signum])  # a second one is not caught: the user insists

    for sig in (signal.SIGTERM, signal.SIGINT):
        old[sig] = signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)
    return restore


def _check_format(path: Path, state: dict) -> None:
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ckpt.CheckpointError(path, f"expected checkpoint format {CHECKPOINT_FORMAT!r}, "
                                         f"got {state.get('format')!r}")


class _NoBar:
    """Stands in for a tqdm bar when tqdm is not installed (or the bar is off)."""

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(*, total: int, initial: int, enabled: bool):
    """A tqdm bar, or a silent stand-in when tqdm is missing (GPU images without it)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, initial=initial, desc="fold-train", unit="step",
                disable=not enabled, dynamic_ncols=True)


def _write_json(path: Path, obj: Any) -> None:
    ckpt.write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode())


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metric lines of steps ``<= step`` (an interrupted run may have logged more)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by the interruption
        if rec.get("step", math.inf) <= step:
            kept.append(line)
    ckpt.write_atomic(path, ("\n".join(kept) + ("\n" if kept else "")).encode())
