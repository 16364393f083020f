"""Gradient synchronization for DP x BP x DAP.

With the gradient convention of :mod:`fold_parallel.comm` (every rank of a sample backpropagates
the whole loss through its share), averaging every parameter's gradient over the ranks of a
group gives the right gradient for DP, for DAP and for BP alike, so hybrid training averages
over all ranks once (``groups.world_group``). A parameter a rank did not use (the other BP
branch) contributes zeros. Gradients are flattened into buckets of ``bucket_mb`` per dtype so that
a few large all-reduces replace hundreds of small ones (HelixFold's tensor fusion of gradients);
``comm_dtype=torch.bfloat16`` sends them in bf16.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from fold_parallel.comm import Collectives

__all__ = ["sync_gradients"]


def sync_gradients(
    params: nn.Module | Iterable[nn.Parameter],
    group: dist.ProcessGroup | None = None,
    bucket_mb: float | None = 25.0,
    comm_dtype: torch.dtype | None = None,
) -> None:
    """Average ``.grad`` of every trainable parameter over ``group`` in place (a missing grad is
    zero and becomes the average). ``bucket_mb=None`` sends one all-reduce per parameter."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    params = [p for p in params if p.requires_grad]
    coll = Collectives(group, impl="native", comm_dtype=comm_dtype, name="gradient-sync group")
    if coll.size == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    limit = None if bucket_mb is None else int(bucket_mb * 2**20)
    for bucket in _buckets(params, limit):
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        flat = coll.all_reduce(flat, inplace=True).wait().div_(coll.size)  # bucket: ours
        offset = 0
        for p in bucket:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def _buckets(params: list[nn.Parameter], limit: int | None) -> list[list[nn.Parameter]]:
    """Consecutive parameters of one dtype and device, up to ``limit`` bytes per bucket."""
    if limit is None:
        return [[p] for p in params]
    out: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        same_kind = out and (out[-1][0].dtype, out[-1][0].device) == (p.dtype, p.device)
        if same_kind and size + nbytes <= limit:
            out[-1].append(p)
            size += nbytes
        else:
            out.append([p])
            size = nbytes
    return out
