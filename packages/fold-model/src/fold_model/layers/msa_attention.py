"""MSA attention (AF2 supplement 1.6.1-1.6.2, Alg. 7, 8 and 19): row attention with a bias from
the pair, column attention, and the global column attention of the extra MSA stack.

Row attention takes the MSA in row layout ``[*, N_seq/P, N_res, C_m]``; the column attentions in
column layout ``[*, N_seq, N_res/P, C_m]`` (the axial seam, :mod:`fold_model.seams`).
"""

from __future__ import annotations

import torch
from torch import nn

from fold_model.layers.primitives import (
    Attention,
    GlobalAttention,
    LayerNorm,
    Linear,
    fork_pair_bias,
)
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["MSARowAttentionWithPairBias", "MSAColumnAttention", "MSAColumnGlobalAttention"]


class MSARowAttentionWithPairBias(nn.Module):
    """Alg. 7. ``m: [*, N_seq/P, N_res, C_m]`` (row layout), ``z: [*, N_res/P, N_res, C_z]``
    (row layout), ``msa_mask: [*, N_seq/P, N_res]`` -> update ``[*, N_seq/P, N_res, C_m]``."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_z = Linear(c_z, no_heads, bias=False, init="default")
        self.mha = Attention(c_m, c_m, c_hidden, no_heads)

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        return self.forward_residual(m, z, msa_mask, comm, chunk_size)[0]

    def forward_residual(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(update, m, z)``: the update, and m and z passed on for what reads them next (the
        residual sum, the pair stack), both LayerNorms forked (``LayerNorm.fork``)."""
        # bias [*, H, N_res, N_res]
        z, bias = fork_pair_bias(self.layer_norm_z, z, self.linear_z, comm, 0)
        m, m_ln = self.layer_norm_m.fork(m)
        return self.mha(m_ln, m_ln, msa_mask, bias, chunk_size), m, z


class MSAColumnAttention(nn.Module):
    """Alg. 8. ``m: [*, N_seq, N_res/P, C_m]`` (column layout), ``msa_mask: [*, N_seq, N_res/P]``
    -> update ``[*, N_seq, N_res/P, C_m]``; attention runs over N_seq for each residue."""

    def __init__(self, c_m: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.mha = Attention(c_m, c_m, c_hidden, no_heads)

    def forward(
        self, m: torch.Tensor, msa_mask: torch.Tensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        return self.forward_residual(m, msa_mask, chunk_size)[0]

    def forward_residual(
        self, m: torch.Tensor, msa_mask: torch.Tensor, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, m)``: the update and m passed on for the residual sum (LayerNorm forked)."""
        m, m_ln = self.layer_norm_m.fork(m.transpose(-2, -3))  # [*, N_res/P, N_seq, C_m]
        mask = msa_mask.transpose(-1, -2)  # [*, N_res/P, N_seq]
        out = self.mha(m_ln, m_ln, mask, None, chunk_size)
        return out.transpose(-2, -3), m.transpose(-2, -3)


class MSAColumnGlobalAttention(nn.Module):
    """Alg. 19 along MSA columns (extra MSA stack). Shapes as :class:`MSAColumnAttention`."""

    def __init__(self, c_m: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.global_attention = GlobalAttention(c_m, c_hidden, no_heads)

    def forward(
        self, m: torch.Tensor, msa_mask: torch.Tensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        return self.forward_residual(m, msa_mask, chunk_size)[0]

    def forward_residual(
        self, m: torch.Tensor, msa_mask: torch.Tensor, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, m)``: the update and m passed on for the residual sum (LayerNorm forked)."""
        m, m_ln = self.layer_norm_m.fork(m.transpose(-2, -3))  # [*, N_res/P, N_seq, C_m]
        mask = msa_mask.transpose(-1, -2)  # [*, N_res/P, N_seq]
        out = self.global_attention(m_ln, mask, chunk_size)
        return out.transpose(-2, -3), m.transpose(-2, -3)
