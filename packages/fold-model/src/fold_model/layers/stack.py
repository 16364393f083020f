"""The one stack runner: every stack of both families (Evoformer, extra MSA, AF2 template pair
stack, Pairformer, AF3 MSA module and template embedder) is a :class:`BlockStack`.

It owns what a stack adds around its blocks: the inference chunk size handed to every block
(``set_chunk_size``), the DAP comm of the axial seam (``set_comm``; :mod:`fold_model.seams`), the
scatter of the whole inputs into row-layout shards before the first block and the gather after the
last, and activation checkpointing per block. fold-parallel's ``enable_dap`` and fold-chunk's
chunking call these hooks and need nothing else of a stack.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["BlockStack"]


class BlockStack(nn.Module):
    """Base of every stack: a subclass builds ``self.blocks`` (an ``nn.ModuleList``; its parameter
    names are the stack's, so checkpoints and imported weights keep their keys) and calls
    :meth:`run` in its ``forward``.

    A block is called as ``block(*state, *masks)`` and returns the new state (a tensor when the
    state is one tensor); it has ``comm`` and ``set_chunk_size``.
    """

    blocks: nn.ModuleList

    def __init__(self, comm: AxialComm = IDENTITY_COMM, checkpoint_blocks: bool = False) -> None:
        super().__init__()
        self.comm = comm
        # Whole-block activation checkpointing while training; the last `uncheckpointed_blocks`
        # keep their activations (where memory allows, fewer blocks pay the recompute; every
        # block's activations are the same size, so which ones is free to choose).
        self.checkpoint_blocks = checkpoint_blocks
        self.uncheckpointed_blocks = 0

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Inference-time chunking of every block's attention, transitions and updates."""
        for block in self.blocks:
            block.set_chunk_size(chunk_size)

    def set_comm(self, comm: AxialComm) -> None:
        """The axial comm of the stack and of every block (DAP when distributed)."""
        self.comm = comm
        for block in self.blocks:
            block.comm = comm

    def run(
        self,
        state: tuple[torch.Tensor, ...],
        masks: tuple[torch.Tensor, ...],
        split: tuple[bool, ...],
        gather: tuple[bool, ...] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Apply the blocks in turn to ``state``; ``masks`` go to every block whole.

        The state tensors marked in ``split`` arrive whole and are scattered over dim -3 (row
        layout: ``[*, N/P, N, C]``); those marked in ``gather`` (default: ``split``) are gathered
        whole after the last block, the others come back as they are (a shard if split).
        Checkpointed blocks replay their dropout masks identically (checkpoint restores the RNG
        state).
        """
        comm = self.comm
        gather = split if gather is None else gather
        state = tuple(comm.scatter(x, -3) if s else x for x, s in zip(state, split, strict=True))
        use_ckpt = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        first_plain = len(self.blocks) - max(0, self.uncheckpointed_blocks)
        for i, block in enumerate(self.blocks):
            if use_ckpt and i < first_plain:
                out = checkpoint(block, *state, *masks, use_reentrant=False)
            else:
                out = block(*state, *masks)
            state = out if isinstance(out, tuple) else (out,)
        return tuple(comm.gather(x, -3) if g else x for x, g in zip(state, gather, strict=True))
