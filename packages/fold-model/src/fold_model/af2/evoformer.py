"""The Evoformer (AF2 supplement 1.6, Alg. 6-15), the extra MSA stack (Alg. 18-19) and the
three block orders.

Block orders (``order``):

* ``"af2"``: MSA stack, outer product mean, pair stack (Alg. 6);
* ``"multimer"``: outer product mean first (AlphaFold-Multimer, Evans et al. 2021);
* ``"parallel"``: outer product mean at the end, so the MSA and pair branches of a block are
  independent (Parallel Evoformer, Wang et al. 2022); :class:`ParallelEvoformerBlock` exposes
  the branches for Branch Parallelism.

Every sub-layer returns its *update*; the block adds it through ``ops.bias_dropout_residual``
with AF2's shared dropout. Sub-layers and blocks work on DAP shards through
:class:`fold_model.seams.AxialComm` (see that module for the row/column layouts); on one device
the seam calls are the identity. Blocks take masks whole and tensors only, so torch.fx traces them
(chunking off); chunking (``set_chunk_size``) is an inference-time memory saving.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model import ops
from fold_model.primitives import (
    Attention,
    GlobalAttention,
    LayerNorm,
    Linear,
    chunked_rows,
    shared_dropout_mask,
)
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = [
    "MSARowAttentionWithPairBias",
    "MSAColumnAttention",
    "MSAColumnGlobalAttention",
    "Transition",
    "MSATransition",
    "PairTransition",
    "OuterProductMean",
    "TriangleMultiplication",
    "TriangleMultiplicationOutgoing",
    "TriangleMultiplicationIncoming",
    "TriangleAttention",
    "TriangleAttentionStartingNode",
    "TriangleAttentionEndingNode",
    "EvoformerBlock",
    "ParallelEvoformerBlock",
    "ExtraMsaBlock",
    "ParallelExtraMsaBlock",
    "make_block",
    "EvoformerStack",
    "ExtraMsaStack",
    "run_blocks",
]


def _pair_bias(
    z_ln: torch.Tensor, linear: Linear, comm: AxialComm
) -> torch.Tensor:
    """Per-head bias from the (normalized) row-split pair: ``[*, N_i/P, N_j, C_z]`` ->
    ``[*, H, N_i, N_j]`` (gathered: the bias of every query row needs all of i)."""
    bias = linear(z_ln)  # [*, N_i/P, N_j, H]
    bias = comm.gather(bias, -3)  # [*, N_i, N_j, H]
    return bias.movedim(-1, -3)  # [*, H, N_i, N_j]


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
        bias = _pair_bias(self.layer_norm_z(z), self.linear_z, comm)  # [*, H, N_res, N_res]
        m = self.layer_norm_m(m)
        return self.mha(m, m, msa_mask, bias, chunk_size)


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
        m = self.layer_norm_m(m.transpose(-2, -3))  # [*, N_res/P, N_seq, C_m]
        mask = msa_mask.transpose(-1, -2)  # [*, N_res/P, N_seq]
        return self.mha(m, m, mask, None, chunk_size).transpose(-2, -3)


class MSAColumnGlobalAttention(nn.Module):
    """Alg. 19 along MSA columns (extra MSA stack). Shapes as :class:`MSAColumnAttention`."""

    def __init__(self, c_m: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.global_attention = GlobalAttention(c_m, c_hidden, no_heads)

    def forward(
        self, m: torch.Tensor, msa_mask: torch.Tensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        m = self.layer_norm_m(m.transpose(-2, -3))  # [*, N_res/P, N_seq, C_m]
        mask = msa_mask.transpose(-1, -2)  # [*, N_res/P, N_seq]
        return self.global_attention(m, mask, chunk_size).transpose(-2, -3)


class Transition(nn.Module):
    """Alg. 9 / 15: ``Linear(relu(Linear(LayerNorm(x))))`` with an ``n``-fold hidden width.
    ``x: [*, C] -> [*, C]``; LayerNorm + first Linear go through ``ops.layer_norm_linear``."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c)
        self.linear_1 = Linear(c, n * c, init="relu")
        self.linear_2 = Linear(n * c, c, init="final")

    def _transition(self, x: torch.Tensor) -> torch.Tensor:
        h = ops.layer_norm_linear(
            x, self.layer_norm.weight, self.layer_norm.bias, self.linear_1.weight,
            self.linear_1.bias, self.layer_norm.eps,
        )
        return self.linear_2(torch.relu(h))

    def forward(self, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        return chunked_rows(self._transition, chunk_size, ((x, -3),), out_dim=-3)


class MSATransition(Transition):
    """Alg. 9 (n = 4)."""


class PairTransition(Transition):
    """Alg. 15 (n = 4 in the Evoformer, 2 in the template pair stack)."""


class OuterProductMean(nn.Module):
    """Alg. 10: ``z_ij += Linear(mean_s a_si (x) b_sj)`` with masked mean.

    ``layout="col"``: ``m: [*, N_seq, N_res/P, C_m]`` (after column attention); the right
    projection is gathered over N_res (:meth:`AxialComm.all_gather_for_outer_product`).
    ``layout="row"``: ``m: [*, N_seq/P, N_res, C_m]`` (block start / end); each rank sums its
    sequences and the partial sums are reduce-scattered over i. Both return the row-layout pair
    update ``[*, N_res/P, N_res, C_z]``. With ``chunk_size`` the output rows i are computed in
    slices.

    ``divide_bias``: ``(W o + b) / (eps + n)`` as AF2's code (and so its released weights; the
    AF2 blocks switch it on from ``EvoformerConfig.opm_divide_bias``); off (the default here,
    which AF3's MSA module keeps): ``W o / (eps + n) + b``, the supplement's ``Linear(mean)``.
    """

    def __init__(
        self, c_m: int, c_z: int, c_hidden: int, eps: float = 1e-3, divide_bias: bool = False
    ) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.eps = eps
        self.divide_bias = divide_bias
        self.layer_norm = LayerNorm(c_m)
        self.linear_1 = Linear(c_m, c_hidden)
        self.linear_2 = Linear(c_m, c_hidden)
        self.linear_out = Linear(c_hidden * c_hidden, c_z, init="final")

    def _projections(
        self, m: torch.Tensor, msa_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.layer_norm(m)
        mask = msa_mask.unsqueeze(-1).to(m.dtype)  # [*, N_seq, N_res, 1]
        a, b = self.linear_1(m), self.linear_2(m)
        # the 0/1 mask in the projections' dtype (bf16 under autocast): a and b are not promoted
        # to fp32 only to be cast back by the einsum (and their gradients likewise)
        mask_ab = mask.to(a.dtype)
        return a * mask_ab, b * mask_ab, mask

    @staticmethod
    def _outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # [*, S, I, c], [*, S, J, d] -> sum_s a_sic b_sjd: [*, I, J, c * d]
        return torch.einsum("...sic,...sjd->...ijcd", a, b).flatten(-2)

    def forward(
        self,
        m: torch.Tensor,
        msa_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
        layout: Literal["row", "col"] = "col",
    ) -> torch.Tensor:
        a, b, mask = self._projections(m, msa_mask)
        if layout == "col":
            b = comm.all_gather_for_outer_product(b)  # [*, N_seq, N_res, c]
            mask_b = comm.all_gather_for_outer_product(mask)  # [*, N_seq, N_res, 1]

            def project_then_mean(a_i: torch.Tensor, mask_i: torch.Tensor) -> torch.Tensor:
                norm = self._outer_sum(mask_i, mask_b)  # [*, I, N_res, 1]
                # the division acts on the [*, I, J, C_z] projection instead of the
                # [*, I, J, c * c] outer sum (8x fewer elements at c = 32, C_z = 128)
                proj = nn.functional.linear(self._outer_sum(a_i, b), self.linear_out.weight)
                return self._mean(proj, norm)

            return chunked_rows(project_then_mean, chunk_size, ((a, -2), (mask, -2)), out_dim=-3)
        if layout != "row":
            raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")

        # Row layout: the linear map commutes with the sum over sequences, so each rank projects
        # its partial sum (no bias) and the partial sums are added by reduce_scatter.
        def partial(a_i: torch.Tensor, mask_i: torch.Tensor) -> torch.Tensor:
            proj = nn.functional.linear(self._outer_sum(a_i, b), self.linear_out.weight)
            return torch.cat([proj, self._outer_sum(mask_i, mask)], dim=-1)  # [*, I, J, C_z+1]

        out = chunked_rows(partial, chunk_size, ((a, -2), (mask, -2)), out_dim=-3)
        out = comm.reduce_scatter(out, -3)  # [*, N_res/P, N_res, C_z + 1]
        proj, norm = out[..., :-1], out[..., -1:]
        return self._mean(proj, norm)

    def _mean(self, proj: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        bias = self.linear_out.bias
        if self.divide_bias:  # AF2 code: the bias is divided by the pair count too
            return (proj + bias) / (self.eps + norm)
        return proj / (self.eps + norm) + bias


class TriangleMultiplication(nn.Module):
    """Alg. 11 (outgoing, ``z_ij = sum_k a_ik b_jk``) and Alg. 12 (incoming, ``sum_k a_ki b_kj``).

    Outgoing takes the row-layout pair ``[*, N_i/P, N_j, C_z]``, incoming the column layout
    ``[*, N_i, N_j/P, C_z]``; ``pair_mask`` is in the same layout as z. The projections a and b
    are computed channel-first, ``[*, c, rows, cols]`` (``W z^T``: the GEMM writes the transposed
    layout), so the sum over k is one batched matrix product per channel with no layout copies
    (``einsum`` over channel-last operands copies a, b and the product to channel-first and back,
    about 0.15 TB/s on an H100), in either direction and without transposing z. Under DAP the
    operand whose rows or columns are split is all-gathered
    (:meth:`AxialComm.all_gather_for_triangle`). With ``chunk_size`` output rows are computed
    in slices.
    """

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool) -> None:
        super().__init__()
        self.outgoing = outgoing
        self.layer_norm_in = LayerNorm(c_z)
        self.linear_a_p = Linear(c_z, c_hidden)
        self.linear_a_g = Linear(c_z, c_hidden, init="gating")
        self.linear_b_p = Linear(c_z, c_hidden)
        self.linear_b_g = Linear(c_z, c_hidden, init="gating")
        self.linear_g = Linear(c_z, c_z, init="gating")
        self.layer_norm_out = LayerNorm(c_hidden)
        self.linear_z = Linear(c_hidden, c_z, init="final")

    def _gated_projections(
        self, z_ln: torch.Tensor, pair_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``a = (z W_ap + b_ap) * sigmoid(z W_ag + b_ag) * mask`` and likewise b, channel-first
        ``[*, c, rows, cols]`` from ``z_ln [*, rows, cols, C_z]``: one GEMM for all four
        projections, then one fused gate (``ops.triangle_projection_gate``)."""
        layers = (self.linear_a_p, self.linear_a_g, self.linear_b_p, self.linear_b_g)
        weight = torch.cat([lin.weight for lin in layers])  # [4c, C_z]
        bias = torch.cat([lin.bias for lin in layers])  # [4c]
        # one GEMM over the merged (rows, cols) dims writing the transposed layout. The torch
        # reference is an einsum (rows stay a dim of its own: AutoChunk follows it through; under
        # autocast it runs in the autocast dtype), whose backward returns d(z_ln) channel-first:
        # adding that to linear_g's contiguous d(z_ln) is a slow strided add. The fold-kernels
        # backend returns d(z_ln) channel-last.
        proj = ops.linear_channel_first(z_ln, weight)  # [*, 4c, rows, cols]
        return ops.triangle_projection_gate(proj, bias, pair_mask)

    def forward(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        z_ln = self.layer_norm_in(z)
        a, b = self._gated_projections(z_ln, pair_mask)  # [*, c, rows, cols]
        if self.outgoing:  # rows of i are local; x_ij = sum_k a_ik b_jk needs every row j of b
            b = comm.all_gather_for_triangle(b, -2)  # [*, c, N_j, N_k]
            left = (a, -2)  # output rows i are rows of a
        else:  # columns of j are local; x_ij = sum_k a_ki b_kj needs every column i of a
            a = comm.all_gather_for_triangle(a, -1)  # [*, c, N_k, N_i]
            left = (a, -1)  # output rows i are columns of a

        def product(a_i: torch.Tensor, z_ln_i: torch.Tensor) -> torch.Tensor:
            x = a_i @ b.mT if self.outgoing else a_i.mT @ b  # [*, c, I, J]
            # LayerNorm reads the channel-first product through its strides: no copy
            x = self.linear_z(self.layer_norm_out(x.movedim(-3, -1)))  # [*, I, J, C_z]
            return ops.bias_sigmoid_gate(x, self.linear_g(z_ln_i))

        return chunked_rows(product, chunk_size, (left, (z_ln, -3)), out_dim=-3)


class TriangleMultiplicationOutgoing(TriangleMultiplication):
    """Alg. 11."""

    def __init__(self, c_z: int, c_hidden: int) -> None:
        super().__init__(c_z, c_hidden, outgoing=True)


class TriangleMultiplicationIncoming(TriangleMultiplication):
    """Alg. 12."""

    def __init__(self, c_z: int, c_hidden: int) -> None:
        super().__init__(c_z, c_hidden, outgoing=False)


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
        self.mha = Attention(c_z, c_z, c_hidden, no_heads)

    def forward(
        self,
        z: torch.Tensor,
        pair_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        if not self.starting:
            z = z.transpose(-2, -3)  # [*, N_j/P, N_i, C_z]
            pair_mask = pair_mask.transpose(-1, -2)
        z = self.layer_norm(z)
        bias = _pair_bias(z, self.linear_bias, comm)  # [*, H, N, N]
        out = self.mha(z, z, pair_mask, bias, chunk_size)
        return out if self.starting else out.transpose(-2, -3)


class TriangleAttentionStartingNode(TriangleAttention):
    """Alg. 13."""

    def __init__(self, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__(c_z, c_hidden, no_heads, starting=True)


class TriangleAttentionEndingNode(TriangleAttention):
    """Alg. 14."""

    def __init__(self, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__(c_z, c_hidden, no_heads, starting=False)


class _EvoformerLayers(nn.Module):
    """The sub-layers of one Evoformer / extra-MSA block and its two stacks.

    ``_msa_stack`` maps a row-layout MSA to the column layout (row attention, column attention,
    transition); ``_pair_stack`` keeps the pair in row layout at both ends (Alg. 6 lines 5-9).
    """

    def __init__(
        self,
        c_m: int,
        c_z: int,
        c_hidden_msa_att: int,
        no_heads_msa: int,
        c_hidden_opm: int,
        c_hidden_mul: int,
        c_hidden_pair_att: int,
        no_heads_pair: int,
        transition_n: int,
        msa_dropout: float,
        pair_dropout: float,
        global_column: bool = False,
        comm: AxialComm = IDENTITY_COMM,
        opm_divide_bias: bool = True,
    ) -> None:
        super().__init__()
        self.msa_dropout = msa_dropout
        self.pair_dropout = pair_dropout
        self.comm = comm
        self.chunk_size: int | None = None
        self.msa_att_row = MSARowAttentionWithPairBias(c_m, c_z, c_hidden_msa_att, no_heads_msa)
        if global_column:
            self.msa_att_col: nn.Module = MSAColumnGlobalAttention(
                c_m, c_hidden_msa_att, no_heads_msa
            )
        else:
            self.msa_att_col = MSAColumnAttention(c_m, c_hidden_msa_att, no_heads_msa)
        self.msa_transition = MSATransition(c_m, transition_n)
        self.outer_product_mean = OuterProductMean(
            c_m, c_z, c_hidden_opm, divide_bias=opm_divide_bias
        )
        self.tri_mul_out = TriangleMultiplicationOutgoing(c_z, c_hidden_mul)
        self.tri_mul_in = TriangleMultiplicationIncoming(c_z, c_hidden_mul)
        self.tri_att_start = TriangleAttentionStartingNode(c_z, c_hidden_pair_att, no_heads_pair)
        self.tri_att_end = TriangleAttentionEndingNode(c_z, c_hidden_pair_att, no_heads_pair)
        self.pair_transition = PairTransition(c_z, transition_n)

    def set_chunk_size(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size

    def _residual(
        self, update: torch.Tensor, x: torch.Tensor, rate: float, shared_dim: int
    ) -> torch.Tensor:
        mask = shared_dropout_mask(update, rate, shared_dim, self.training)
        return ops.bias_dropout_residual(update, x, None, mask)

    def _msa_stack(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> torch.Tensor:
        """``m [*, N_seq/P, N_res, C_m]`` (row) -> ``[*, N_seq, N_res/P, C_m]`` (column)."""
        comm, chunk = self.comm, self.chunk_size
        mask_row = comm.scatter(msa_mask, -2)  # [*, N_seq/P, N_res]
        mask_col = comm.scatter(msa_mask, -1)  # [*, N_seq, N_res/P]
        # DropoutRowwise: one mask shared by all MSA rows (dim -3).
        m = self._residual(self.msa_att_row(m, z, mask_row, comm, chunk), m, self.msa_dropout, -3)
        m = comm.row_to_col(m)  # [*, N_seq, N_res/P, C_m]
        m = m + self.msa_att_col(m, mask_col, chunk)
        return m + self.msa_transition(m, chunk)

    def _pair_stack(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """``z [*, N_res/P, N_res, C_z]`` (row) -> same layout (Alg. 6 lines 5-9)."""
        comm, chunk, p = self.comm, self.chunk_size, self.pair_dropout
        mask_row = comm.scatter(pair_mask, -2)  # [*, N_res/P, N_res]
        mask_col = comm.scatter(pair_mask, -1)  # [*, N_res, N_res/P]
        z = self._residual(self.tri_mul_out(z, mask_row, comm, chunk), z, p, -3)
        z = comm.row_to_col(z)  # [*, N_res, N_res/P, C_z]
        z = self._residual(self.tri_mul_in(z, mask_col, comm, chunk), z, p, -3)
        z = comm.col_to_row(z)  # [*, N_res/P, N_res, C_z]
        z = self._residual(self.tri_att_start(z, mask_row, comm, chunk), z, p, -3)
        z = comm.row_to_col(z)  # [*, N_res, N_res/P, C_z]
        # DropoutColumnwise: one mask shared by all columns (dim -2).
        z = self._residual(self.tri_att_end(z, mask_col, comm, chunk), z, p, -2)
        z = z + self.pair_transition(z, chunk)
        return comm.col_to_row(z)  # [*, N_res/P, N_res, C_z]


class EvoformerBlock(_EvoformerLayers):
    """One Evoformer block (Alg. 6) with ``order`` ``"af2"`` or ``"multimer"``.

    ``forward(m, z, msa_mask, pair_mask) -> (m, z)`` with ``m: [*, N_seq/P, N_res, C_m]``,
    ``z: [*, N_res/P, N_res, C_z]`` (row layout; whole on one device), whole masks
    ``msa_mask: [*, N_seq, N_res]``, ``pair_mask: [*, N_res, N_res]``.
    """

    def __init__(self, *args, order: Literal["af2", "multimer"] = "af2", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if order not in ("af2", "multimer"):
            raise ValueError(f"EvoformerBlock order must be 'af2' or 'multimer', got {order!r}")
        self.order = order

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        comm = self.comm
        if self.order == "multimer":
            mask_row = comm.scatter(msa_mask, -2)
            z = z + self.outer_product_mean(m, mask_row, comm, self.chunk_size, layout="row")
            m_col = self._msa_stack(m, z, msa_mask)
        else:
            m_col = self._msa_stack(m, z, msa_mask)
            mask_col = comm.scatter(msa_mask, -1)
            z = z + self.outer_product_mean(m_col, mask_col, comm, self.chunk_size, layout="col")
        # DAO: the MSA's way back to row layout overlaps the pair stack.
        handle = comm.col_to_row_async(m_col)
        z = self._pair_stack(z, pair_mask)
        return comm.wait(handle), z


class ParallelEvoformerBlock(_EvoformerLayers):
    """Parallel Evoformer block (Wang et al. 2022, Fig. 1c): the MSA and pair branches read only
    the block's inputs; the outer product mean of the new MSA is added to the new pair at the end.

    Branch seam (:class:`fold_model.seams.BranchSeam`): ``msa_branch``, ``pair_branch``,
    ``outer_product_update`` (computed on the MSA rank under BP) and ``join``. Shapes and layouts
    as :class:`EvoformerBlock`.
    """

    order = "parallel"

    def msa_branch(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> torch.Tensor:
        """Row attention (with the input pair's bias), column attention, transition; returns the
        row-layout MSA ``[*, N_seq/P, N_res, C_m]``."""
        return self.comm.col_to_row(self._msa_stack(m, z, msa_mask))

    def pair_branch(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """Triangle updates, triangle attention, transition on the input pair."""
        return self._pair_stack(z, pair_mask)

    def outer_product_update(self, m: torch.Tensor, msa_mask: torch.Tensor) -> torch.Tensor:
        """The pair update ``[*, N_res/P, N_res, C_z]`` from the branch's output MSA."""
        mask_row = self.comm.scatter(msa_mask, -2)
        return self.outer_product_mean(m, mask_row, self.comm, self.chunk_size, layout="row")

    def join(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        dz: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m', z' + OPM(m'))``; pass ``dz`` when it was computed elsewhere (BP)."""
        if dz is None:
            dz = self.outer_product_update(m, msa_mask)
        return m, z + dz

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m_new = self.msa_branch(m, z, msa_mask)
        z_new = self.pair_branch(z, pair_mask)
        return self.join(m_new, z_new, msa_mask)


class ExtraMsaBlock(EvoformerBlock):
    """Alg. 18: an Evoformer block over the extra MSA with global column attention (Alg. 19)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, global_column=True, **kwargs)


class ParallelExtraMsaBlock(ParallelEvoformerBlock):
    """Alg. 18 in the Parallel Evoformer order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, global_column=True, **kwargs)


def make_block(
    cfg, c_m: int, c_z: int, order: str, extra_msa: bool = False,
    comm: AxialComm = IDENTITY_COMM,
) -> _EvoformerLayers:
    """A block of ``order`` from an :class:`EvoformerConfig` or :class:`ExtraMsaConfig`."""
    sizes = dict(
        c_m=c_m, c_z=c_z, c_hidden_msa_att=cfg.c_hidden_msa_att, no_heads_msa=cfg.no_heads_msa,
        c_hidden_opm=cfg.c_hidden_opm, c_hidden_mul=cfg.c_hidden_mul,
        c_hidden_pair_att=cfg.c_hidden_pair_att, no_heads_pair=cfg.no_heads_pair,
        transition_n=cfg.transition_n, msa_dropout=cfg.msa_dropout,
        pair_dropout=cfg.pair_dropout, comm=comm, opm_divide_bias=cfg.opm_divide_bias,
    )
    if order == "parallel":
        return (ParallelExtraMsaBlock if extra_msa else ParallelEvoformerBlock)(**sizes)
    if order not in ("af2", "multimer"):
        raise ValueError(f"block order must be 'af2', 'multimer' or 'parallel', got {order!r}")
    return (ExtraMsaBlock if extra_msa else EvoformerBlock)(**sizes, order=order)


def run_blocks(
    blocks: nn.ModuleList,
    m: torch.Tensor,
    z: torch.Tensor,
    msa_mask: torch.Tensor,
    pair_mask: torch.Tensor,
    use_checkpoint: bool,
    uncheckpointed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``blocks`` in turn; each under non-reentrant activation checkpointing when asked
    (dropout masks are replayed identically: checkpoint restores the RNG state), except the
    last ``uncheckpointed`` blocks, which keep their activations: where memory allows, fewer
    blocks pay the recompute (every block's activations are the same size, so which ones is
    free to choose)."""
    first_plain = len(blocks) - max(0, uncheckpointed)
    for i, block in enumerate(blocks):
        if use_checkpoint and i < first_plain:
            m, z = checkpoint(block, m, z, msa_mask, pair_mask, use_reentrant=False)
        else:
            m, z = block(m, z, msa_mask, pair_mask)
    return m, z


class _Stack(nn.Module):
    """Shared stack logic: scatter to the DAP shard, run blocks, gather the whole tensors."""

    blocks: nn.ModuleList

    def __init__(self, checkpoint_blocks: bool, comm: AxialComm) -> None:
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.uncheckpointed_blocks = 0  # with checkpointing on: the last blocks run without
        self.comm = comm

    def set_chunk_size(self, chunk_size: int | None) -> None:
        for block in self.blocks:
            block.set_chunk_size(chunk_size)

    def set_comm(self, comm: AxialComm) -> None:
        self.comm = comm
        for block in self.blocks:
            block.comm = comm

    def _run(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        comm = self.comm
        m = comm.scatter(m, -3)  # [*, N_seq/P, N_res, C_m]
        z = comm.scatter(z, -3)  # [*, N_res/P, N_res, C_z]
        use_ckpt = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        m, z = run_blocks(self.blocks, m, z, msa_mask, pair_mask, use_ckpt,
                          self.uncheckpointed_blocks)
        return comm.gather(m, -3), comm.gather(z, -3)


class EvoformerStack(_Stack):
    """Alg. 6 repeated ``no_blocks`` times, then the single representation
    ``s = Linear(m_1)`` (Alg. 2 line 16).

    ``forward(m [*, N_seq, N_res, C_m], z [*, N_res, N_res, C_z], msa_mask [*, N_seq, N_res],
    pair_mask [*, N_res, N_res]) -> (m, z, s [*, N_res, C_s])``; whole tensors in and out.
    """

    def __init__(
        self,
        cfg,
        order: str = "af2",
        checkpoint_blocks: bool = False,
        comm: AxialComm = IDENTITY_COMM,
    ) -> None:
        super().__init__(checkpoint_blocks, comm)
        self.blocks = nn.ModuleList(
            make_block(cfg, cfg.c_m, cfg.c_z, order, comm=comm) for _ in range(cfg.no_blocks)
        )
        self.linear_s = Linear(cfg.c_m, cfg.c_s)

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, z = self._run(m, z, msa_mask, pair_mask)
        s = self.linear_s(m[..., 0, :, :])  # first MSA row: [*, N_res, C_s]
        return m, z, s


class ExtraMsaStack(_Stack):
    """Alg. 18 repeated ``no_blocks`` times over the extra MSA embedding ``[*, N_extra, N_res,
    C_e]``; returns only the updated pair ``[*, N_res, N_res, C_z]`` (Alg. 2 line 14)."""

    def __init__(
        self,
        cfg,
        c_z: int,
        order: str = "af2",
        checkpoint_blocks: bool = False,
        comm: AxialComm = IDENTITY_COMM,
    ) -> None:
        super().__init__(checkpoint_blocks, comm)
        self.blocks = nn.ModuleList(
            make_block(cfg, cfg.c_e, c_z, order, extra_msa=True, comm=comm)
            for _ in range(cfg.no_blocks)
        )

    def forward(
        self,
        a: torch.Tensor,
        z: torch.Tensor,
        extra_msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> torch.Tensor:
        _, z = self._run(a, z, extra_msa_mask, pair_mask)
        return z
