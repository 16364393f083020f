"""Outer product mean (AF2 supplement 1.6.4, Alg. 10; AF3 Alg. 9): the MSA's update of the pair,
the only path from the MSA to the pair in a block."""

from __future__ import annotations

from typing import Literal

import torch
from fold_ops.weight_casts import cast_weight
from torch import nn

from fold_model.layers.primitives import LayerNorm, Linear, chunked_rows
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["OuterProductMean"]


class OuterProductMean(nn.Module):
    """Alg. 10: ``z_ij += Linear(mean_s a_si (x) b_sj)`` with masked mean.

    ``layout="col"``: ``m: [*, N_seq, N_res/P, C_m]`` (after column attention); the right
    projection is gathered over N_res (:meth:`AxialComm.all_gather_for_outer_product`).
    ``layout="row"``: ``m: [*, N_seq/P, N_res, C_m]`` (block start / end); each rank sums its
    sequences and the partial sums are reduce-scattered over i. Both return the row-layout pair
    update ``[*, N_res/P, N_res, C_z]``. With ``chunk_size`` the output rows i are computed in
    slices.

    ``divide_bias``: ``(W o + b) / (eps + n)`` as AF2's and AF3's code (and so their released
    weights and Protenix's; the AF2 blocks switch it on from ``EvoformerConfig.opm_divide_bias``,
    AF3's MSA module always); off (the default here): ``W o / (eps + n) + b``, the supplements'
    ``Linear(mean)``.
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(a, b, mask, m)``: the masked projections, the mask ``[*, N_seq, N_res, 1]`` and m
        passed on (its LayerNorm forked: the gradients of a, b and of the m read after the
        outer product mean meet in LayerNorm's backward pass)."""
        m, m_a, m_b = self.layer_norm.fork(m, 2)
        mask = msa_mask.unsqueeze(-1).to(m.dtype)  # [*, N_seq, N_res, 1]
        a, b = self.linear_1(m_a), self.linear_2(m_b)
        # the 0/1 mask in the projections' dtype (bf16 under autocast): a and b are not promoted
        # to fp32 only to be cast back by the einsum (and their gradients likewise)
        mask_ab = mask.to(a.dtype)
        return a * mask_ab, b * mask_ab, mask, m

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
        return self.forward_residual(m, msa_mask, comm, chunk_size, layout)[0]

    def forward_residual(
        self,
        m: torch.Tensor,
        msa_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
        layout: Literal["row", "col"] = "col",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, m)``: the pair update and m passed on for whatever reads the MSA next."""
        a, b, mask, m = self._projections(m, msa_mask)
        return self._update(a, b, mask, comm, chunk_size, layout), m

    def _update(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        mask: torch.Tensor,
        comm: AxialComm,
        chunk_size: int | None,
        layout: str,
    ) -> torch.Tensor:
        """The row-layout pair update ``[*, N_res/P, N_res, C_z]`` from the masked projections
        ``a, b [*, N_seq, N_res, c]`` and ``mask [*, N_seq, N_res, 1]`` (layouts: see the class)."""
        if layout == "col":
            b = comm.all_gather_for_outer_product(b)  # [*, N_seq, N_res, c]
            mask_b = comm.all_gather_for_outer_product(mask)  # [*, N_seq, N_res, 1]

            def project_then_mean(a_i: torch.Tensor, mask_i: torch.Tensor) -> torch.Tensor:
                norm = self._outer_sum(mask_i, mask_b)  # [*, I, N_res, 1]
                # the division acts on the [*, I, J, C_z] projection instead of the
                # [*, I, J, c * c] outer sum (8x fewer elements at c = 32, C_z = 128)
                proj = nn.functional.linear(self._outer_sum(a_i, b),
                                            cast_weight(self.linear_out.weight))
                return self._mean(proj, norm)

            return chunked_rows(project_then_mean, chunk_size, ((a, -2), (mask, -2)), out_dim=-3)
        if layout != "row":
            raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")

        # Row layout: the linear map commutes with the sum over sequences, so each rank projects
        # its partial sum (no bias) and the partial sums are added by reduce_scatter.
        def partial(a_i: torch.Tensor, mask_i: torch.Tensor) -> torch.Tensor:
            weight = cast_weight(self.linear_out.weight)
            proj = nn.functional.linear(self._outer_sum(a_i, b), weight)
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
