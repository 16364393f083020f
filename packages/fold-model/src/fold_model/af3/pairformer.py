"""The Pairformer stack (AF3 supplement 3.6, Alg. 17) and the pair updates it shares with the MSA
module and the template embedder.

Triangle multiplication and triangle attention are the shared layers (:mod:`fold_model.layers`:
the same algorithms as AF2's; AF3 drops some linear biases, which start at the AF2 inits here);
the transitions are AF3's SwiGLU (:class:`~fold_model.layers.SwiGLUTransition`); the single
representation is updated by attention with pair bias.

Layouts follow the axial seam (:mod:`fold_model.seams`): blocks take the pair in row layout
``[*, N/P, N, C_z]`` (whole on one device) and whole masks; the single representation
``[*, N, C_s]`` is replicated. Each sub-layer can run under activation checkpointing (MegaFold
appendix C: recompute per sub-layer instead of per block); blocks take tensors only and have no
data-dependent control flow, so torch.fx traces them (chunking and checkpointing off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from fold_ops.weight_casts import grouped
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model.af3.conditioning import AttentionPairBias
from fold_model.layers import (
    BlockStack,
    SwiGLUTransition,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    dropout_residual,
    pair_stack,
)
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["SubLayers", "PairUpdates", "PairformerBlock", "PairformerStack"]


class SubLayers(nn.Module):
    """What every AF3 trunk block shares: the DAP comm, the chunk size, per-sub-layer activation
    checkpointing and the residual with AF2's shared dropout."""

    def __init__(self, comm: AxialComm = IDENTITY_COMM, use_checkpoint: bool = False,
                 checkpoint_blocks: bool = False) -> None:
        super().__init__()
        self.comm = comm
        self.use_checkpoint = use_checkpoint
        # With use_checkpoint: recompute the whole block (one saved input per block) instead of
        # each sub-layer (one saved pair per sub-layer: 5 per Pairformer block, the largest
        # term of a training step's memory at long crops). Same recompute, 5x fewer saved pairs;
        # the recompute of one block holds that block's activations.
        self.checkpoint_blocks = checkpoint_blocks
        self.chunk_size: int | None = None

    def set_chunk_size(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size

    def _recompute(self) -> bool:
        return self.use_checkpoint and self.training and torch.is_grad_enabled()

    def _run(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(*args)`` (a sub-layer), recomputed in backward when per-sub-layer checkpointing
        is on while training."""
        if self._recompute() and not self.checkpoint_blocks:
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _block(self, fn: Callable, *args):
        """``fn(*args)`` (a whole block), recomputed in backward when block checkpointing is on
        while training."""
        if self._recompute() and self.checkpoint_blocks:
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _residual(
        self, update: torch.Tensor, x: torch.Tensor, rate: float, shared_dim: int
    ) -> torch.Tensor:
        return dropout_residual(update, x, rate, shared_dim, self.training)


class PairUpdates(SubLayers):
    """Alg. 17 lines 1-5 (also the pair half of the MSA module's and template embedder's blocks):
    triangle multiplication outgoing / incoming, triangle attention starting / ending node,
    SwiGLU pair transition. ``z: [*, N/P, N, C_z]`` row layout in and out."""

    def __init__(
        self,
        c_z: int,
        c_hidden_mul: int,
        c_hidden_tri_att: int,
        no_heads_tri_att: int,
        transition_n: int,
        dropout: float,
        comm: AxialComm = IDENTITY_COMM,
        use_checkpoint: bool = False,
    ) -> None:
        super().__init__(comm, use_checkpoint)
        self.pair_dropout = dropout
        self.tri_mul_out = TriangleMultiplicationOutgoing(c_z, c_hidden_mul)
        self.tri_mul_in = TriangleMultiplicationIncoming(c_z, c_hidden_mul)
        self.tri_att_start = TriangleAttentionStartingNode(c_z, c_hidden_tri_att, no_heads_tri_att)
        self.tri_att_end = TriangleAttentionEndingNode(c_z, c_hidden_tri_att, no_heads_tri_att)
        self.pair_transition = SwiGLUTransition(c_z, transition_n)

    def pair_stack(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """``z [*, N/P, N, C_z]`` (row) -> same layout; ``pair_mask [*, N, N]`` whole."""
        return pair_stack(self, z, pair_mask, self.comm, self.chunk_size, self.pair_dropout,
                          self._run)

    @grouped
    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        return self._block(self.pair_stack, z, pair_mask)


class PairformerBlock(PairUpdates):
    """One Pairformer block (Alg. 17): the pair updates, then the single representation attends
    over tokens with a bias from the new pair (16 heads) and passes a SwiGLU transition.

    ``forward(s [*, N, C_s], z [*, N/P, N, C_z], single_mask [*, N], pair_mask [*, N, N])
    -> (s, z)``.
    """

    def __init__(
        self,
        c_s: int,
        c_z: int,
        c_hidden_mul: int,
        c_hidden_tri_att: int,
        no_heads_tri_att: int,
        no_heads_single: int,
        transition_n: int,
        dropout: float,
        comm: AxialComm = IDENTITY_COMM,
        use_checkpoint: bool = False,
    ) -> None:
        super().__init__(
            c_z, c_hidden_mul, c_hidden_tri_att, no_heads_tri_att, transition_n, dropout, comm,
            use_checkpoint,
        )
        self.single_attention = AttentionPairBias(c_s, c_z, no_heads_single)
        self.single_transition = SwiGLUTransition(c_s, transition_n)

    def _single_attention(
        self, s: torch.Tensor, z: torch.Tensor, single_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(update of s, s, z)``: s and z passed on, both LayerNorms forked so that the
        gradients of the residual's s and of the block's output z join their backward passes."""
        bias, z = self.single_attention.bias_from_pair_residual(
            z, self.comm, self.chunk_size)  # [*, H, N, N]
        s_rows = s.unsqueeze(-3)  # [*, 1, N, C_s]: one row shares the bias
        out, s_rows = self.single_attention.forward_residual(s_rows, bias,
                                                             single_mask.unsqueeze(-2))
        return out.squeeze(-3), s_rows.squeeze(-3), z  # [*, N, C_s] each

    @grouped
    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        single_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._block(self._forward, s, z, single_mask, pair_mask)

    def _forward(self, s, z, single_mask, pair_mask):
        z = self.pair_stack(z, pair_mask)
        update, s, z = self._run(self._single_attention, s, z, single_mask)
        s = s + update
        del update  # not held while the transition runs
        # s is this block's own (the sum above): in inference the transition adds into it
        return self.single_transition.residual(s, self.chunk_size, -2, run=self._run), z


class PairformerStack(BlockStack):
    """Alg. 17 repeated ``no_blocks`` times. ``forward(s [*, N, C_s], z [*, N, N, C_z],
    single_mask [*, N], pair_mask [*, N, N]) -> (s, z)``; whole tensors in and out (under DAP the
    pair is scattered over i on the way in and gathered on the way out; s is replicated)."""

    def __init__(
        self,
        cfg,
        c_s: int,
        c_z: int,
        comm: AxialComm = IDENTITY_COMM,
        use_checkpoint: bool = False,
    ) -> None:
        super().__init__(comm)  # checkpointing is the blocks' own (per sub-layer or per block)
        self.blocks = nn.ModuleList(
            PairformerBlock(
                c_s, c_z, cfg.c_hidden_mul, cfg.c_hidden_tri_att, cfg.no_heads_tri_att,
                cfg.no_heads_single, cfg.transition_n, cfg.dropout, comm, use_checkpoint,
            )
            for _ in range(cfg.no_blocks)
        )

    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        single_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s, z = self.run((s, z), (single_mask, pair_mask), split=(False, True))
        return s, z
