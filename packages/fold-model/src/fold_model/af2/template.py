"""Template embedding (AF2 supplement 1.7.1): pair features, template pair stack (Alg. 16),
template pointwise attention (Alg. 17), and the torsion-angle rows added to the MSA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fold_ops.weight_casts import grouped
from torch import nn

from fold_model.af2.embedders import (
    TemplateAngleEmbedder,
    build_template_angle_feat,
    distogram_one_hot,
)
from fold_model.geometry import rigid_from_3_points
from fold_model.host_values import slot_filled, slots_present
from fold_model.layers import (
    Attention,
    BlockStack,
    LayerNorm,
    Linear,
    PairTransition,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    chunked_rows,
    dropout_residual,
)
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
# rows of the pointwise attention at a time when templates run one at a time without a chunk
# size (AutoChunk): its keys and values are [rows, N_res, N_templ, H * c] per chunk
_POINTWISE_ROWS = 128


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
        return dropout_residual(update, t, self.dropout_rate, shared_dim, self.training)

    @grouped
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


class TemplatePairStack(BlockStack):
    """Alg. 16: ``no_blocks`` :class:`TemplatePairBlock` then LayerNorm. Whole tensors in and out:
    ``t: [*, N_templ, N_res, N_res, C_t]``, ``pair_mask: [*, N_res, N_res]``."""

    def __init__(
        self, cfg, checkpoint_blocks: bool = False, comm: AxialComm = IDENTITY_COMM
    ) -> None:
        super().__init__(comm, checkpoint_blocks)
        self.blocks = nn.ModuleList(
            TemplatePairBlock(
                cfg.c_t, cfg.c_hidden_tri_att, cfg.no_heads_tri_att, cfg.c_hidden_tri_mul,
                cfg.pair_transition_n, cfg.dropout_rate, comm,
            )
            for _ in range(cfg.no_blocks)
        )
        self.layer_norm = LayerNorm(cfg.c_t)

    def forward(self, t: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        (t,) = self.run((t,), (pair_mask,), split=(True,))  # t split over N_res_i (dim -3)
        return self.layer_norm(t)


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
        # inference: the templates through the pair stack one at a time (set with chunking)
        self.one_template_at_a_time = False
        self.linear_t = Linear(cfg.c_pair_feat, cfg.c_t)
        self.pair_stack = TemplatePairStack(cfg, checkpoint_blocks, comm)
        self.pointwise_attention = TemplatePointwiseAttention(
            cfg.c_t, c_z, cfg.c_hidden_pointwise, cfg.no_heads_pointwise
        )
        self.angle_embedder = (
            TemplateAngleEmbedder(cfg.c_angle_feat, c_m) if cfg.embed_angles else None
        )

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Row chunks of the pair stack and the pointwise attention; with a chunk size the
        templates also go through the pair stack one at a time at inference."""
        self.chunk_size = chunk_size
        self.one_template_at_a_time = chunk_size is not None
        self.pair_stack.set_chunk_size(chunk_size)

    def _pair_stack_output(
        self, feats: dict[str, torch.Tensor], dtype: torch.dtype, pair_mask: torch.Tensor,
        one_by_one: bool, present: tuple[bool, ...] | None,
    ) -> torch.Tensor:
        """The template pair features through ``linear_t`` and the pair stack, ``[*, N_templ,
        N_res, N_res, C_t]``. All templates at once, or (``one_by_one``: inference with
        ``one_template_at_a_time``) one after the other as AF2's code does
        (``TemplateEmbedding`` maps over the templates): the stack treats each template alone,
        so the result is the same, while the 88-channel features ``[N_templ, N_res, N_res, 88]``
        and the stack's intermediates exist for one template at a time (at 3072 residues and 4
        templates the batched features alone are 13 GiB in fp32). ``present``: the filled slots
        (``host_values``); an empty one stays zero (the pointwise attention masks it out)."""
        cfg = self.cfg

        def stack(one: dict[str, torch.Tensor]) -> torch.Tensor:
            pair_feat = build_template_pair_feat(
                one, cfg.distogram_min_bin, cfg.distogram_max_bin, cfg.distogram_no_bins,
                cfg.use_unit_vector, cfg.eps,
            ).to(dtype)
            return self.pair_stack(self.linear_t(pair_feat), pair_mask)

        if not one_by_one:
            return stack(feats)
        templ_dim = feats["template_mask"].dim() - 1  # features are [*, N_templ, ...]
        n_templ = feats["template_mask"].shape[-1]
        t = None
        for k in range(n_templ):
            if not slot_filled(present, k):
                continue
            t_k = stack({name: v.narrow(templ_dim, k, 1) for name, v in feats.items()})
            if t is None:  # [*, N_templ, N_res, N_res, C_t]
                t = t_k.new_zeros(*t_k.shape[:templ_dim], n_templ, *t_k.shape[templ_dim + 1:])
            t.narrow(templ_dim, k, 1).copy_(t_k)
            del t_k
        assert t is not None  # a filled slot (forward skips the stack without any)
        return t

    def forward(
        self, feats: dict[str, torch.Tensor], z: torch.Tensor, pair_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        template_mask = feats["template_mask"].to(z.dtype)  # [*, N_templ]
        inference = not self.training and not torch.is_grad_enabled()
        present = slots_present("template_mask", template_mask) if inference else None
        if present is not None and not any(present):
            # Inference, no template present: the update below would be dropped, so the pair
            # stack is skipped (a zero view: no [N_res, N_res, C_z] buffer).
            dz = z.new_zeros(()).expand(z.shape)
            out = {"template_pair_embedding": dz}
        else:
            one_by_one = (self.one_template_at_a_time and inference
                          and template_mask.shape[-1] > 1)
            t = self._pair_stack_output(feats, z.dtype, pair_mask, one_by_one, present)
            chunk = self.chunk_size
            if chunk is None and self.one_template_at_a_time:
                chunk = _POINTWISE_ROWS
            dz = self.pointwise_attention(t, z, template_mask, chunk)
            del t
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
