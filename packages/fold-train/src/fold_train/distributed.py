"""Data parallelism over the flat gradient buffer: torchrun start-up and the gradient all-reduce.

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

import torch
import torch.distributed as dist

from fold_train.optim import FlatParams

__all__ = ["DistContext", "all_reduce_gradients", "all_true", "setup", "teardown"]


@dataclass
class DistContext:
    """This process's place in the data-parallel job."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    group: dist.ProcessGroup | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


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
