"""Triangle attention (AF2 supplement 1.6.6, Alg. 13-14; AF3 Alg. 14-15): attention over the
edges that share a node, with a bias from the third edge of each triangle.

The attention itself is the registry op ``triangle_attention`` (:mod:`fold_model.ops`), whose
reference hands the call to ``attention_packed``: a kernel written for triangle attention alone
is one registration of that op.
"""

from __future__ import annotations

import torch
from torch import nn

from fold_model import ops
from fold_model.layers.primitives import Attention, LayerNorm, Linear, fork_pair_bias
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["TriangleAttention", "TriangleAttentionStartingNode", "TriangleAttentionEndingNode"]


class TriangleAttention(nn.Module):
    """Alg. 13 (around the starting node: attention along j for each row i, bias ``b_jk``) and
    Alg. 14 (ending node: along i for each column j, bias ``b_ki``; computed as Alg. 13 on the
    transposed pair). Starting takes the row layout, ending the column layout; mask likewise.
    """

    def __init__(self, c_z: int, c_hidden: int, no_heads: int, starting: bool) -> None:
        super().__init__()
        self.starting = starting
        self.layer_norm = LayerNorm(c_z)
        self.linear_bias = Linear(c_z, no_heads, bias=False, init="default")
        self.mha = Attention(c_z, c_z, c_hidden, no_heads, packed_op=ops.triangle_attention)

    def forward(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        return self.forward_residual(z, pair_mask, comm, chunk_size)[0]

    def forward_residual(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
        out_bias: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, z)``: the update and z passed on for the residual sum. The normalised z
        is read by the bias projection and by q, k, v and the gate (``LayerNorm.fork``): in
        backward their gradients and the residual's meet in LayerNorm's one pass.
        ``out_bias=False``: the update without the output projection's bias
        (:attr:`out_bias`), which the residual op then adds (and sums the gradient of): the GEMM
        with cuBLASLt's bias epilogue took 17.8 us against 9.4 us without at N_res 256, 67 vs
        41 us at 512 (H200, ``[N^2, 128] x [128, 128]``)."""
        if not self.starting:
            z = z.transpose(-2, -3)  # [*, N_j/P, N_i, C_z]
            pair_mask = pair_mask.transpose(-1, -2)
        # bias [*, H, N, N]
        z, z_att, bias = fork_pair_bias(self.layer_norm, z, self.linear_bias, comm)
        out = self.mha(z_att, z_att, pair_mask, bias, chunk_size, out_bias)
        if self.starting:
            return out, z
        return out.transpose(-2, -3), z.transpose(-2, -3)

    @property
    def out_bias(self) -> torch.Tensor:
        """The output projection's bias ``[C_z]``."""
        return self.mha.linear_o.bias


class TriangleAttentionStartingNode(TriangleAttention):
    """Alg. 13."""

    def __init__(self, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__(c_z, c_hidden, no_heads, starting=True)


class TriangleAttentionEndingNode(TriangleAttention):
    """Alg. 14."""

    def __init__(self, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__(c_z, c_hidden, no_heads, starting=False)
