"""The AF3 template embedder (supplement 3.5, Alg. 16).

Per template t: pair features ``a_tij`` (pseudo-beta distogram, masks, unit vector of CA_j in the
backbone frame of i; all zeroed between chains) with the one-hot residue types of i and j;
``v = LinearNoBias(LN(z)) + LinearNoBias(a_t)``; a pair-only Pairformer (2 blocks); the templates'
``LN(v)`` are averaged over the real templates and projected to the pair:
``LinearNoBias(relu(u))``. Templates are a batch dim of the pair stack (no loop over T).
"""

from __future__ import annotations

import torch
from torch import nn

from fold_model.af3.pairformer import PairUpdates
from fold_model.geometry import rigid_from_3_points
from fold_model.host_values import slot_filled, slots_present
from fold_model.layers import BlockStack, LayerNorm, Linear
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["template_pair_features", "TemplateEmbedder", "TemplatePairStack"]


def template_pair_features(
    restype: torch.Tensor,
    pseudo_beta: torch.Tensor,
    pseudo_beta_mask: torch.Tensor,
    backbone: torch.Tensor,
    backbone_mask: torch.Tensor,
    asym_id: torch.Tensor,
    min_bin: float = 3.25,
    max_bin: float = 50.75,
    no_bins: int = 39,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Alg. 16 lines 1-6. ``restype [*, T, N]``, ``pseudo_beta [*, T, N, 3]``, masks ``[*, T, N]``,
    ``backbone [*, T, N, 3 (N, CA, C), 3]``, ``asym_id [*, N]``
    -> ``[*, T, N, N, no_bins + 69]``."""
    dtype = pseudo_beta.dtype
    d2 = (pseudo_beta[..., :, None, :] - pseudo_beta[..., None, :, :]).square().sum(-1)
    lower = torch.linspace(min_bin, max_bin, no_bins, dtype=dtype, device=d2.device).square()
    upper = torch.cat([lower[1:], lower.new_full((1,), 1e8)])
    distogram = ((d2[..., None] > lower) & (d2[..., None] < upper)).to(dtype)  # [*, T, N, N, B]
    pb_pair = pseudo_beta_mask[..., :, None] * pseudo_beta_mask[..., None, :]  # [*, T, N, N]
    frames = rigid_from_3_points(backbone[..., 0, :], backbone[..., 1, :], backbone[..., 2, :])
    ca = backbone[..., 1, :]  # [*, T, N, 3]
    # CA_j in the frame of residue i: R_i^T (CA_j - CA_i)  [*, T, N_i, N_j, 3]
    diff = ca[..., None, :, :] - ca[..., :, None, :]  # [*, T, N_i, N_j, 3]: CA_j - CA_i
    local = torch.einsum("...iab,...ija->...ijb", frames.rots, diff)
    bb_pair = backbone_mask[..., :, None] * backbone_mask[..., None, :]
    unit = local * torch.rsqrt(eps + local.square().sum(-1, keepdim=True)) * bb_pair[..., None]
    same_chain = (asym_id[..., :, None] == asym_id[..., None, :]).to(dtype)  # [*, N, N]
    a = torch.cat(
        [distogram * pb_pair[..., None], pb_pair[..., None], unit, bb_pair[..., None]], -1
    )
    a = a * same_chain[..., None, :, :, None]
    onehot = nn.functional.one_hot(restype.long(), 32).to(dtype)  # [*, T, N, 32]
    n = restype.shape[-1]
    rt_i = onehot[..., :, None, :].expand(*onehot.shape[:-2], n, n, 32)
    rt_j = onehot[..., None, :, :].expand(*onehot.shape[:-2], n, n, 32)
    return torch.cat([a, rt_i, rt_j], dim=-1)


class TemplateEmbedder(BlockStack):
    """Alg. 16. ``forward(feats, z [*, N, N, C_z], pair_mask [*, N, N]) -> [*, N, N, C_z]`` with
    ``feats`` the AF3 sample's ``template_*`` features, ``template_mask [*, T]`` and
    ``asym_id [*, N]``."""

    def __init__(self, cfg, c_z: int, comm: AxialComm = IDENTITY_COMM,
                 use_checkpoint: bool = False) -> None:
        super().__init__(comm)  # checkpointing is the blocks' own
        self.cfg = cfg
        c_t = cfg.c_t
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_z = Linear(c_z, c_t, bias=False)
        self.linear_a = Linear(cfg.distogram_no_bins + 5 + 64, c_t, bias=False)
        self.blocks = nn.ModuleList(
            PairUpdates(c_t, cfg.c_hidden_mul, cfg.c_hidden_tri_att, cfg.no_heads_tri_att,
                        cfg.transition_n, cfg.dropout, comm, use_checkpoint)
            for _ in range(cfg.no_blocks)
        )
        self.layer_norm_v = LayerNorm(c_t)
        self.linear_out = Linear(c_t, c_z, bias=False)
        # what runs the pair stack (None: self.run); not a submodule, so the state-dict keys stay
        self.__dict__["_pair_stack"] = None
        # inference: the templates through the pair stack one at a time (set with chunking)
        self.one_template_at_a_time = False

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Row chunks of every block; with a chunk size the templates also go through the pair
        stack one at a time at inference (:meth:`forward`)."""
        super().set_chunk_size(chunk_size)
        self.one_template_at_a_time = chunk_size is not None

    def use_pair_stack(self, runner: nn.Module | None) -> None:
        """Run the template pair stack through ``runner(v, t_pair_mask)`` (e.g. an AutoChunk
        wrapper of :class:`TemplatePairStack`); None: the blocks through :meth:`run`."""
        self.__dict__["_pair_stack"] = runner

    def _template_sum(self, feats: dict[str, torch.Tensor], v_z: torch.Tensor,
                      pair_mask: torch.Tensor, t_mask: torch.Tensor) -> torch.Tensor:
        """``sum_t mask_t LayerNorm(PairStack(v_z + linear_a(a_t)))`` over the templates of
        ``feats`` (``[*, T, ...]``), ``v_z [*, 1, N, N, c_t]`` -> ``[*, N, N, c_t]``."""
        cfg = self.cfg
        # Distances, frames and unit vectors from the template coordinates in >= fp32 with
        # autocast off (bf16 coordinates would move distances across the 1.25 A bins); the
        # features then go to the network in its dtype.
        dtype = torch.promote_types(v_z.dtype, torch.float32)
        with torch.autocast(v_z.device.type, enabled=False):
            a = template_pair_features(
                feats["template_restype"], feats["template_pseudo_beta"].to(dtype),
                feats["template_pseudo_beta_mask"].to(dtype),
                feats["template_backbone"].to(dtype), feats["template_backbone_mask"].to(dtype),
                feats["asym_id"], cfg.distogram_min_bin, cfg.distogram_max_bin,
                cfg.distogram_no_bins,
            ).to(v_z.dtype)  # [*, T, N, N, C_a]
        v = v_z + self.linear_a(a)  # [*, T, N, N, c_t]
        del a
        t_pair_mask = pair_mask.unsqueeze(-3).expand(v.shape[:-1])  # [*, T, N, N]
        if self._pair_stack is not None:
            v = self._pair_stack(v, t_pair_mask)
        else:  # split over N_i: [*, T, N/P, N, c_t]
            (v,) = self.run((v,), (t_pair_mask,), split=(True,))
        return (self.layer_norm_v(v) * t_mask[..., None, None, None]).sum(-4)

    def forward(
        self, feats: dict[str, torch.Tensor], z: torch.Tensor, pair_mask: torch.Tensor
    ) -> torch.Tensor:
        t_mask = feats["template_mask"].to(z.dtype)  # [*, T]
        inference = not self.training and not torch.is_grad_enabled()
        present = slots_present("template_mask", t_mask) if inference else None
        if present is not None and not any(present):
            # Inference, no template present: u = 0 and the output linear has no bias, so the
            # update is exactly 0 (a zero view: no [N, N, C_z] buffer).
            return z.new_zeros(()).expand(z.shape)
        v_z = self.linear_z(self.layer_norm_z(z)).unsqueeze(-4)  # [*, 1, N, N, c_t]
        n_templ = t_mask.shape[-1]
        if self.one_template_at_a_time and inference and n_templ > 1:
            # One template at a time, as AF3's code sums them in a loop: the features and the
            # pair stack's intermediates exist for one template (the same sum; a template that
            # is absent in every batch entry adds 0 and is skipped).
            templ_dim = t_mask.dim() - 1
            u = None
            for k in range(n_templ):
                if not slot_filled(present, k):
                    continue
                one = {name: (f.narrow(templ_dim, k, 1) if name.startswith("template_") else f)
                       for name, f in feats.items()}
                u_k = self._template_sum(one, v_z, pair_mask, t_mask.narrow(-1, k, 1))
                u = u_k if u is None else u.add_(u_k)
            assert u is not None  # a present template (all absent returned above)
        else:
            u = self._template_sum(feats, v_z, pair_mask, t_mask)  # [*, N, N, c_t]
        # / (1e-7 + T) as AF3's code (and Protenix's), there over all T template slots given; here
        # over the real ones (u is 0 without any)
        u = u / (1e-7 + t_mask.sum(-1))[..., None, None, None]
        return self.linear_out(torch.relu(u))


class TemplatePairStack(BlockStack):
    """The pair stack of a :class:`TemplateEmbedder` (its blocks, shared) as a module of tensors
    alone, ``forward(v [*, T, N, N, c_t], t_pair_mask [*, T, N, N]) -> v``: what torch.fx and
    AutoChunk need (the embedder's own forward reads a feature dict and runs part of its work
    with autocast off)."""

    def __init__(self, embedder: TemplateEmbedder) -> None:
        super().__init__(embedder.comm)
        self.blocks = embedder.blocks

    def forward(self, v: torch.Tensor, t_pair_mask: torch.Tensor) -> torch.Tensor:
        (v,) = self.run((v,), (t_pair_mask,), split=(True,))
        return v
