"""One prediction across several GPUs with Dynamic Axial Parallelism (FastFold 4.2), and the
policy that shares a batch of inputs between ranks.

``torchrun --nproc-per-node N -m fold_train.cli predict ... --dap N`` runs one input on N ranks
(:func:`run_distributed`). What runs where:

* **AF2**: the Evoformer, extra MSA and template pair stacks under DAP
  (``fold_parallel.enable_dap``: N_res and N_seq zero-padded, with zero masks, to a multiple of
  N on the way in and cropped on the way out); the embedders, the structure module and the heads
  run whole on every rank (small next to the trunk; every rank then holds the result and no
  broadcast is needed).
* **AF3**: the MSA module, Pairformer and template embedder under DAP. Those stacks split their
  whole inputs themselves, so the tokens and MSA rows are padded here, with zero masks, to a
  multiple of N (:meth:`PredictParallel.pad_af3`). The diffusion samples are split over the
  ranks as data parallelism (:meth:`PredictParallel.sample_share`): every rank draws the random
  numbers of *all* samples from the seeded generator, in the one-process order, and keeps its
  share, so the distributed prediction equals the one-process one; the samples are gathered for
  ranking (:meth:`PredictParallel.gather_samples`). Samples rather than the diffusion
  transformer's pair bias split along tokens: no communication in the sampler's steps at all
  (the other split needs an all-gather per attention layer per step), and it needs no change to
  the diffusion module. The AF3 rows of ``benchmarks/parallel/predict_dap.py`` on 2-8 GPUs are
  what would show whether the other split is worth it (not run yet: no multi-GPU machine).
* **DAO**: the Evoformer's MSA all-to-all overlaps the pair stack (``dao``, on by default).
* **Chunking per rank**: ``--chunk-size`` (every block chunks its shard). AutoChunk plans a stack
  by tracing it with torch.fx on fake tensors, which cannot run the DAP collectives: refused
  under DAP > 1 (AutoChunk with DAP 1 is unchanged).
* **CUDA graphs** are off under DAP > 1 (NCCL collectives inside captured graphs are not
  supported by this code; at thousands of residues the launch overhead graphs remove is small).
* **BP** (``--bp 2``, AF2 with the Parallel Evoformer): the MSA and pair branches of each
  block on two ranks (HelixFold / Parallel Evoformer), DAP inside each branch; world = DAP x BP.
* **Only rank 0 writes** (:attr:`PredictParallel.writes`).
* **Failures** (:func:`fail_together`): a rank that fails posts its error in the process group's
  store; every other rank stops with an error naming that rank (:class:`RankFailed`), also one
  blocked inside a collective the failed rank will never join.

The memory plan per rank is :func:`rank_estimate` (the one-device estimate of
:mod:`fold_train.memory_estimate` spread over the DAP degree); :func:`choose_dap` picks the
smallest degree that fits (:func:`more_ranks_hint`: the pre-flight refusal names it), and
:func:`plan_batch` shares a batch of inputs between ranks: inputs that fit one device are dealt
to the ranks, DAP only for those that do not; :func:`dispatch_batch` runs such a plan (for
``fold-train predict --input-dir`` under torchrun: :mod:`fold_train.predict_batch_dap`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BatchPlan",
    "PredictParallel",
    "RankFailed",
    "Together",
    "choose_dap",
    "dispatch_batch",
    "fail_together",
    "more_ranks_hint",
    "plan_batch",
    "rank_estimate",
    "rank_plan",
    "run_distributed",
]

FAIL_RANK_ENV = "FOLD_PREDICT_FAIL_RANK"  # tests only: this rank raises inside the prediction


class RankFailed(RuntimeError):
    """A rank of a distributed prediction failed; the message names it and says why."""


# -- memory plan per rank -----------------------------------------------------------------------
def rank_estimate(est, dap: int):
    """The :class:`~fold_train.memory_estimate.MemoryEstimate` of one rank of ``dap``.

    Transients (attention logits, outer product, triangle projections; AF3's diffusion logits,
    whose samples are split too) are per shard: ``1 / dap``. A resident representation and its
    update: the stacks take the whole tensor in and give the whole tensor back on every rank
    (``BlockStack.run`` scatters and gathers), while the update lives as a shard: half of each
    resident part stays whole, half divides. Approximate, like the estimate it divides; this is
    the one place that turns it into a per-rank plan."""
    if dap < 1:
        raise ValueError(f"DAP degree must be >= 1, got {dap}")
    if dap == 1:
        return est
    resident = {k: int(v * (1 + 1 / dap) / 2) for k, v in est.resident.items()}
    transient = {k: -(-v // dap) for k, v in est.transient.items()}
    return dataclasses.replace(est, what=f"{est.what} per rank of DAP {dap}", resident=resident,
                               transient=transient)


def rank_plan(est, dap: int):
    """``(per-rank estimate, chunking options)`` of the pre-flight check of one rank of ``dap``:
    under DAP the chunking that can help is the manual chunk size of each rank's shard
    (AutoChunk cannot trace the collectives), so that is the option a refusal names."""
    mine = rank_estimate(est, dap)
    if dap == 1 or not est.chunkable:
        return mine, []
    hint = ("a smaller --chunk-size" if mine.chunk_fraction < 1 else
            "chunk each rank's shard: --chunk-size 64 (smaller for less memory)")
    return dataclasses.replace(mine, chunkable=False), [hint]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_dap(est, budget: int, world_size: int) -> int | None:
    """The smallest DAP degree dividing ``world_size`` whose per-rank peak
    (:func:`rank_estimate`) fits ``budget`` bytes; None when even ``world_size`` ranks do not."""
    for d in _divisors(world_size):
        if rank_estimate(est, d).peak_bytes <= budget:
            return d
    return None


def more_ranks_hint(est, budget: int, dap: int = 1, max_ranks: int = 64) -> str:
    """The option of a pre-flight refusal that names how many GPUs would fit ``est`` (the
    one-device estimate) at ``budget`` bytes each: the smallest degree above ``dap`` up to
    ``max_ranks`` whose :func:`rank_estimate` fits (``choose_dap`` over any count of GPUs)."""
    from fold_data.limits import format_bytes

    for d in range(dap + 1, max_ranks + 1):
        peak = rank_estimate(est, d).peak_bytes
        if peak <= budget:
            return (f"split it over {d} GPUs with DAP, about {format_bytes(peak)} each "
                    f"(torchrun --nproc-per-node {d} -m fold_train.cli predict ... --dap {d})")
    return f"more GPUs with DAP would not fit it either (not even {max_ranks})"


@dataclass(frozen=True)
class Phase:
    """Inputs predicted with DAP degree ``dap``: ``replicas[i]`` are the names replica ``i``
    (world ranks ``i * dap .. i * dap + dap - 1``, fold-parallel's layout) predicts in turn."""

    dap: int
    replicas: tuple[tuple[str, ...], ...]

    def ranks(self, replica: int) -> range:
        return range(replica * self.dap, (replica + 1) * self.dap)


@dataclass(frozen=True)
class BatchPlan:
    """:func:`plan_batch`'s answer: phases in increasing DAP degree (all ranks finish a phase
    before the next, which regroups them), and the inputs too large for all ranks together."""

    phases: tuple[Phase, ...]
    refused: tuple[str, ...]

    def work_of(self, rank: int) -> list[tuple[int, int, str]]:
        """``(dap degree, replica, name)`` of each input ``rank`` takes part in, in order."""
        out = []
        for ph in self.phases:
            replica = rank // ph.dap
            out += [(ph.dap, replica, name) for name in ph.replicas[replica]]
        return out


def plan_batch(estimates: Mapping[str, Any], world_size: int, budget: int, *,
               cost: Callable[[Any], float] | None = None, dap: int | None = None
               ) -> BatchPlan:
    """Share a batch of inputs (``{name: MemoryEstimate}`` of one device) between
    ``world_size`` ranks with ``budget`` bytes each: every input gets the smallest DAP degree
    that fits (:func:`choose_dap`; 1 for most), and the inputs of one degree are dealt to its
    ``world_size / dap`` replicas, largest first, each to the replica with the least work so
    far (LPT scheduling). ``cost``: an input's work (default: the sum of its transients, which
    grow like the triangle attention's N^3). ``dap``: the one degree an input that does not
    fit one rank gets (``--dap``; a divisor of ``world_size``) instead of the smallest that
    fits. Inputs that fit no allowed degree are ``refused`` (their pre-flight check then says
    why)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if dap is not None and (dap < 1 or world_size % dap):
        raise ValueError(f"DAP degree {dap} does not divide the world size {world_size}")
    cost = cost or (lambda e: float(sum(e.transient.values())))
    by_degree: dict[int, list[str]] = {}
    refused = []
    for name, est in estimates.items():
        if dap is None:
            d = choose_dap(est, budget, world_size)
        else:  # one rank when it fits, else the given degree
            d = next((k for k in sorted({1, dap})
                      if rank_estimate(est, k).peak_bytes <= budget), None)
        if d is None:
            refused.append(name)
        else:
            by_degree.setdefault(d, []).append(name)
    phases = []
    for d in sorted(by_degree):
        n_rep = world_size // d
        load = [0.0] * n_rep
        assigned: list[list[str]] = [[] for _ in range(n_rep)]
        # largest first; ties by name so that every rank computes the same plan
        for name in sorted(by_degree[d], key=lambda n: (-cost(estimates[n]), n)):
            i = min(range(n_rep), key=lambda r: (load[r], r))
            assigned[i].append(name)
            load[i] += cost(estimates[name])
        phases.append(Phase(d, tuple(tuple(a) for a in assigned)))
    return BatchPlan(tuple(phases), tuple(refused))


# -- this rank's part -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PredictParallel:
    """This rank's part in a prediction shared by a DAP group (and, AF2's Parallel Evoformer,
    a BP pair of them): what ``Family.predict`` needs to run distributed (``groups`` for
    ``parallelize``, who writes, AF3's padding and samples)."""

    rank: int  # world rank
    dap_rank: int  # index in the DAP group
    dap: int  # DAP degree
    groups: Any = None  # fold_parallel.ParallelGroups (None: DAP 1, BP 1)
    dao: bool = True
    bp: int = 1  # Branch Parallelism degree (AF2, block_order=parallel)
    bp_rank: int = 0  # index in the BP group

    @property
    def writes(self) -> bool:
        """Whether this rank writes the outputs (the first rank of the model's group)."""
        return self.dap_rank == 0 and self.bp_rank == 0

    def adjust(self, techniques):
        """``techniques`` (``fold_train.parallelize.Techniques``) with this model group's
        ``groups`` and DAO, and CUDA graphs off (module docstring); unchanged for one rank."""
        if self.dap == 1 and self.bp == 1:
            return techniques
        return dataclasses.replace(techniques, groups=self.groups, dao=self.dao,
                                   cuda_graphs=False)

    def pad_af3(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An AF3 batch ``[B, ...]`` with N_token and N_msa padded (zero masks, fold-data's fill
        values) to multiples of the DAP degree: AF3's trunk stacks split them themselves."""
        if self.dap == 1:
            return batch
        from fold_train.buckets import resize_batch

        sizes = {"N_token": batch["token_mask"].shape[-1], "N_msa": batch["msa_mask"].shape[-2]}
        padded = {k: -(-n // self.dap) * self.dap for k, n in sizes.items()}
        if padded == sizes:
            return batch
        return resize_batch(batch, "af3", padded)

    def sample_share(self, no_samples: int) -> tuple[int, int]:
        """``(first, end)`` of the diffusion samples this rank draws: a contiguous share, the
        last samples on the group's first rank (the writer), so that with fewer samples than
        ranks the ranks without one are the others."""
        i = self.dap - 1 - self.dap_rank
        return i * no_samples // self.dap, (i + 1) * no_samples // self.dap

    def gather_samples(self, out: dict[str, torch.Tensor], keys: Sequence[str]
                       ) -> dict[str, torch.Tensor]:
        """``out`` with each of ``keys`` (``[B, S_rank, ...]``: this rank's samples) replaced by
        ``[B, S, ...]`` of all samples in sample order, on every rank of the DAP group (host
        tensors: coordinates, pLDDT and the pair confidences of S samples); the other entries
        are the same on every rank and stay as they are."""
        if self.dap == 1:
            return out
        import torch.distributed as dist

        mine = (self.dap - 1 - self.dap_rank, {k: out[k].detach().cpu() for k in keys})
        everyone: list[Any] = [None] * self.dap
        dist.all_gather_object(everyone, mine, group=self.groups.dap_group)
        everyone.sort(key=lambda r: r[0])  # by first sample
        return {**out, **{k: torch.cat([r[1][k] for r in everyone], dim=1) for k in keys}}


def single_process() -> PredictParallel:
    return PredictParallel(rank=0, dap_rank=0, dap=1)


# -- failures -------------------------------------------------------------------------------------
_calls = itertools.count(1)  # every rank calls fail_together in the same order


def _store():
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def _failures(store, base: str, world: int) -> list[dict]:
    """The failures posted so far, first first."""
    out = []
    for r in range(world):
        if store.check([f"{base}/failed/{r}"]):
            out.append(json.loads(store.get(f"{base}/failed/{r}").decode()))
    return sorted(out, key=lambda f: f["order"])


def _describe(f: dict, phase: str) -> str:
    return f"rank {f['rank']} failed to {phase}: {f['type']}: {f['message']}"


class _Watch(threading.Thread):
    """Ends this rank when another posts a failure: the main thread may be blocked in a
    collective that the failed rank will never join (NCCL and gloo would wait for the process
    group's timeout)."""

    def __init__(self, store, base: str, rank: int, world: int, phase: str, poll_s: float,
                 stop_process: Callable[[int], None]) -> None:
        super().__init__(daemon=True, name="fold-predict-failure-watch")
        self.store, self.base, self.rank, self.world, self.phase = store, base, rank, world, phase
        self.poll_s, self.stop_process = poll_s, stop_process
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                if int(self.store.add(f"{self.base}/order", 0)) == 0:
                    continue
                first = _failures(self.store, self.base, self.world)
            except Exception:  # noqa: BLE001 - the store went away: the job is ending anyway
                return
            if self.stopped.is_set() or not first or first[0]["rank"] == self.rank:
                continue
            print(f"fold-train predict: {_describe(first[0], self.phase)}; rank {self.rank} "
                  "stops", file=sys.stderr, flush=True)
            self.stop_process(1)
            return


class Together:
    """What :func:`fail_together` yields: :meth:`barrier` waits, as long as it takes, for every
    rank to reach a point (no collective timeout: a rank may predict for an hour), and raises
    :class:`RankFailed` when one fails meanwhile."""

    def __init__(self, store, base: str, ctx, phase: str, poll_s: float) -> None:
        self.store, self.base, self.ctx, self.phase, self.poll_s = store, base, ctx, phase, poll_s
        self._barriers = itertools.count(1)

    def failed(self) -> dict | None:
        """The first failure posted so far, if any."""
        if self.store is None or int(self.store.add(f"{self.base}/order", 0)) == 0:
            return None
        return _failures(self.store, self.base, self.ctx.world_size)[0]

    def barrier(self, what: str = "finished") -> None:
        if self.store is None:
            return
        key = f"{self.base}/barrier/{next(self._barriers)}"
        self.store.add(key, 1)
        while int(self.store.add(key, 0)) < self.ctx.world_size:
            first = self.failed()
            if first is not None:
                raise RankFailed(f"{_describe(first, self.phase)}; rank {self.ctx.rank} had "
                                 f"{what}")
            time.sleep(self.poll_s)


@contextmanager
def fail_together(ctx, phase: str, *, poll_s: float = 0.2,
                  stop_process: Callable[[int], None] = os._exit) -> Iterator[Together]:
    """Run the block on every rank of ``ctx`` (a ``DistContext``); when it raises on one rank,
    every rank ends with an error naming that rank and its error (``phase`` completes "rank r
    failed to {phase}").

    The failing rank posts its error in the process group's store and raises
    :class:`RankFailed` (from its own exception). The others: a rank whose own block raises
    too (e.g. a collective broken by the failed peer) raises :class:`RankFailed` naming the first
    rank that failed; a rank still inside the block (blocked in a collective, or computing
    towards one) is ended by a watcher thread with that message on stderr and exit status 1
    (``stop_process``); a rank that finished waits for every other to finish and raises if one
    failed. Single process: just the block. Yields a :class:`Together` (its barrier waits
    without a timeout while the watcher keeps watching)."""
    if not ctx.distributed:
        yield Together(None, "", ctx, phase, poll_s)
        return
    store, base, world = _store(), f"fold_predict/{next(_calls)}", ctx.world_size
    watch = _Watch(store, base, ctx.rank, world, phase, poll_s, stop_process)
    watch.start()
    try:
        if os.environ.get(FAIL_RANK_ENV) == str(ctx.rank):  # tests: a rank that fails first
            raise RuntimeError(f"injected failure ({FAIL_RANK_ENV}={ctx.rank})")
        together = Together(store, base, ctx, phase, poll_s)
        yield together
    except BaseException as e:
        watch.stopped.set()
        order = int(store.add(f"{base}/order", 1))
        store.set(f"{base}/failed/{ctx.rank}", json.dumps({
            "rank": ctx.rank, "order": order, "type": type(e).__name__,
            "message": str(e)[:4000]}))
        first = _failures(store, base, world)[0]
        if first["rank"] == ctx.rank:
            raise RankFailed(_describe(first, phase)) from e
        raise RankFailed(f"{_describe(first, phase)}; rank {ctx.rank} stopped "
                         f"({type(e).__name__}: {str(e)[:300]})") from e
    watch.stopped.set()
    together.barrier()  # a rank that finished waits for the others (and hears of a failure)


# -- a batch of inputs over the ranks -------------------------------------------------------------
def dispatch_batch(ctx, estimates: Mapping[str, Any], budget: int,
              predict_one: Callable[[str, PredictParallel], Any], *,
              phase: str = "predict the batch", dap: int | None = None, dao: bool = True,
              order: Callable[[str], Any] | None = None,
              end_phase: Callable[[int], None] | None = None) -> dict[str, Any] | None:
    """Predict a batch of inputs on every rank of ``ctx`` (a ``DistContext`` of the whole job)
    by :func:`plan_batch`: the inputs that fit one device (``estimates``: ``{name:
    MemoryEstimate}`` of one device; ``budget``: this rank's bytes, the smallest over the ranks
    is used) are dealt to the ranks, the others get the smallest DAP degree that fits (or
    ``dap``), phase by phase. ``predict_one(name, parallel)`` predicts one input as this rank's
    part (:class:`PredictParallel`: its writer writes), a replica's inputs in the order of
    ``order(name)`` (default: the plan's, largest first); ``end_phase(dap)`` runs on every rank
    after each phase (a runner of that degree released). The results come back on rank 0 as
    ``{name: result}`` (None on the other ranks), with ``{"refused": why}`` for the inputs too
    large for the allowed degrees. Between phases the ranks wait for each other without a
    timeout; a rank that fails ends every rank with an error naming it
    (:func:`fail_together`)."""
    import torch.distributed as dist
    from fold_data.limits import format_bytes

    from fold_train.distributed import gather_objects

    # every rank plans with the same budget (objects: NCCL reduces no host tensor)
    budget = min(gather_objects(int(budget), ctx))
    plan = plan_batch(estimates, ctx.world_size, budget, dap=dap)
    groups = {p.dap: _dap_groups(p.dap, ctx.world_size) for p in plan.phases if p.dap > 1}
    mine: dict[str, Any] = {}
    with fail_together(ctx, phase) as together:
        for ph in plan.phases:
            replica = ctx.rank // ph.dap
            g = groups.get(ph.dap)
            parallel = PredictParallel(ctx.rank, ctx.rank % ph.dap, ph.dap, g, dao=dao)
            names = ph.replicas[replica]
            for name in sorted(names, key=order) if order is not None else names:
                result = predict_one(name, parallel)
                if parallel.writes:
                    mine[name] = result
            if end_phase is not None:
                end_phase(ph.dap)
            together.barrier(f"finished its DAP {ph.dap} inputs")
    top = dap or ctx.world_size  # the largest degree an input could get
    for name in plan.refused:
        peak = rank_estimate(estimates[name], top).peak_bytes
        on = f"all {top} ranks" if top == ctx.world_size else f"DAP {top} (--dap)"
        mine.setdefault(name, {"refused": f"needs about {format_bytes(peak)} per rank even on "
                                          f"{on}, {format_bytes(budget)} available"})
    if not ctx.distributed:
        return mine
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    if ctx.rank != 0:
        return None
    return {name: r[name] for name in estimates for r in everyone if name in r}


def _dap_groups(dap: int, world: int):
    """fold-parallel's groups of ``world / dap`` replicas of ``dap`` ranks (collective: every
    rank makes every group, in the same order)."""
    from fold_parallel import ParallelConfig, build_groups

    return build_groups(ParallelConfig(dp=world // dap, dap=dap))


# -- fold-train predict --dap ---------------------------------------------------------------------
def requested(args: argparse.Namespace) -> bool:
    """Whether ``fold-train predict`` runs distributed: ``--dap`` given, or started by torchrun
    with more than one process. ``--search`` is refused then (every rank would search and
    write the same files): search once, then predict with the MSAs it wrote."""
    wanted = (getattr(args, "dap", None) is not None or (getattr(args, "bp", None) or 1) > 1
              or int(os.environ.get("WORLD_SIZE", "1")) > 1)
    if wanted and getattr(args, "search", None):
        from fold_train.errors import ConfigError

        raise ConfigError("--search with --dap / torchrun: run fold-train predict --search on "
                          "one process first, then predict with the MSAs it wrote (--msa, or "
                          "the AF3 JSON it wrote)")
    return wanted


def run_distributed(args: argparse.Namespace, family, device: str | None) -> dict | None:
    """``fold-train predict`` of one input on every rank of the torchrun job: DAP x BP of the
    whole world (``--dap`` times ``--bp`` must equal the world size; default ``--dap``: the
    world over ``--bp``). Returns the summary on rank 0 (the writer), None on the others."""
    from fold_train.distributed import model_parallel, setup, teardown
    from fold_train.errors import ConfigError

    world = int(os.environ.get("WORLD_SIZE", "1"))
    bp = getattr(args, "bp", None) or 1
    if bp > 1 and not family.branch_parallel:
        raise ConfigError(f"--bp {bp}: branch parallelism is the AF2 Parallel Evoformer's; "
                          f"{family.name.upper()} predicts with --dap")
    dap = args.dap if getattr(args, "dap", None) is not None else max(1, world // bp)
    if dap < 1:
        raise ConfigError(f"--dap must be >= 1, got {dap}")
    if dap * bp != world:
        raise ConfigError(f"--dap {dap}{f' x --bp {bp}' if bp > 1 else ''} with {world} "
                          f"processes: one input is split over every rank, so start it with "
                          f"torchrun --nproc-per-node {dap * bp} (the world size is {world})")
    if dap > 1 and getattr(args, "autochunk", None) is not None:
        raise ConfigError("--autochunk traces the stacks with torch.fx and cannot trace DAP's "
                          "collectives: under --dap > 1 chunk each rank's shard with "
                          "--chunk-size (e.g. 64)")
    if dap * bp > 1 and getattr(args, "msa_offload", False):
        raise ConfigError("--msa-offload keeps one device's MSA representation in host memory; "
                          "under --dap/--bp each rank already holds only its shard: leave "
                          "--msa-offload out")
    ctx = setup(None if device is None or world > 1 else device)
    try:
        ctx = model_parallel(ctx, dap=dap, bp=bp)
        groups = ctx.groups
        parallel = PredictParallel(rank=ctx.rank, dap_rank=groups.dap_index if groups else 0,
                                   dap=dap, groups=groups,
                                   dao=not getattr(args, "no_dao", False), bp=bp,
                                   bp_rank=groups.bp_index if groups else 0)
        args.parallel = parallel
        with fail_together(ctx, "predict"):
            summary = family.predict(args, str(ctx.device))
        if parallel.writes:
            return {**summary, "dap": dap, **({"bp": bp} if bp > 1 else {})}
        return None
    finally:
        teardown(ctx)
