"""AF2 structure module (supplement 1.8, Algorithms 20-24).

Invariant point attention (Alg. 22), the quaternion backbone update (Alg. 23), the torsion-angle
ResNet and the per-layer frames -> atom14 reconstruction (Alg. 24). Runs in float32 even under
autocast: rotations composed over 8 layers in bf16 drift off SO(3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fold_model import ops
from fold_model.primitives import LayerNorm

from .all_atom import (
    atom14_to_atom37,
    atom37_mask,
    frames_to_atom14_positions,
    torsion_angles_to_frames,
)
from .rigid import Rigid

__all__ = [
    "StructureModuleConfig",
    "InvariantPointAttention",
    "BackboneUpdate",
    "AngleResnet",
    "StructureModuleTransition",
    "StructureModule",
]


@dataclass
class StructureModuleConfig:
    """Structure-module hyper-parameters; defaults from the AF2 supplement 1.8, Alg. 20-22."""

    c_ipa: int = 16  # per-head hidden size of IPA's scalar queries/keys/values
    c_resnet: int = 128  # hidden size of the torsion-angle ResNet (Alg. 20 lines 11-14)
    no_heads_ipa: int = 12
    no_qk_points: int = 4
    no_v_points: int = 8
    dropout_rate: float = 0.1
    no_blocks: int = 8  # N_layer; the weights are shared between the 8 iterations
    no_transition_layers: int = 1  # blocks of Linear-ReLU-Linear-ReLU-Linear (Alg. 20 line 8)
    no_resnet_blocks: int = 2
    no_angles: int = 7  # omega, phi, psi, chi1-4
    trans_scale_factor: float = 10.0  # nm -> Angstrom (the supplement's position scale)
    epsilon: float = 1e-8
    inf: float = 1e5


def _final_init(linear: nn.Linear) -> nn.Linear:
    # AF2 'final' initialisation: the layer starts as zero so each residual update starts at 0.
    nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


def _zero_bias(linear: nn.Linear) -> nn.Linear:
    # AF2's Linear starts its bias at 0
    nn.init.zeros_(linear.bias)
    return linear


def _relu_init(linear: nn.Linear) -> nn.Linear:
    nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


class InvariantPointAttention(nn.Module):
    """Invariant point attention (Alg. 22).

    Attention logits mix scalar query-key products, the pair bias and the distances between
    query and key points placed in the global frame; outputs are scalar values, value points
    brought back into each residue's local frame (with their norms) and the attended pair
    representation. The output is invariant to a global rigid motion of the frames.

    The projections follow AF2's code (``folding.py``), so its parameters load as they are:
    every linear layer has a bias (the supplement writes LinearNoBias; AF2's ``Linear`` has
    one); k and v come from one projection (``kv_scalar``: per head ``[c_qk | c_v]``); the
    points are laid out as x, y, z blocks of ``[H, P]`` (``q_point_local``, ``kv_point_local``
    with per head ``[P_qk | P_v]``); the output concatenates scalars, the x, y, z blocks of the
    value points, their norms and the attended pair, as ``output_projection`` expects.
    """

    def __init__(
        self,
        c_s: int,
        c_z: int,
        c_ipa: int = 16,
        no_heads: int = 12,
        no_qk_points: int = 4,
        no_v_points: int = 8,
        inf: float = 1e5,
        eps: float = 1e-8,
    ) -> None:
        super().__init__()
        self.c_ipa, self.no_heads = c_ipa, no_heads
        self.no_qk_points, self.no_v_points = no_qk_points, no_v_points
        self.inf, self.eps = inf, eps
        h = no_heads
        self.linear_q = _zero_bias(nn.Linear(c_s, h * c_ipa))
        self.linear_kv = _zero_bias(nn.Linear(c_s, h * 2 * c_ipa))
        self.linear_q_points = _zero_bias(nn.Linear(c_s, 3 * h * no_qk_points))
        self.linear_kv_points = _zero_bias(nn.Linear(c_s, 3 * h * (no_qk_points + no_v_points)))
        self.linear_b = _zero_bias(nn.Linear(c_z, h))
        # gamma^h = softplus(head_weights), initialised to 1 (softplus^-1(1) = log(e - 1)).
        self.head_weights = nn.Parameter(torch.full((h,), math.log(math.e - 1.0)))
        c_cat = h * (c_ipa + no_v_points * 4 + c_z)
        self.linear_out = _final_init(nn.Linear(c_cat, c_s))

    def _points(self, linear: nn.Linear, s: torch.Tensor, n_points: int) -> torch.Tensor:
        """AF2's point layout ``[*, N, 3 * H * P]`` (x, y, z blocks) -> ``[*, N, H, P, 3]``."""
        return linear(s).unflatten(-1, (3, self.no_heads, n_points)).movedim(-3, -1)

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, rigid: Rigid, mask: torch.Tensor
    ) -> torch.Tensor:
        """s ``[*, N, c_s]``, z ``[*, N, N, c_z]``, rigid ``[*, N]`` (nm units), mask ``[*, N]``.

        Returns the update for s, ``[*, N, c_s]``.
        """
        h, c = self.no_heads, self.c_ipa
        p_qk, p_v = self.no_qk_points, self.no_v_points
        batch = s.shape[:-1]  # (*, N)
        q = self.linear_q(s).view(*batch, h, c)  # [*, N, H, C]
        k, v = self.linear_kv(s).view(*batch, h, 2 * c).split(c, dim=-1)

        # Points in the local frames, moved to the global frame: [*, N, H, P, 3].
        frames = rigid.unsqueeze(-1).unsqueeze(-1)  # [*, N, 1, 1]
        q_pts = frames.apply(self._points(self.linear_q_points, s, p_qk))
        kv_pts = frames.apply(self._points(self.linear_kv_points, s, p_qk + p_v))
        k_pts, v_pts = kv_pts.split([p_qk, p_v], dim=-2)

        w_c = math.sqrt(2.0 / (9.0 * p_qk))
        w_l = math.sqrt(1.0 / 3.0)
        gamma = F.softplus(self.head_weights)  # [H]

        # Scalar term and pair bias: [*, H, N_i, N_j].
        logits = torch.einsum("...ihc,...jhc->...hij", q, k) * (c**-0.5)
        logits = logits + self.linear_b(z).movedim(-1, -3)
        # sum_p |q_ip - k_jp|^2 = |q|^2 + |k|^2 - 2 q.k, summed over points: no [N, N, P, 3].
        q_flat = q_pts.reshape(*batch, h, p_qk * 3)  # [*, N, H, P*3]
        k_flat = k_pts.reshape(*batch, h, p_qk * 3)
        sq_dist = (
            (q_flat * q_flat).sum(-1).movedim(-2, -1)[..., :, :, None]  # [*, H, N_i, 1]
            + (k_flat * k_flat).sum(-1).movedim(-2, -1)[..., :, None, :]  # [*, H, 1, N_j]
            - 2.0 * torch.einsum("...ihx,...jhx->...hij", q_flat, k_flat)
        )
        logits = logits - (gamma * (w_c / 2.0))[:, None, None] * sq_dist
        logits = w_l * logits
        pair_mask = mask[..., :, None] * mask[..., None, :]  # [*, N_i, N_j]
        # Masked softmax through the op registry (fold-kernels' fused softmax on GPU).
        attn = ops.softmax_mask_bias(logits, mask=pair_mask[..., None, :, :])  # [*, H, N_i, N_j]

        o = torch.einsum("...hij,...jhc->...ihc", attn, v).reshape(*batch, h * c)
        o_pts_global = torch.einsum("...hij,...jhpx->...ihpx", attn, v_pts)  # [*, N, H, P_v, 3]
        o_pts = frames.invert_apply(o_pts_global)
        o_pts_norm = torch.sqrt(torch.sum(o_pts * o_pts, dim=-1) + self.eps)  # [*, N, H, P_v]
        o_pair = torch.einsum("...hij,...ijc->...ihc", attn, z)  # [*, N, H, c_z]

        cat = torch.cat(
            [
                o,
                o_pts.movedim(-1, -3).reshape(*batch, 3 * h * p_v),  # x, y, z blocks of [H, P_v]
                o_pts_norm.reshape(*batch, h * p_v),
                o_pair.reshape(*batch, -1),
            ],
            dim=-1,
        )
        return self.linear_out(cat)


class BackboneUpdate(nn.Module):
    """Backbone update (Alg. 23): ``s -> (b, c, d, t)``, quaternion ``(1, b, c, d)`` normalised."""

    def __init__(self, c_s: int) -> None:
        super().__init__()
        self.linear = _final_init(nn.Linear(c_s, 6))

    def forward(self, s: torch.Tensor) -> Rigid:
        """s ``[*, N, c_s]`` -> the update ``Rigid [*, N]`` (translation in nm)."""
        update = self.linear(s)  # [*, N, 6]
        bcd, t = update[..., :3], update[..., 3:]
        quat = torch.cat([torch.ones_like(bcd[..., :1]), bcd], dim=-1)  # [*, N, 4]
        return Rigid.from_quat_and_trans(quat, t)


class AngleResnet(nn.Module):
    """Torsion angle prediction (Alg. 20 lines 11-14): a small ResNet on s and s_initial.

    As in the released AF2 network, both inputs pass a ReLU before their projection.
    Returns unnormalised and normalised ``[*, N, no_angles, 2]`` (sin, cos).
    """

    def __init__(
        self, c_s: int, c_resnet: int, no_blocks: int = 2, no_angles: int = 7, eps: float = 1e-8
    ) -> None:
        super().__init__()
        self.no_angles, self.eps = no_angles, eps
        self.linear_in = nn.Linear(c_s, c_resnet)
        self.linear_initial = nn.Linear(c_s, c_resnet)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.ReLU(), _relu_init(nn.Linear(c_resnet, c_resnet)),
                nn.ReLU(), _final_init(nn.Linear(c_resnet, c_resnet)),
            )
            for _ in range(no_blocks)
        )
        self.linear_out = nn.Linear(c_resnet, no_angles * 2)

    def forward(
        self, s: torch.Tensor, s_initial: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.linear_in(F.relu(s)) + self.linear_initial(F.relu(s_initial))  # [*, N, C]
        for block in self.blocks:
            a = a + block(a)
        unnormalized = self.linear_out(F.relu(a)).view(*a.shape[:-1], self.no_angles, 2)
        norm = torch.sqrt(torch.clamp(torch.sum(unnormalized**2, dim=-1, keepdim=True), self.eps))
        return unnormalized, unnormalized / norm


class StructureModuleTransition(nn.Module):
    """``s + Linear(relu(Linear(relu(Linear(s)))))`` then dropout and LayerNorm (Alg. 20 l. 8-9)."""

    def __init__(self, c_s: int, no_layers: int, dropout_rate: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(
                _relu_init(nn.Linear(c_s, c_s)), nn.ReLU(),
                _relu_init(nn.Linear(c_s, c_s)), nn.ReLU(),
                _final_init(nn.Linear(c_s, c_s)),
            )
            for _ in range(no_layers)
        )
        self.dropout = nn.Dropout(dropout_rate)
        self.layer_norm = LayerNorm(c_s)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            s = s + layer(s)
        return self.layer_norm(self.dropout(s))


class StructureModule(nn.Module):
    """The AF2 structure module (Alg. 20): 8 weight-shared layers of IPA + backbone update.

    ``forward`` returns (``L`` = ``no_blocks``, positions and frame translations in Angstrom):

    * ``frames`` ``[L, *, N, 4, 4]``: backbone frames of every layer (homogeneous matrices),
    * ``sidechain_frames`` ``[L, *, N, 8, 4, 4]``: the 8 rigid-group frames of every layer,
    * ``unnormalized_angles``, ``angles`` ``[L, *, N, 7, 2]``: (sin, cos) of omega, phi, psi,
      chi1-4, before and after normalisation,
    * ``positions`` ``[L, *, N, 14, 3]``: atom14 coordinates of every layer,
    * ``states`` ``[L, *, N, c_s]``: single representation after every layer,
    * ``single`` ``[*, N, c_s]``: the final single representation,
    * ``final_atom14_positions`` ``[*, N, 14, 3]``, ``final_atom_positions`` ``[*, N, 37, 3]``,
      ``final_atom_mask`` ``[*, N, 37]``, ``final_affine_tensor`` ``[*, N, 4, 4]``.

    All computation is float32 (float64 for float64 inputs, for tests) with autocast disabled.
    """

    def __init__(self, config: StructureModuleConfig, c_s: int, c_z: int) -> None:
        super().__init__()
        self.config = config
        self.layer_norm_s = LayerNorm(c_s)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_in = nn.Linear(c_s, c_s)
        self.ipa = InvariantPointAttention(
            c_s, c_z, config.c_ipa, config.no_heads_ipa, config.no_qk_points,
            config.no_v_points, inf=config.inf, eps=config.epsilon,
        )
        self.ipa_dropout = nn.Dropout(config.dropout_rate)
        self.layer_norm_ipa = LayerNorm(c_s)
        self.transition = StructureModuleTransition(
            c_s, config.no_transition_layers, config.dropout_rate
        )
        self.bb_update = BackboneUpdate(c_s)
        self.angle_resnet = AngleResnet(
            c_s, config.c_resnet, config.no_resnet_blocks, config.no_angles, config.epsilon
        )

    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        aatype: torch.Tensor,
        mask: torch.Tensor | None = None,
        initial_frames: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """s ``[*, N, c_s]``, z ``[*, N, N, c_z]``, aatype ``[*, N]`` long, mask ``[*, N]``.

        ``initial_frames`` ``[*, N, 4, 4]`` (Angstrom) replaces the identity start frames of
        Alg. 20 line 4 ("black hole" initialisation) when given.
        """
        with torch.autocast(device_type=s.device.type, enabled=False):
            dtype = s.dtype if s.dtype == torch.float64 else torch.float32
            if initial_frames is not None:
                initial_frames = initial_frames.to(dtype)
            return self._forward(s.to(dtype), z.to(dtype), aatype.long(), mask, initial_frames)

    def _forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        aatype: torch.Tensor,
        mask: torch.Tensor | None,
        initial_frames: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        cfg = self.config
        mask = torch.ones_like(s[..., 0]) if mask is None else mask.to(s.dtype)
        s_initial = self.layer_norm_s(s)
        z = self.layer_norm_z(z)
        s = self.linear_in(s_initial)
        if initial_frames is None:
            rigid = Rigid.identity(tuple(s.shape[:-1]), dtype=s.dtype, device=s.device)
        else:
            rigid = Rigid.from_tensor_4x4(initial_frames).scale_translation(
                1.0 / cfg.trans_scale_factor
            )

        per_layer: dict[str, list[torch.Tensor]] = {
            k: [] for k in
            ("frames", "sidechain_frames", "unnormalized_angles", "angles", "positions", "states")
        }
        for layer in range(cfg.no_blocks):
            s = s + self.ipa(s, z, rigid, mask)
            s = self.layer_norm_ipa(self.ipa_dropout(s))
            s = self.transition(s)
            rigid = rigid.compose(self.bb_update(s))
            unnormalized, angles = self.angle_resnet(s, s_initial)

            backbone = rigid.scale_translation(cfg.trans_scale_factor)  # nm -> Angstrom
            group_frames = torsion_angles_to_frames(backbone, angles, aatype)  # [*, N, 8]
            atom14 = frames_to_atom14_positions(group_frames, aatype)  # [*, N, 14, 3]

            per_layer["frames"].append(backbone.to_tensor_4x4())
            per_layer["sidechain_frames"].append(group_frames.to_tensor_4x4())
            per_layer["unnormalized_angles"].append(unnormalized)
            per_layer["angles"].append(angles)
            per_layer["positions"].append(atom14)
            per_layer["states"].append(s)
            if layer < cfg.no_blocks - 1:
                # Alg. 20 line 20: no gradient through the rotations into the next layer.
                rigid = rigid.stop_rot_gradient()

        out = {k: torch.stack(v, dim=0) for k, v in per_layer.items()}
        out["single"] = s
        out["final_atom14_positions"] = out["positions"][-1]
        out["final_atom_positions"] = atom14_to_atom37(out["positions"][-1], aatype)
        out["final_atom_mask"] = atom37_mask(aatype, s.dtype) * mask[..., None]
        out["final_affine_tensor"] = out["frames"][-1]
        return out
