"""Template embedding (AF2 supplement 1.7.1): pair features, template pair stack (Alg. 16),
template pointwise attention (Alg. 17), and the torsion-angle rows added to the MSA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model import ops
from fold_model.af2.embedders import (
    TemplateAngleEmbedder,
    build_template_angle_feat,
    distogram_one_hot,
)
from fold_model.af2.evoformer import (
    PairTransition,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
)
from fold_model.af2.rigid import rigid_from_3_points
from fold_model.primitives import Attention, LayerNorm, Linear, chunked_rows, shared_dropout_mask
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = [
    "build_template_pair_feat",
    "TemplatePairBlock",
    "TemplatePairStack",
    "TemplatePointwiseAttention",
    "TemplateEmbedder",
]

# atom37 slots of the backbone atoms (residue_constants.atom_order).
_N, _CA, _C = 0, 1, 2


def build_template_pair_feat(
    feats: dict[str, torch.Tensor],
    min_bin: float = 3.25,
    max_bin: float = 50.75,
    no_bins: int = 39,
    use_unit_vector: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The 88 template pair channels (supplement Table 1) ``[*, N_templ, N_res, N_res, 88]``.

    Distogram of the pseudo-beta atoms (39 bins, 3.25-50.75 A), the pseudo-beta pair mask (1),
    the template residue one-hot of j then of i (2 x 22), the unit vector from residue i's
    backbone frame (Alg. 21 from N, CA, C) to CA_j (3), the backbone pair mask (1). As in AF2's
    code (``SingleTemplateEmbedding``), all 88 channels are then multiplied by the backbone pair
    mask (N, CA, C present at i and j), so unaligned positions are zero in every channel.
    Reads ``template_pseudo_beta[_mask]``, ``template_aatype``, ``template_all_atom_positions``,
    ``template_all_atom_mask`` (``[*, N_templ, N_res, ...]``).
    """
    pb = feats["template_pseudo_beta"].float()  # [*, T, N, 3]
    pb_mask = feats["template_pseudo_beta_mask"].float()  # [*, T, N]
    pb_mask_2d = pb_mask[..., :, None] * pb_mask[..., None, :]  # [*, T, N, N]
    dgram = distogram_one_hot(pb, min_bin, max_bin, no_bins)

    n_res = pb.shape[-2]
    aatype = F.one_hot(feats["template_aatype"].long(), 22).float()  # [*, T, N, 22]
    aatype_j = aatype[..., None, :, :].expand(*aatype.shape[:-2], n_res, n_res, 22)
    aatype_i = aatype[..., :, None, :].expand(*aatype.shape[:-2], n_res, n_res, 22)

    pos = feats["template_all_atom_positions"].float()  # [*, T, N, 37, 3]
    atom_mask = feats["template_all_atom_mask"].float()  # [*, T, N, 37]
    bb_mask = atom_mask[..., _N] * atom_mask[..., _CA] * atom_mask[..., _C]  # [*, T, N]
    bb_mask_2d = bb_mask[..., :, None] * bb_mask[..., None, :]  # [*, T, N, N]
    if use_unit_vector:
        frames = rigid_from_3_points(pos[..., _N, :], pos[..., _CA, :], pos[..., _C, :])
        local = frames.unsqueeze(-1).invert_apply(pos[..., None, :, _CA, :])  # [*, T, N, N, 3]
        unit = local * torch.rsqrt(eps + local.pow(2).sum(-1, keepdim=True))
        unit = unit * bb_mask_2d[..., None]
    else:
        unit = pos.new_zeros(*bb_mask_2d.shape, 3)

    act = torch.cat(
        [dgram, pb_mask_2d[..., None], aatype_j, aatype_i, unit, bb_mask_2d[..., None]], dim=-1
    )
    return act * bb_mask_2d[..., None]


class TemplatePairBlock(nn.Module):
    """Alg. 16 (one block): triangle attention (start, end), triangle multiplication (out, in),
    pair transition, each a residual with shared dropout.

    ``t: [*, N_templ, N_res/P, N_res, C_t]`` (row layout), whole ``pair_mask: [*, N_res, N_res]``
    (shared by the templates) -> ``t``.
    """

    def __init__(
        self,
        c_t: int,
        c_hidden_tri_att: int,
        no_heads: int,
        c_hidden_tri_mul: int,
        transition_n: int,
        dropout_rate: float,
        comm: AxialComm = IDENTITY_COMM,
    ) -> None:
        super().__init__()
        self.dropout_rate = dropout_rate
        self.comm = comm
        self.chunk_size: int | None = None
        self.tri_att_start = TriangleAttentionStartingNode(c_t, c_hidden_tri_att, no_heads)
        self.tri_att_end = TriangleAttentionEndingNode(c_t, c_hidden_tri_att, no_heads)
        self.tri_mul_out = TriangleMultiplicationOutgoing(c_t, c_hidden_tri_mul)
        self.tri_mul_in = TriangleMultiplicationIncoming(c_t, c_hidden_tri_mul)
        self.pair_transition = PairTransition(c_t, transition_n)

    def set_chunk_size(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size

    def _residual(self, update: torch.Tensor, t: torch.Tensor, shared_dim: int) -> torch.Tensor:
        mask = shared_dropout_mask(update, self.dropout_rate, shared_dim, self.training)
        return ops.bias_dropout_residual(update, t, None, mask)

    def forward(self, t: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        comm, chunk = self.comm, self.chunk_size
        mask_row = comm.scatter(pair_mask, -2).unsqueeze(-3)  # [*, 1, N_res/P, N_res]
        mask_col = comm.scatter(pair_mask, -1).unsqueeze(-3)  # [*, 1, N_res, N_res/P]
        t = self._residual(self.tri_att_start(t, mask_row, comm, chunk), t, -3)
        t = comm.row_to_col(t)  # [*, N_templ, N_res, N_res/P, C_t]
        t = self._residual(self.tri_att_end(t, mask_col, comm, chunk), t, -2)
        t = comm.col_to_row(t)  # [*, N_templ, N_res/P, N_res, C_t]
        t = self._residual(self.tri_mul_out(t, mask_row, comm, chunk), t, -3)
        t = comm.row_to_col(t)
        t = self._residual(self.tri_mul_in(t, mask_col, comm, chunk), t, -3)
        t = t + self.pair_transition(t, chunk)
        return comm.col_to_row(t)


class TemplatePairStack(nn.Module):
    """Alg. 16: ``no_blocks`` :class:`TemplatePairBlock` then LayerNorm. Whole tensors in and out:
    ``t: [*, N_templ, N_res, N_res, C_t]``, ``pair_mask: [*, N_res, N_res]``."""

    def __init__(
        self, cfg, checkpoint_blocks: bool = False, comm: AxialComm = IDENTITY_COMM
    ) -> None:
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.comm = comm
        self.blocks = nn.ModuleList(
            TemplatePairBlock(
                cfg.c_t, cfg.c_hidden_tri_att, cfg.no_heads_tri_att, cfg.c_hidden_tri_mul,
                cfg.pair_transition_n, cfg.dropout_rate, comm,
            )
            for _ in range(cfg.no_blocks)
        )
        self.layer_norm = LayerNorm(cfg.c_t)

    def set_chunk_size(self, chunk_size: int | None) -> None:
        for block in self.blocks:
            block.set_chunk_size(chunk_size)

    def set_comm(self, comm: AxialComm) -> None:
        self.comm = comm
        for block in self.blocks:
            block.comm = comm

    def forward(self, t: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        t = self.comm.scatter(t, -3)  # [*, N_templ, N_res/P, N_res, C_t]
        use_ckpt = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if use_ckpt:
                t = checkpoint(block, t, pair_mask, use_reentrant=False)
            else:
                t = block(t, pair_mask)
        return self.layer_norm(self.comm.gather(t, -3))


class TemplatePointwiseAttention(nn.Module):
    """Alg. 17: each pair position attends over the templates.

    ``t: [*, N_templ, N_res, N_res, C_t]``, ``z: [*, N_res, N_res, C_z]``,
    ``template_mask: [*, N_templ]`` -> update ``[*, N_res, N_res, C_z]`` (no gate; chunked over
    rows i when ``chunk_size`` is set).
    """

    def __init__(self, c_t: int, c_z: int, c_hidden: int, no_heads: int) -> None:
        super().__init__()
        self.mha = Attention(c_z, c_t, c_hidden, no_heads, gating=False)

    def forward(
        self,
        t: torch.Tensor,
        z: torch.Tensor,
        template_mask: torch.Tensor,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        q_x = z.unsqueeze(-2)  # [*, N_i, N_j, 1, C_z]
        kv_x = t.movedim(-4, -2)  # [*, N_i, N_j, N_templ, C_t]
        mask = template_mask[..., None, None, :]  # [*, 1, 1, N_templ]

        def attend(q_i: torch.Tensor, kv_i: torch.Tensor) -> torch.Tensor:
            return self.mha(q_i, kv_i, mask, None)

        out = chunked_rows(attend, chunk_size, ((q_x, -4), (kv_x, -4)), out_dim=-4)
        return out.squeeze(-2)  # [*, N_i, N_j, C_z]


class TemplateEmbedder(nn.Module):
    """Alg. 2 lines 7-9: the template pair embedding added to z and the template torsion rows
    concatenated to the MSA.

    ``forward(feats, z, pair_mask)`` with template features ``[*, N_templ, N_res, ...]`` returns
    ``{"template_pair_embedding": [*, N_res, N_res, C_z]}`` plus, when angles are embedded,
    ``"template_single_embedding": [*, N_templ, N_res, C_m]`` and
    ``"template_single_mask": [*, N_templ, N_res]``.
    """

    def __init__(
        self,
        cfg,
        c_m: int,
        c_z: int,
        checkpoint_blocks: bool = False,
        comm: AxialComm = IDENTITY_COMM,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.chunk_size: int | None = None
        self.linear_t = Linear(cfg.c_pair_feat, cfg.c_t)
        self.pair_stack = TemplatePairStack(cfg, checkpoint_blocks, comm)
        self.pointwise_attention = TemplatePointwiseAttention(
            cfg.c_t, c_z, cfg.c_hidden_pointwise, cfg.no_heads_pointwise
        )
        self.angle_embedder = (
            TemplateAngleEmbedder(cfg.c_angle_feat, c_m) if cfg.embed_angles else None
        )

    def set_chunk_size(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size
        self.pair_stack.set_chunk_size(chunk_size)

    def forward(
        self, feats: dict[str, torch.Tensor], z: torch.Tensor, pair_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        template_mask = feats["template_mask"].to(z.dtype)  # [*, N_templ]
        pair_feat = build_template_pair_feat(
            feats, cfg.distogram_min_bin, cfg.distogram_max_bin, cfg.distogram_no_bins,
            cfg.use_unit_vector, cfg.eps,
        ).to(z.dtype)
        t = self.linear_t(pair_feat)  # [*, N_templ, N_res, N_res, C_t]
        t = self.pair_stack(t, pair_mask)
        dz = self.pointwise_attention(t, z, template_mask, self.chunk_size)
        # No template at all: the attention would average padding, so the update is dropped.
        any_template = (template_mask.sum(-1) > 0).to(dz.dtype)[..., None, None, None]
        out = {"template_pair_embedding": dz * any_template}
        if self.angle_embedder is not None:
            angle_feat = build_template_angle_feat(
                feats["template_aatype"],
                feats["template_torsion_angles_sin_cos"].to(z.dtype),
                feats["template_alt_torsion_angles_sin_cos"].to(z.dtype),
                feats["template_torsion_angles_mask"].to(z.dtype),
            )
            out["template_single_embedding"] = self.angle_embedder(angle_feat)
            # AF2 masks a template row by its psi torsion (index 2) being defined.
            out["template_single_mask"] = (
                feats["template_torsion_angles_mask"][..., 2] * template_mask[..., None]
            )
        return out
