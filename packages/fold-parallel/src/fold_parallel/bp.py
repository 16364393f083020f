"""Branch Parallelism (Parallel Evoformer paper section 4.2; HelixFold).

In a Parallel Evoformer block the MSA branch (row attention, column attention, transition, then
the outer product mean of the new MSA) and the pair branch (triangle updates, triangle attention,
transition) read only the block's inputs. Under BP with two ranks, BP rank 0 computes the MSA
branch and the outer product update ``dz``, BP rank 1 the pair branch ``z'``; the new pair
``z' + dz`` is formed on both ranks by summing the two contributions over the BP group (in forward
this is each rank broadcasting its branch's pair result to the other; in backward it is the
all-reduce of the pair gradient, since both ranks read the pair). Rank 1 never needs the MSA, so
the MSA is broadcast from rank 0 only after the stack's last block (and its gradient is summed
onto rank 0 in backward). Parameter gradients are then averaged over all ranks
(:mod:`fold_parallel.ddp`; a parameter a rank did not use counts as zero).

Dropout: each branch draws from its own RNG stream seeded from one number that both BP ranks draw
identically per block call, so the ranks' RNGs stay in step (required by DAP inside BP and by the
replicated model outside the stack). :func:`enable_bp` composes with :func:`fold_parallel.dap.
enable_dap` (DAP inside each branch).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from fold_model.af2.evoformer import EvoformerStack, ExtraMsaStack, ParallelEvoformerBlock
from torch import nn

from fold_parallel import comm as C

__all__ = ["MSA_RANK", "PAIR_RANK", "bp_block_forward", "enable_bp", "BpHandle"]

MSA_RANK, PAIR_RANK = 0, 1


@contextmanager
def _branch_rng(seed: int, device: torch.device) -> Iterator[None]:
    """A private RNG stream for one branch (restores the caller's RNG state afterwards)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        yield


def bp_block_forward(
    block: ParallelEvoformerBlock,
    m: torch.Tensor,
    z: torch.Tensor,
    msa_mask: torch.Tensor,
    pair_mask: torch.Tensor,
    coll: C.Collectives,
    broadcast_msa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Parallel Evoformer block under BP; same inputs/outputs as ``block.forward``
    (``m: [*, N_seq/P, N_res, C_m]``, ``z: [*, N_res/P, N_res, C_z]`` under DAP). The returned
    MSA is valid on the MSA rank only, unless ``broadcast_msa``."""
    rng = None
    if block.training and (block.msa_dropout > 0 or block.pair_dropout > 0):
        # One draw on every rank keeps the global RNGs in step; the branches get distinct streams.
        rng = int(torch.randint(0, 2**62, (1,)).item())
    if coll.rank == MSA_RANK:
        with _branch_rng(rng, m.device) if rng is not None else nullcontext():
            m = block.msa_branch(m, z, msa_mask)
            part = block.outer_product_update(m, msa_mask)  # dz [*, N_res/P, N_res, C_z]
    else:
        with _branch_rng(rng + 1, z.device) if rng is not None else nullcontext():
            part = block.pair_branch(z, pair_mask)  # z' [*, N_res/P, N_res, C_z]
    z = C.all_reduce(part, coll)  # z' + dz on both ranks (join)
    if broadcast_msa:
        m = C.broadcast(m, MSA_RANK, coll)
    return m, z


class BpHandle:
    """What :func:`enable_bp` installed; :meth:`remove` restores the blocks' own forward."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        self._blocks = blocks

    def remove(self) -> None:
        for block in self._blocks:
            del block.forward  # the instance attribute; the class forward is back


def enable_bp(stack: nn.Module, coll: C.Collectives) -> BpHandle:
    """Run every block of ``stack`` (an ``EvoformerStack`` or ``ExtraMsaStack`` built with
    ``order="parallel"``) under BP over ``coll``'s group (two ranks). The stack's call signature,
    parameters and checkpointing are unchanged."""
    if coll.size != 2:
        raise ValueError(f"BP needs a group of 2 ranks (MSA branch, pair branch), got {coll.size}")
    if not isinstance(stack, (EvoformerStack, ExtraMsaStack)):
        raise TypeError(f"enable_bp expects an Evoformer or extra MSA stack, got {type(stack)}")
    blocks = list(stack.blocks)
    bad = [i for i, b in enumerate(blocks) if not isinstance(b, ParallelEvoformerBlock)]
    if bad:
        raise TypeError(
            f"BP needs Parallel Evoformer blocks (order='parallel'); blocks {bad} of the "
            f"{type(stack).__name__} are {type(blocks[bad[0]]).__name__}"
        )
    # Only the Evoformer stack returns its MSA, so only it needs the MSA on both ranks.
    last_needs_msa = isinstance(stack, EvoformerStack)
    for i, block in enumerate(blocks):
        bcast = last_needs_msa and i == len(blocks) - 1

        def forward(self, m, z, msa_mask, pair_mask, _bcast=bcast):
            return bp_block_forward(self, m, z, msa_mask, pair_mask, coll, _bcast)

        block.forward = types.MethodType(forward, block)
    return BpHandle(blocks)
