"""Process groups for hybrid DP x BP x DAP (HelixFold's hybrid parallelism) and torchrun setup.

World rank layout (DAP fastest, then BP, then DP), so that a sample's DAP and BP peers are
neighbours on one host::

    rank = (dp_index * bp + bp_index) * dap + dap_index

For each rank: ``dap_group`` (same dp, bp index; split activations), ``bp_group`` (same dp and dap
index; the two branches), ``dp_group`` (same bp and dap index; different samples) and
``model_group`` (all BP x DAP ranks of one sample). Gradients are averaged over *all* ranks
(see :mod:`fold_parallel.comm` for why that is right for DAP and BP too).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fold_parallel.guard import check_consistent

__all__ = ["ParallelConfig", "ParallelGroups", "init_distributed", "build_groups", "seed_ranks"]


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes of the three kinds of parallelism; ``dp * bp * dap`` must equal the world size."""

    dp: int = 1
    bp: int = 1
    dap: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "bp", "dap"):
            if getattr(self, name) < 1:
                raise ValueError(f"ParallelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.bp not in (1, 2):
            raise ValueError(
                f"ParallelConfig.bp must be 1 or 2 (the Evoformer has two branches), got {self.bp}"
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.bp * self.dap

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_index, bp_index, dap_index)`` of a world rank."""
        dap_index = rank % self.dap
        bp_index = (rank // self.dap) % self.bp
        return rank // (self.dap * self.bp), bp_index, dap_index

    def rank_of(self, dp_index: int, bp_index: int, dap_index: int) -> int:
        return (dp_index * self.bp + bp_index) * self.dap + dap_index


@dataclass
class ParallelGroups:
    """This rank's groups and indices (see the module docstring)."""

    config: ParallelConfig
    rank: int
    dp_index: int
    bp_index: int
    dap_index: int
    dap_group: dist.ProcessGroup
    bp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    model_group: dist.ProcessGroup
    world_group: dist.ProcessGroup


def init_distributed(
    backend: str | None = None,
    timeout_s: float = 300.0,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> torch.device:
    """``init_process_group`` from the torchrun environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) or the explicit arguments, with a collective
    timeout of ``timeout_s`` (a dead or stalled peer then raises on every other rank instead of
    hanging). NCCL when CUDA is available, else gloo. Returns this rank's device."""
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    if backend == "nccl":
        # Asynchronous error handling makes a timed-out NCCL collective abort the process with an
        # error instead of hanging (PyTorch's default, kept explicit).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return device


def build_groups(
    config: ParallelConfig, check: bool = True, *, subset: bool = False
) -> ParallelGroups | None:
    """Create every DP, BP, DAP and model-parallel group (all ranks must call this, with the same
    ``config``; with ``check`` a differing config raises a clear error on every rank).

    ``subset``: the groups of a job on world ranks ``0 .. config.world_size - 1`` only (e.g. a
    benchmark timing a 2-rank layout on an 8-rank world); the other ranks still call this (group
    creation is collective over the world) and get ``None``."""
    world = dist.get_world_size()
    if check:
        check_consistent({"parallel_config": config, "world_size": world}, what="parallel config")
    if config.world_size != world and not (subset and config.world_size < world):
        raise ValueError(
            f"dp x bp x dap = {config.dp} x {config.bp} x {config.dap} = {config.world_size} "
            f"but the world has {world} ranks"
        )
    rank = dist.get_rank()
    c = config
    mine: dict[str, dist.ProcessGroup] = {}
    # Every rank creates every group in the same order (new_group is collective).
    for d in range(c.dp):
        for b in range(c.bp):
            _add(mine, "dap", [c.rank_of(d, b, a) for a in range(c.dap)], rank)
    for d in range(c.dp):
        for a in range(c.dap):
            _add(mine, "bp", [c.rank_of(d, b, a) for b in range(c.bp)], rank)
    for b in range(c.bp):
        for a in range(c.dap):
            _add(mine, "dp", [c.rank_of(d, b, a) for d in range(c.dp)], rank)
    for d in range(c.dp):
        ranks = [c.rank_of(d, b, a) for b in range(c.bp) for a in range(c.dap)]
        _add(mine, "model", ranks, rank)
    world_group = dist.group.WORLD
    if c.world_size < world:  # the job's "world": its first ranks
        world_group = dist.new_group(list(range(c.world_size)))
    if rank >= c.world_size:
        return None
    dp_index, bp_index, dap_index = c.coords(rank)
    return ParallelGroups(
        config=c,
        rank=rank,
        dp_index=dp_index,
        bp_index=bp_index,
        dap_index=dap_index,
        dap_group=mine["dap"],
        bp_group=mine["bp"],
        dp_group=mine["dp"],
        model_group=mine["model"],
        world_group=world_group,
    )


def _add(mine: dict[str, dist.ProcessGroup], kind: str, ranks: list[int], rank: int) -> None:
    group = dist.new_group(ranks)
    if rank in ranks:
        mine[kind] = group


def seed_ranks(groups: ParallelGroups, base_seed: int) -> None:
    """Seed the RNGs so that the ranks of one sample (its BP x DAP ranks) draw the same numbers
    (DAP needs equal dropout masks along a split axis) and different samples differ."""
    seed = base_seed + 1_000_003 * groups.dp_index
    torch.manual_seed(seed)
