"""The AF3 MSA module (supplement 3.3, Alg. 8-10): a light MSA stack whose only output is the
pair update. Each block: outer product mean into the pair, MSA pair-weighted averaging (no MSA
row attention: each sequence averages its own columns with weights from the pair), SwiGLU
transition, then the Pairformer's pair updates.

Layouts as the Pairformer (:mod:`fold_model.af3.pairformer`): the MSA ``[*, N_seq/P, N, C_m]`` and
the pair ``[*, N/P, N, C_z]`` in row layout; masks whole.
"""

from __future__ import annotations

import torch
from fold_ops.weight_casts import grouped
from torch import nn

from fold_model import ops
from fold_model.af3.pairformer import PairUpdates
from fold_model.layers import (
    BlockStack,
    LayerNorm,
    Linear,
    OuterProductMean,
    SwiGLUTransition,
    chunked_rows,
    fork_pair_bias,
)
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["MSA_FEAT_DIM", "msa_features", "MSAPairWeightedAveraging", "MSAModuleBlock",
           "MSAModule"]

MSA_FEAT_DIM = 34  # one-hot(msa, 32) + has_deletion + deletion_value (Alg. 8 line 1)


def msa_features(
    msa: torch.Tensor, has_deletion: torch.Tensor, deletion_value: torch.Tensor
) -> torch.Tensor:
    """``[*, N_seq, N]`` codes and deletion features -> ``[*, N_seq, N, 34]``."""
    onehot = nn.functional.one_hot(msa.long(), 32).to(deletion_value.dtype)
    return torch.cat([onehot, has_deletion[..., None], deletion_value[..., None]], dim=-1)


class MSAPairWeightedAveraging(nn.Module):
    """Alg. 10: ``o_si^h = g_si^h * sum_j softmax_j(b_ij^h) v_sj^h`` with
    ``b = LinearNoBias(LN(z))``.

    ``m: [*, N_seq/P, N, C_m]`` (row layout), ``z: [*, N/P, N, C_z]`` (row layout; the weights are
    gathered over i), ``token_mask: [*, N]`` masks the averaged columns j. Returns the update
    ``[*, N_seq/P, N, C_m]``.
    """

    def __init__(self, c_m: int, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.no_heads = no_heads
        self.layer_norm_m = LayerNorm(c_m)
        self.linear_v = Linear(c_m, c_hidden * no_heads, bias=False)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_b = Linear(c_z, no_heads, bias=False)
        self.linear_g = Linear(c_m, c_hidden * no_heads, bias=False, init="gating")
        self.linear_o = Linear(c_hidden * no_heads, c_m, bias=False, init="final")

    def _average(self, m_v: torch.Tensor, m_g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The update from the normalised MSA (``m_v`` for the values, ``m_g``, the same numbers,
        for the gate) and the weights ``w [*, H, N_i, N_j]``."""
        v = self.linear_v(m_v).unflatten(-1, (self.no_heads, self.c_hidden))  # [*, S, N_j, H, c]
        o = torch.einsum("...hij,...sjhc->...sihc", w, v).flatten(-2)  # [*, S, N_i, H * c]
        return self.linear_o(ops.bias_sigmoid_gate(o, self.linear_g(m_g)))

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        return self.forward_residual(m, z, token_mask, comm, chunk_size)[0]

    def forward_residual(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        comm: AxialComm = IDENTITY_COMM,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(update, m, z)``: the update, and m and z passed on for what reads them next (the
        residual sum, the pair stack), both LayerNorms forked (``LayerNorm.fork``)."""
        m, m_v, m_g = self.layer_norm_m.fork(m, 2)  # read by the values and the gate
        z, b = fork_pair_bias(self.layer_norm_z, z, self.linear_b, comm, 0)  # b [*, H, N_i, N_j]
        w = ops.softmax_mask_bias(b, token_mask[..., None, None, :])  # [*, H, N_i, N_j]
        update = chunked_rows(self._average, chunk_size, ((m_v, -3), (m_g, -3)), (w,),
                              out_dim=-3)
        return update, m, z


class MSAModuleBlock(PairUpdates):
    """One block of Alg. 8 (lines 5-15). The last block skips the MSA updates: the module's
    output is the pair alone, so they would be dead code.

    ``forward(m [*, N_seq/P, N, C_m], z [*, N/P, N, C_z], msa_mask [*, N_seq, N],
    pair_mask [*, N, N], token_mask [*, N]) -> (m, z)``.
    """

    def __init__(self, cfg, c_z: int, last: bool, comm: AxialComm = IDENTITY_COMM,
                 use_checkpoint: bool = False) -> None:
        super().__init__(
            c_z, cfg.c_hidden_mul, cfg.c_hidden_tri_att, cfg.no_heads_tri_att, cfg.transition_n,
            cfg.pair_dropout, comm, use_checkpoint,
        )
        self.last = last
        self.msa_dropout = cfg.msa_dropout
        # (W o + b) / (eps + n): the bias divided by the pair count too, as in AF3's code
        # (OuterProductMean) and Protenix's, which the released weights were trained with.
        self.outer_product_mean = OuterProductMean(cfg.c_m, c_z, cfg.c_hidden_opm,
                                                   divide_bias=True)
        if not last:
            self.pair_weighted_averaging = MSAPairWeightedAveraging(
                cfg.c_m, c_z, cfg.c_hidden_pair_avg, cfg.no_heads_pair_avg
            )
            self.msa_transition = SwiGLUTransition(cfg.c_m, cfg.transition_n)

    @grouped
    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._block(self._forward, m, z, msa_mask, pair_mask, token_mask)

    def _forward(self, m, z, msa_mask, pair_mask, token_mask):
        comm, chunk = self.comm, self.chunk_size
        mask_row = comm.scatter(msa_mask, -2)  # [*, N_seq/P, N]
        update, m = self._run(self.outer_product_mean.forward_residual, m, mask_row, comm,
                              chunk, "row")
        z = z + update
        del update  # each update is freed once added: none is held while the pair stack runs
        if not self.last:
            update, m, z = self._run(self.pair_weighted_averaging.forward_residual, m, z,
                                     token_mask, comm, chunk)
            m = self._residual(update, m, self.msa_dropout, -3)  # DropoutRowwise
            # m is this block's own (the sum above): in inference the transition adds into it
            m = self.msa_transition.residual(m, chunk, run=self._run)
        return m, self.pair_stack(z, pair_mask)


class MSAModule(BlockStack):
    """Alg. 8: embed the MSA (``LinearNoBias(msa_feat) + LinearNoBias(s_inputs)``), run the blocks,
    return the updated pair.

    ``forward(msa_feat [*, N_seq, N, 34], z [*, N, N, C_z], s_inputs [*, N, C_s_inputs],
    msa_mask [*, N_seq, N], pair_mask [*, N, N], token_mask [*, N]) -> z [*, N, N, C_z]``.
    """

    def __init__(self, cfg, c_z: int, c_s_inputs: int, comm: AxialComm = IDENTITY_COMM,
                 use_checkpoint: bool = False) -> None:
        super().__init__(comm)  # checkpointing is the blocks' own
        self.linear_m = Linear(MSA_FEAT_DIM, cfg.c_m, bias=False)
        self.linear_s = Linear(c_s_inputs, cfg.c_m, bias=False)
        self.blocks = nn.ModuleList(
            MSAModuleBlock(cfg, c_z, last=i == cfg.no_blocks - 1, comm=comm,
                           use_checkpoint=use_checkpoint)
            for i in range(cfg.no_blocks)
        )

    def forward(
        self,
        msa_feat: torch.Tensor,
        z: torch.Tensor,
        s_inputs: torch.Tensor,
        msa_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> torch.Tensor:
        m = self.linear_m(msa_feat) + self.linear_s(s_inputs).unsqueeze(-3)  # [*, N_seq, N, C_m]
        # both split over dim -3 (N_seq, N_i); only the pair leaves the module
        _, z = self.run((m, z), (msa_mask, pair_mask, token_mask), split=(True, True),
                        gather=(False, True))
        return z
