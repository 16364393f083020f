"""The pair stack of a block: AF2 Alg. 6 lines 5-9 and AF3 Alg. 17 lines 1-5 are the same five
updates of the pair, each a residual with shared dropout; the Evoformer, the extra MSA stack, the
Pairformer and the AF3 MSA module and template embedder run them through :func:`pair_stack`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fold_model.layers.primitives import (
    add_residual,
    dropout_residual,
    in_place_residuals,
)
from fold_model.layers.transitions import call
from fold_model.seams import AxialComm

__all__ = ["pair_stack"]


def pair_stack(
    block: nn.Module,
    z: torch.Tensor,
    pair_mask: torch.Tensor,
    comm: AxialComm,
    chunk_size: int | None,
    rate: float,
    run: Callable[..., Any] = call,
) -> torch.Tensor:
    """Triangle multiplication outgoing, incoming, triangle attention starting, ending node,
    transition: ``block``'s ``tri_mul_out``, ``tri_mul_in``, ``tri_att_start``, ``tri_att_end``,
    ``pair_transition``, with dropout ``rate`` (row-wise, then column-wise for the ending node).
    Each sub-layer's ``forward_residual`` returns ``(update, z passed on)``: its LayerNorm forks
    the stream, so the residual's gradient of z joins LayerNorm's backward pass.

    ``z [*, N/P, N, C_z]`` (row layout) -> same layout; ``pair_mask [*, N, N]`` whole. ``run(fn,
    *args)`` calls a sub-layer (AF3 passes its per-sub-layer checkpointing).
    """
    train = block.training
    in_place = in_place_residuals(chunk_size, train)  # long inputs: one pair buffer

    def residual(update: torch.Tensor, z: torch.Tensor, shared_dim: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        if in_place:  # inference: no dropout, and the sub-layer kept its bias (see below)
            return add_residual(z, update, True)
        return dropout_residual(update, z, rate, shared_dim, train, bias)

    # Triangle attention's output bias goes to the residual op (one fused pass) unless the sum
    # is taken in place (forward_residual's out_bias=in_place keeps it in the GEMM then); its
    # GEMM is otherwise a plain one (see TriangleAttention.forward_residual)
    att_start, att_end = block.tri_att_start, block.tri_att_end

    mask_row = comm.scatter(pair_mask, -2)  # [*, N/P, N]
    mask_col = comm.scatter(pair_mask, -1)  # [*, N, N/P]
    z = residual(*run(block.tri_mul_out.forward_residual, z, mask_row, comm, chunk_size), -3)
    z = comm.row_to_col(z)  # [*, N, N/P, C_z]
    z = residual(*run(block.tri_mul_in.forward_residual, z, mask_col, comm, chunk_size), -3)
    z = comm.col_to_row(z)  # [*, N/P, N, C_z]
    z = residual(*run(att_start.forward_residual, z, mask_row, comm, chunk_size, in_place), -3,
                 att_start.out_bias)
    z = comm.row_to_col(z)  # [*, N, N/P, C_z]
    # DropoutColumnwise: one mask shared by all columns (dim -2).
    z = residual(*run(att_end.forward_residual, z, mask_col, comm, chunk_size, in_place), -2,
                 att_end.out_bias)
    # z is this block's own here (the residuals above made it; in place only where the caller
    # allowed it), so in inference AF3's transition may add into it; the update is not held
    # while col_to_row allocates the row layout (DAP)
    z = block.pair_transition.residual(z, chunk_size, run=run, in_place=in_place)
    return comm.col_to_row(z)  # [*, N/P, N, C_z]
