"""AF2 embedders: input (Alg. 3) with relative positions (Alg. 4), recycling (Alg. 32), extra MSA
(Alg. 2 line 13) and template torsion angles (Alg. 2 line 7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fold_model.layers import LayerNorm, Linear

__all__ = [
    "InputEmbedder",
    "RecyclingEmbedder",
    "ExtraMsaEmbedder",
    "TemplateAngleEmbedder",
    "build_extra_msa_feat",
    "build_template_angle_feat",
    "distogram_one_hot",
]


def distogram_one_hot(
    x: torch.Tensor, min_bin: float, max_bin: float, no_bins: int, inf: float = 1e8
) -> torch.Tensor:
    """One-hot of pairwise distances ``[*, N, 3] -> [*, N, N, no_bins]``.

    Bin b holds ``lower_b < d < lower_{b+1}`` with ``lower = linspace(min_bin, max_bin)``; the
    last bin is open above; distances below ``min_bin`` fall in no bin (AF2 code / OpenFold).
    """
    lower = torch.linspace(min_bin, max_bin, no_bins, device=x.device, dtype=torch.float32) ** 2
    # the open last bin, made on the device (no host-to-device copy: CUDA-graph capturable)
    upper = torch.cat([lower[1:], torch.full_like(lower[:1], inf * inf)])
    d2 = (x[..., :, None, :].float() - x[..., None, :, :].float()).pow(2).sum(-1, keepdim=True)
    return ((d2 > lower) & (d2 < upper)).to(x.dtype)


class InputEmbedder(nn.Module):
    """Alg. 3 with Alg. 4 (relpos).

    ``target_feat: [*, N_res, 22]``, ``residue_index: [*, N_res]``,
    ``msa_feat: [*, N_clust, N_res, 49]`` -> ``m: [*, N_clust, N_res, C_m]``,
    ``z: [*, N_res, N_res, C_z]``.
    """

    def __init__(self, tf_dim: int, msa_dim: int, c_m: int, c_z: int, relpos_k: int) -> None:
        super().__init__()
        self.relpos_k = relpos_k
        self.linear_tf_z_i = Linear(tf_dim, c_z)
        self.linear_tf_z_j = Linear(tf_dim, c_z)
        self.linear_tf_m = Linear(tf_dim, c_m)
        self.linear_msa_m = Linear(msa_dim, c_m)
        self.linear_relpos = Linear(2 * relpos_k + 1, c_z)

    def relpos(self, residue_index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Alg. 4: one-hot of ``clip(r_i - r_j, -k, k)`` -> ``[*, N_res, N_res, C_z]``."""
        d = residue_index[..., :, None] - residue_index[..., None, :]  # [*, N_res, N_res]
        d = torch.clamp(d, -self.relpos_k, self.relpos_k) + self.relpos_k
        one_hot = F.one_hot(d.long(), 2 * self.relpos_k + 1).to(dtype)
        return self.linear_relpos(one_hot)

    def forward(
        self, target_feat: torch.Tensor, residue_index: torch.Tensor, msa_feat: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.linear_tf_z_i(target_feat)  # [*, N_res, C_z]
        b = self.linear_tf_z_j(target_feat)
        z = a[..., :, None, :] + b[..., None, :, :]  # [*, N_res, N_res, C_z]
        z = z + self.relpos(residue_index, z.dtype)
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat).unsqueeze(-3)
        return m, z


class RecyclingEmbedder(nn.Module):
    """Alg. 32: ``m_1 += LN(m_1_prev)``, ``z += LN(z_prev) + Linear(onehot(d(x_prev)))``.

    ``m_first: [*, N_res, C_m]``, ``z: [*, N_res, N_res, C_z]``, ``x: [*, N_res, 3]`` (pseudo-beta
    of the previous structure) -> the updates ``([*, N_res, C_m], [*, N_res, N_res, C_z])``.
    """

    def __init__(
        self, c_m: int, c_z: int, min_bin: float, max_bin: float, no_bins: int, inf: float
    ) -> None:
        super().__init__()
        self.min_bin, self.max_bin, self.no_bins, self.inf = min_bin, max_bin, no_bins, inf
        self.layer_norm_m = LayerNorm(c_m)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear = Linear(no_bins, c_z)

    def forward(
        self, m_first: torch.Tensor, z: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = distogram_one_hot(x, self.min_bin, self.max_bin, self.no_bins, self.inf)
        dz = self.layer_norm_z(z) + self.linear(d.to(z.dtype))
        return self.layer_norm_m(m_first), dz


def build_extra_msa_feat(
    extra_msa: torch.Tensor, has_deletion: torch.Tensor, deletion_value: torch.Tensor
) -> torch.Tensor:
    """``[*, N_extra, N_res]`` x3 -> ``[*, N_extra, N_res, 25]``: one-hot(23) + has_deletion +
    deletion_value (supplement 1.7.2)."""
    one_hot = F.one_hot(extra_msa.long(), 23).to(deletion_value.dtype)
    return torch.cat([one_hot, has_deletion[..., None], deletion_value[..., None]], dim=-1)


class ExtraMsaEmbedder(nn.Module):
    """Alg. 2 line 13: ``Linear(25 -> C_e)``."""

    def __init__(self, c_in: int, c_e: int) -> None:
        super().__init__()
        self.linear = Linear(c_in, c_e)

    def forward(self, extra_feat: torch.Tensor) -> torch.Tensor:
        return self.linear(extra_feat)


def build_template_angle_feat(
    template_aatype: torch.Tensor,
    torsion_sin_cos: torch.Tensor,
    alt_torsion_sin_cos: torch.Tensor,
    torsion_mask: torch.Tensor,
) -> torch.Tensor:
    """Template torsion features ``[*, N_templ, N_res, 57]`` (supplement Table 1):
    one-hot aatype (22), sin/cos of 7 torsions (14), alternative sin/cos (14), torsion mask (7)."""
    one_hot = F.one_hot(template_aatype.long(), 22).to(torsion_sin_cos.dtype)
    return torch.cat(
        [
            one_hot,
            torsion_sin_cos.flatten(-2),  # [*, N_templ, N_res, 14]
            alt_torsion_sin_cos.flatten(-2),
            torsion_mask,
        ],
        dim=-1,
    )


class TemplateAngleEmbedder(nn.Module):
    """Alg. 2 line 7: ``Linear(relu(Linear(f)))``, ``[*, N_templ, N_res, 57] -> [..., C_m]``."""

    def __init__(self, c_in: int, c_m: int) -> None:
        super().__init__()
        self.linear_1 = Linear(c_in, c_m, init="relu")
        self.linear_2 = Linear(c_m, c_m, init="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.relu(self.linear_1(x)))
