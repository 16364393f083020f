"""``torchrun --nproc-per-node N -m fold_train.cli predict --input-dir DIR --out-dir OUT
[--dap D]``: a batch of inputs over the ranks of one job (issue 28). Inputs that fit one device
are dealt to the ranks; DAP only for those that do not.

On every rank, in this order:

1. **Sizing.** Rank 0 lists ``DIR`` (:func:`~fold_train.predict_batch.find_inputs`) and sends the
   list to the others. Every rank loads the model for one rank (DAP 1) and sizes its share of
   the inputs (read, not featurised: the runner's ``estimate``, the one-device
   :class:`~fold_train.memory_estimate.MemoryEstimate` of the pre-flight check); the shares are
   gathered, so every rank holds the same estimates. An input that cannot be read or is over the
   data limits is reported here and skipped.
2. **Plan.** :func:`~fold_train.predict_dap.dispatch_batch` plans with
   :func:`~fold_train.predict_dap.plan_batch` for the smallest budget of any rank (its free
   memory after loading the model, or ``--memory-limit``): an input that fits one device goes to
   one rank, a larger one to a DAP group of the smallest degree that fits (with ``--dap D``: of
   degree D), in phases of increasing degree. An input too large for every allowed degree is
   reported as failed, not predicted. Every runner's size check then uses that same budget, so
   the check agrees with the plan.
3. **Runners.** One per DAP degree a rank takes part in: the model loaded once per degree
   (parallelised for that degree's groups; the previous degree's runner is released first).
   Within a replica the inputs run in the one-process batch's order (shape bucket, then name);
   under DAP 1 a bucket's CUDA graphs are released when the next bucket starts (graphs are off
   under DAP > 1).
4. **One input.** Read and featurised on every rank of its group (no collective), then the ranks
   of a DAP group agree on that outcome (one all-gather over the group) and run the model only
   when every one of them has the input; the group's writing rank writes ``OUT/<name>/``, once.
5. **End.** The rows are gathered on rank 0, which prints the table and writes
   ``OUT/batch_summary.json`` (:func:`~fold_train.predict_batch.finish_batch`); the other
   ranks write nothing; every rank exits with the batch's status (1 when an input failed).

Failures. An input that cannot be read, is too large, or whose prediction is refused (non-finite
or absurd coordinates) is reported and skipped: these are the same on every rank of a group
(decided before the first collective, or computed from what the collectives gave every rank
alike), so the group's collectives stay matched. Under DAP 1 any error of an input's prediction
is skipped, as in one process (out of memory included). Inside a DAP group an error that is not
the input's (out of memory on one rank, a crash) cannot be skipped: the group's other ranks are
inside collectives the failed rank will not join, so every rank of the job ends with an error
naming it (:func:`~fold_train.predict_dap.fail_together`), and no summary is written.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from fold_data.errors import InputError

__all__ = ["check_batch_args", "run_batch_distributed"]

# the failures of one input that every rank of a DAP group meets alike, or that come after the
# group's last collective (a write): skipped under DAP > 1 too (module docstring)
INPUT_FAILURES = (InputError, FloatingPointError, OSError)


def check_batch_args(args: argparse.Namespace, world: int) -> None:
    """Refuse what a batch over ``world`` ranks cannot do: ``--dap`` that does not divide the
    world, ``--bp`` (a fixed layout of every rank, not planned per input), and ``--autochunk`` /
    ``--msa-offload``, which DAP > 1 cannot take, unless ``--dap 1`` keeps every input on one
    rank."""
    from fold_train.errors import ConfigError

    dap = getattr(args, "dap", None)
    if dap is not None and (dap < 1 or world % dap):
        raise ConfigError(f"--dap {dap} with {world} processes: --input-dir gives the inputs that "
                          "do not fit one GPU DAP groups of --dap ranks, so --dap must divide "
                          f"the world size ({world})")
    if (getattr(args, "bp", None) or 1) > 1:
        raise ConfigError("--bp with --input-dir: the batch plans DAP groups per input; run "
                          "--bp on one input at a time")
    if dap != 1:
        for flag in ("autochunk", "msa_offload"):
            if getattr(args, flag, None) not in (None, False):
                raise ConfigError(f"--{flag.replace('_', '-')} with --input-dir under torchrun: "
                                  "inputs that do not fit one GPU run under DAP, which cannot "
                                  "take it; give --dap 1 (every input on one rank) or chunk "
                                  "each rank with --chunk-size")


def run_batch_distributed(args: argparse.Namespace, family, find: Callable[[], tuple],
                          device: str | None) -> int:
    """``fold-train predict --input-dir`` on every rank of the torchrun job (module docstring):
    ``find()`` lists the inputs (``(items, failed)`` of
    :func:`~fold_train.predict_batch.find_inputs`; called on rank 0). Returns the exit status,
    the same on every rank."""
    from fold_train.distributed import setup, teardown

    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_batch_args(args, world)
    ctx = setup(None if world > 1 else device)
    try:
        return _Batch(args, family, ctx).run(find)
    finally:
        teardown(ctx)


class _Batch:
    """One rank's part of the batch: its runners by DAP degree and the inputs' sizes."""

    def __init__(self, args: argparse.Namespace, family, ctx) -> None:
        self.args, self.family, self.ctx = args, family, ctx
        self.runners: dict[int, Any] = {}  # DAP degree -> runner (one at a time)
        self.buckets: dict[int, tuple] = {}  # DAP degree -> its runner's last bucket
        self.budget: int | None = None  # bytes per rank, agreed by all ranks
        self.items: dict[str, Any] = {}
        self.sizes: dict[str, dict[str, int]] = {}
        self.err = sys.stderr

    # -- runners -------------------------------------------------------------------------------
    def runner(self, parallel):
        """The runner of ``parallel``'s DAP degree, built on first use (a runner of another
        degree is released first: phases never come back to a degree)."""
        d = parallel.dap
        if d not in self.runners:
            if self.runners:  # the previous degree's model: freed before this one loads
                self.runners.clear()
                gc.collect()
                if self.ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
            ns = argparse.Namespace(**{**vars(self.args), "parallel": parallel})
            if self.budget is not None:  # the plan's budget: the size check agrees with it
                ns.memory_limit = self.budget
            self.runners[d] = self.family.predict_runner(ns, str(self.ctx.device))
            self.buckets.pop(d, None)
        return self.runners[d]

    # -- 1. sizing ------------------------------------------------------------------------------
    def size_all(self, find) -> tuple[dict, list[dict]]:
        """``({name: estimate}, failed rows)``, the same on every rank (module docstring, 1)."""
        import torch.distributed as dist

        from fold_train.distributed import gather_objects
        from fold_train.predict_batch import failure_reason
        from fold_train.predict_dap import PredictParallel, fail_together

        ctx = self.ctx
        with fail_together(ctx, "size the batch's inputs"):
            listed = [find() if ctx.rank == 0 else None]
            if ctx.distributed:
                dist.broadcast_object_list(listed, src=0)
            items, failed = listed[0]
            runner = self.runner(PredictParallel(ctx.rank, 0, 1))  # DAP 1: no groups
            mine = {}
            for i in range(ctx.rank, len(items), ctx.world_size):  # this rank's share
                try:
                    mine[i] = runner.estimate(items[i])
                except Exception as e:  # noqa: BLE001 (reported and skipped: the batch goes on)
                    mine[i] = failure_reason(e)
        sized: dict[int, Any] = {}
        for share in gather_objects(mine, ctx):  # every rank has finished its share
            sized.update(share)
        rows = [{"input": f, "name": os.path.splitext(os.path.basename(f))[0],
                 "status": "failed", "reason": r} for f, r in failed]
        estimates = {}
        for i, item in enumerate(items):
            got = sized[i]
            if item.name in self.items:  # OUT/<name> would be written twice
                got = (f"its output folder {item.name!r} is also that of "
                       f"{self.items[item.name].path}; rename one of them")
            if isinstance(got, str):
                rows.append({"input": str(item.path), "name": item.name, "status": "failed",
                             "reason": got})
                continue
            self.items[item.name] = item
            self.sizes[item.name], estimates[item.name] = got
        return estimates, rows

    # -- 3-4. one input ---------------------------------------------------------------------------
    def predict_one(self, name: str, parallel) -> dict:
        """Predict input ``name`` as this rank's part of ``parallel`` (module docstring, 4);
        returns its row of the summary (the writer's is the one kept)."""
        import torch.distributed as dist

        from fold_train.predict_batch import bucket_key, failure_reason

        runner = self.runner(parallel)
        item, size = self.items[name], self.sizes[name]
        bucket = bucket_key(size)
        if self.buckets.get(parallel.dap, bucket) != bucket:
            runner.predictor.release()  # the last bucket's graphs: not needed again
        self.buckets[parallel.dap] = bucket
        first = parallel.rank - parallel.dap_rank
        row: dict = {"input": str(item.path), "name": name, **size, "bucket": dict(bucket),
                     "dap": parallel.dap, "ranks": list(range(first, first + parallel.dap))}
        t0 = time.perf_counter()
        why = None
        try:
            prepared = runner.prepare_item(item)
        except Exception as e:  # noqa: BLE001 (reported and skipped; agreed below under DAP)
            why = failure_reason(e)
        if parallel.dap > 1:  # no collective so far: the group agrees before the model runs
            said: list[Any] = [None] * parallel.dap
            dist.all_gather_object(said, (parallel.rank, why), group=parallel.groups.dap_group)
            others = [(r, w) for r, w in said if w is not None]
            if why is None and others:
                why = f"rank {others[0][0]} of its DAP group: {others[0][1]}"
        if why is None:
            try:
                summary = runner.predict_item(prepared, seeds=self.args.seeds,
                                              out_dir=self.args.out_dir)
            except Exception as e:
                if parallel.dap > 1 and not isinstance(e, INPUT_FAILURES):
                    # its peers are in collectives it will not join: fail_together ends them
                    raise RuntimeError(f"{type(e).__name__} in the DAP {parallel.dap} "
                                       f"prediction of {name} ({item.path}): {e}") from e
                if isinstance(e, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
                why = failure_reason(e)
            else:
                row.update(status="ok", out_dir=summary.get("out_dir"),
                           ranking_score=summary.get("ranking_score"),
                           mean_plddt=summary.get("mean_plddt"), ptm=summary.get("ptm"))
        if why is not None:
            row.update(status="failed", reason=why)
        row["seconds"] = round(time.perf_counter() - t0, 3)
        if parallel.writes:
            label = ", ".join(f"{d} {n}" for d, n in size.items())
            what = (f"ok, ranking_score {row['ranking_score']}" if why is None
                    else f"FAILED: {why}")
            where = (f"rank {parallel.rank}" if parallel.dap == 1
                     else f"ranks {first}-{first + parallel.dap - 1}, DAP {parallel.dap}")
            print(f"[{where}] {name} ({label}): {what} ({row['seconds']:.1f} s)",
                  file=self.err, flush=True)
        return row

    # -- the whole batch -------------------------------------------------------------------------
    def run(self, find) -> int:
        import torch.distributed as dist

        from fold_train.distributed import gather_objects
        from fold_train.memory_estimate import budget_bytes
        from fold_train.predict_batch import batch_status, bucket_key, finish_batch
        from fold_train.predict_dap import dispatch_batch

        ctx = self.ctx
        estimates, rows = self.size_all(find)
        if ctx.rank == 0:  # refused before any prediction: said at once, not only in the table
            for r in rows:
                print(f"[skip] {r['name']}: FAILED: {r['input']}: {r['reason']}", file=self.err,
                      flush=True)
        # the smallest over the ranks: what plan_batch plans with
        budget = min(gather_objects(budget_bytes(ctx.device, getattr(self.args, "memory_limit",
                                                                      None)), ctx))
        self.budget = budget
        for runner in self.runners.values():  # the DAP-1 runner of the sizing
            runner.memory_limit = budget
        results = dispatch_batch(ctx, estimates, budget, self.predict_one,
                                 dap=getattr(self.args, "dap", None),
                                 dao=not getattr(self.args, "no_dao", False),
                                 order=lambda n: (bucket_key(self.sizes[n]), n))
        self.runners.clear()
        if ctx.rank == 0:  # the one-process batch's order: shape bucket, then name
            for name in sorted(results, key=lambda n: (bucket_key(self.sizes[n]), n)):
                r = results[name]
                if "refused" in r:
                    item = self.items[name]
                    r = {"input": str(item.path), "name": name, **self.sizes[name],
                         "bucket": dict(bucket_key(self.sizes[name])), "status": "failed",
                         "reason": f"{item.path}: input too large for the batch's ranks: "
                                   f"{r['refused']}"}
                rows.append(r)
        status = [batch_status(rows) if ctx.rank == 0 else None]
        if ctx.distributed:
            dist.broadcast_object_list(status, src=0)
        if ctx.rank == 0:
            return finish_batch(rows, self.args.out_dir)
        return int(status[0])

