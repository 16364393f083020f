"""Data parallelism over the flat gradient buffer: torchrun start-up, the gradient all-reduce,
and DAP / BP inside each data-parallel replica (through fold-parallel).

``torchrun --nproc-per-node G fold-train train ...`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`setup` then starts the process group (``fold_parallel.init_distributed``: NCCL on GPUs,
gloo on CPU) and each rank reads its own share of the sample stream.

:func:`all_reduce_gradients` averages the flat gradient buffers of a
:class:`~fold_train.optim.FlatParams` over the ranks: the buffer is cut into a few buckets, all
all-reduces are started asynchronously, and the sum of squares of each bucket is taken as soon as
its reduction completes while the later buckets are still in flight, so the global gradient norm
that clipping needs is ready when the last bucket lands (ScaleFold 3.3: gradient clipping hidden
behind the data-parallel communication). The norm is that of the *averaged* gradient, exactly
what clipping the averaged gradient requires.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fold_train.optim import FlatParams

__all__ = ["DistContext", "all_reduce_gradients", "all_true", "gather_objects",
           "layout_context", "model_parallel", "setup", "teardown"]


@dataclass
class DistContext:
    """This process's place in the job: its world rank, and, with DAP/BP, the data-parallel
    replica it belongs to (``dp_rank`` of ``dp_size``: the ranks of one replica train on the same
    samples). ``groups`` holds fold-parallel's process groups when DAP or BP is on."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    group: dist.ProcessGroup | None = None  # gradient averaging: all ranks
    dp_rank: int | None = None  # defaults to rank (pure data parallelism)
    dp_size: int | None = None  # defaults to world_size
    groups: Any = None  # fold_parallel.ParallelGroups with DAP/BP

    def __post_init__(self) -> None:
        if self.dp_rank is None:
            self.dp_rank = self.rank
        if self.dp_size is None:
            self.dp_size = self.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def model_parallel(ctx: DistContext, *, dap: int = 1, bp: int = 1) -> DistContext:
    """Split the world into data-parallel replicas of ``dap x bp`` ranks each (fold-parallel's
    groups; rank layout DAP fastest, then BP, then DP) and return the context with ``dp_rank``,
    ``dp_size`` and ``groups`` set. ``dap = bp = 1`` returns ``ctx`` unchanged."""
    if dap == 1 and bp == 1:
        return ctx
    if ctx.world_size % (dap * bp):
        raise ValueError(f"dap x bp = {dap} x {bp} does not divide the world size "
                         f"{ctx.world_size}")
    from fold_parallel import ParallelConfig, build_groups

    groups = build_groups(ParallelConfig(dp=ctx.world_size // (dap * bp), bp=bp, dap=dap))
    return DistContext(ctx.rank, ctx.world_size, ctx.device, ctx.group,
                       dp_rank=groups.dp_index, dp_size=groups.config.dp, groups=groups)


def layout_context(ctx: DistContext, ranks: int, *, dap: int = 1, bp: int = 1
                   ) -> DistContext | None:
    """The context of a job on world ranks ``0 .. ranks - 1`` only, split into replicas of
    ``dap x bp`` ranks as :func:`model_parallel` splits the world: gradients are averaged over
    those ranks, DAP/BP run in fold-parallel's groups among them (a benchmark timing several
    layouts in one world). Every rank of the world calls this in the same order (group creation
    is collective); the ranks outside get ``None`` and must not train meanwhile."""
    if ranks % (dap * bp) or not 1 <= ranks <= ctx.world_size:
        raise ValueError(f"a layout of {ranks} ranks with dap x bp = {dap} x {bp} does not fit "
                         f"a world of {ctx.world_size}")
    if ranks == 1:  # no groups to create: rank 0 alone
        return DistContext(0, 1, ctx.device, None) if ctx.rank == 0 else None
    from fold_parallel import ParallelConfig, build_groups

    groups = build_groups(ParallelConfig(dp=ranks // (dap * bp), bp=bp, dap=dap), subset=True)
    if groups is None:
        return None
    return DistContext(ctx.rank, ranks, ctx.device, groups.world_group,
                       dp_rank=groups.dp_index, dp_size=groups.config.dp,
                       groups=groups if dap * bp > 1 else None)


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj`` (small picklable state such as a data position), on every rank."""
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=ctx.group)
    return out


def setup(device: str | None = None) -> DistContext:
    """Start the process group when launched by torchrun (``WORLD_SIZE`` > 1), else a
    single-process context on ``device`` (default: CUDA when available)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from fold_parallel import init_distributed

        dev = init_distributed()
        return DistContext(dist.get_rank(), dist.get_world_size(), dev, None)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:  # "cuda": the current device by its index (torch.cuda's calls,
            dev = torch.device("cuda", torch.cuda.current_device())  # set_device too, need one)
        torch.cuda.set_device(dev)
    return DistContext(0, 1, dev, None)


def teardown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def _buckets(buf: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` (or fewer) contiguous views covering the flat ``buf``."""
    size = -(-buf.numel() // max(1, n))
    return [buf[i:i + size] for i in range(0, buf.numel(), size)]


@torch.no_grad()
def all_reduce_gradients(flat: FlatParams, ctx: DistContext, *, buckets: int = 4,
                         with_norm: bool = True) -> torch.Tensor | None:
    """Average the flat gradient buffers over the ranks in place; return the global L2 norm of
    the averaged gradient (0-dim fp32) when ``with_norm``, computed bucket by bucket as each
    all-reduce completes."""
    chunks = [c for g in flat.groups for c in _buckets(g.grad, buckets)]
    if not ctx.distributed:
        if not with_norm:
            return None
        return torch.stack([c.float().square().sum() for c in chunks]).sum().sqrt()
    works = [dist.all_reduce(c, group=ctx.group, async_op=True) for c in chunks]
    partial = []
    for c, work in zip(chunks, works):
        work.wait()
        c.div_(ctx.world_size)
        if with_norm:
            partial.append(c.float().square().sum())
    return torch.stack(partial).sum().sqrt() if with_norm else None


def all_true(flag: bool, ctx: DistContext) -> bool:
    """Whether ``flag`` holds on every rank (one tiny all-reduce; the skip decision for a
    non-finite step must be the same everywhere)."""
    if not ctx.distributed:
        return flag
    dev = ctx.device if ctx.device.type == "cuda" else torch.device("cpu")
    t = torch.tensor([1.0 if flag else 0.0], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctx.group)
    return bool(t.item() > 0.5)
