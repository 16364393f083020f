"""The Evoformer (AF2 supplement 1.6, Alg. 6), the extra MSA stack (Alg. 18) and the table of
block orders, composed from :mod:`fold_model.layers`.

Block orders (:data:`BLOCK_ORDERS`, the one list of them; ``AlphaFold2Config.block_order`` is a
key):

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

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from fold_ops.weight_casts import grouped
from torch import nn

from fold_model.layers import (
    BlockStack,
    Linear,
    MSAColumnAttention,
    MSAColumnGlobalAttention,
    MSARowAttentionWithPairBias,
    MSATransition,
    OuterProductMean,
    PairTransition,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    add_residual,
    dropout_residual,
    in_place_residuals,
    pair_stack,
)
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = [
    "EvoformerBlock",
    "ParallelEvoformerBlock",
    "ExtraMsaBlock",
    "ParallelExtraMsaBlock",
    "BlockOrderSpec",
    "BLOCK_ORDERS",
    "make_block",
    "offload_to_host",
    "EvoformerStack",
    "ExtraMsaStack",
]


def offload_to_host(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` in host memory (pinned when CUDA is present: the copy is asynchronous and
    PyTorch's pinned-memory cache reuses the buffer block after block). Always a copy, also of a
    host tensor, so the device tensor can be freed and the CPU runs the same code."""
    host = torch.empty(x.shape, dtype=x.dtype, device="cpu",
                       pin_memory=torch.cuda.is_available())
    return host.copy_(x, non_blocking=True)


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
        # inference: the block's MSA waits in host memory while its pair updates run
        self.msa_offload = False
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

    def _msa_stack(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``m [*, N_seq/P, N_res, C_m]`` (row) -> ``([*, N_seq, N_res/P, C_m]`` (column), z
        passed on by the row attention's forked LayerNorm: read it, not z, after this)."""
        comm, chunk, train = self.comm, self.chunk_size, self.training
        mask_row = comm.scatter(msa_mask, -2)  # [*, N_seq/P, N_res]
        mask_col = comm.scatter(msa_mask, -1)  # [*, N_seq, N_res/P]
        update, m, z = self.msa_att_row.forward_residual(m, z, mask_row, comm, chunk)
        # DropoutRowwise: one mask shared by all MSA rows (dim -3).
        m = dropout_residual(update, m, self.msa_dropout, -3, train)
        m = comm.row_to_col(m)  # [*, N_seq, N_res/P, C_m]
        update, m = self.msa_att_col.forward_residual(m, mask_col, chunk)
        m = m + update
        del update  # not held while the transition runs
        return m + self.msa_transition(m, chunk), z

    def _pair_stack(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """``z [*, N_res/P, N_res, C_z]`` (row) -> same layout (Alg. 6 lines 5-9)."""
        return pair_stack(self, z, pair_mask, self.comm, self.chunk_size, self.pair_dropout)

    def _opm_after_msa(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Order ``"af2"``: MSA stack, then the outer product mean of the column-layout MSA."""
        m_col, z = self._msa_stack(m, z, msa_mask)
        mask_col = self.comm.scatter(msa_mask, -1)
        opm, m_col = self.outer_product_mean.forward_residual(m_col, mask_col, self.comm,
                                                              self.chunk_size, layout="col")
        return m_col, add_residual(z, opm, in_place_residuals(self.chunk_size, self.training))

    def _opm_before_msa(
        self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Order ``"multimer"``: the outer product mean of the block's input MSA first, so the
        MSA's row attention reads the updated pair."""
        mask_row = self.comm.scatter(msa_mask, -2)
        opm, m = self.outer_product_mean.forward_residual(m, mask_row, self.comm,
                                                          self.chunk_size, layout="row")
        z = add_residual(z, opm, in_place_residuals(self.chunk_size, self.training))
        return self._msa_stack(m, z, msa_mask)


class EvoformerBlock(_EvoformerLayers):
    """One Evoformer block (Alg. 6) in a sequential ``order`` of :data:`BLOCK_ORDERS` (``"af2"``
    or ``"multimer"``: the row says where the outer product mean goes).

    ``forward(m, z, msa_mask, pair_mask) -> (m, z)`` with ``m: [*, N_seq/P, N_res, C_m]``,
    ``z: [*, N_res/P, N_res, C_z]`` (row layout; whole on one device), whole masks
    ``msa_mask: [*, N_seq, N_res]``, ``pair_mask: [*, N_res, N_res]``.
    """

    def __init__(self, *args, order: str = "af2", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sequential = [name for name, row in BLOCK_ORDERS.items() if row.msa_and_opm is not None]
        if order not in sequential:
            raise ValueError(f"EvoformerBlock order must be one of {sequential}, got {order!r}")
        self.order = order

    @grouped
    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.msa_offload:  # m in and out in host memory; on the device only for the MSA stack
            m = m.to(z.device, non_blocking=True)  # [*, N_seq, N_res, C_m]: host -> device
            m_col, z = BLOCK_ORDERS[self.order].msa_and_opm(self, m, z, msa_mask)
            del m
            m_host = offload_to_host(self.comm.col_to_row(m_col))
            del m_col
            return m_host, self._pair_stack(z, pair_mask)  # the peak, without the MSA
        m_col, z = BLOCK_ORDERS[self.order].msa_and_opm(self, m, z, msa_mask)
        # DAO: the MSA's way back to row layout overlaps the pair stack.
        handle = self.comm.col_to_row_async(m_col)
        z = self._pair_stack(z, pair_mask)
        return self.comm.wait(handle), z


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
        # z is read by the pair branch too (on another rank under BP): its passed-on copy is
        # not used, autograd adds the two branches' gradients of z
        return self.comm.col_to_row(self._msa_stack(m, z, msa_mask)[0])

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

    @grouped
    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.msa_offload:  # m in and out in host memory; the pair branch without the MSA
            m_new = self.msa_branch(m.to(z.device, non_blocking=True), z, msa_mask)
            m_host = offload_to_host(m_new)
            del m_new
            z_new = self.pair_branch(z, pair_mask)
            # the outer product mean of the new MSA, loaded back for it
            m_new, z_new = self.join(m_host.to(z.device, non_blocking=True), z_new, msa_mask)
            del m_new
            return m_host, z_new
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


@dataclass(frozen=True)
class BlockOrderSpec:
    """One row of :data:`BLOCK_ORDERS`: the block of the Evoformer and of the extra MSA stack (each
    called with the sizes of :func:`make_block`), for a sequential order how the block runs its
    MSA stack and outer product mean before the pair stack (returning the column-layout MSA and
    the pair; None for the Parallel Evoformer's independent branches), and the source."""

    evoformer_block: Callable[..., _EvoformerLayers]
    extra_msa_block: Callable[..., _EvoformerLayers]
    msa_and_opm: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None
    source: str


# The one table of block orders: a new order is one row here (and its block class above when
# it is not sequential).
BLOCK_ORDERS: dict[str, BlockOrderSpec] = {
    "af2": BlockOrderSpec(
        partial(EvoformerBlock, order="af2"), partial(ExtraMsaBlock, order="af2"),
        _EvoformerLayers._opm_after_msa, "AF2 supplement Alg. 6",
    ),
    "multimer": BlockOrderSpec(
        partial(EvoformerBlock, order="multimer"), partial(ExtraMsaBlock, order="multimer"),
        _EvoformerLayers._opm_before_msa, "AlphaFold-Multimer (Evans et al. 2021)",
    ),
    "parallel": BlockOrderSpec(
        ParallelEvoformerBlock, ParallelExtraMsaBlock, None,
        "Parallel Evoformer (Wang et al. 2022)",
    ),
}


def make_block(
    cfg, c_m: int, c_z: int, order: str, extra_msa: bool = False,
    comm: AxialComm = IDENTITY_COMM,
) -> _EvoformerLayers:
    """A block of ``order`` (a key of :data:`BLOCK_ORDERS`) from an :class:`EvoformerConfig` or
    :class:`ExtraMsaConfig`."""
    if order not in BLOCK_ORDERS:
        raise ValueError(f"block order must be one of {list(BLOCK_ORDERS)}, got {order!r}")
    row = BLOCK_ORDERS[order]
    return (row.extra_msa_block if extra_msa else row.evoformer_block)(
        c_m=c_m, c_z=c_z, c_hidden_msa_att=cfg.c_hidden_msa_att, no_heads_msa=cfg.no_heads_msa,
        c_hidden_opm=cfg.c_hidden_opm, c_hidden_mul=cfg.c_hidden_mul,
        c_hidden_pair_att=cfg.c_hidden_pair_att, no_heads_pair=cfg.no_heads_pair,
        transition_n=cfg.transition_n, msa_dropout=cfg.msa_dropout,
        pair_dropout=cfg.pair_dropout, comm=comm, opm_divide_bias=cfg.opm_divide_bias,
    )


class _MsaOffload:
    """``set_msa_offload`` of the AF2 MSA stacks."""

    msa_offload = False

    def set_msa_offload(self, offload: bool) -> None:
        """Inference on one device: the MSA representation lives in host memory between blocks
        and while each block's pair updates run (OpenFold's offloading, for inputs whose MSA
        does not fit beside the pair); each block loads it for its MSA updates and stores the
        result back. The same numbers; a copy to the device and back per block. The stack
        takes and returns ``m`` in host memory then (the Evoformer returns it on the device)."""
        self.msa_offload = bool(offload)
        for block in self.blocks:
            block.msa_offload = bool(offload)


class EvoformerStack(_MsaOffload, BlockStack):
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
        super().__init__(comm, checkpoint_blocks)
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
        m, z = self.run((m, z), (msa_mask, pair_mask), split=(True, True))
        if self.msa_offload:  # back on the device for the heads and the recycling
            m = m.to(z.device, non_blocking=True)
        s = self.linear_s(m[..., 0, :, :])  # first MSA row: [*, N_res, C_s]
        return m, z, s


class ExtraMsaStack(_MsaOffload, BlockStack):
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
        super().__init__(comm, checkpoint_blocks)
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
        _, z = self.run((a, z), (extra_msa_mask, pair_mask), split=(True, True))
        return z
