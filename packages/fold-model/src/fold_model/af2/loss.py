"""AF2 training losses (supplement 1.9, Algorithms 26-29).

Every loss is a function named as in the supplement / OpenFold that returns one value per batch
element (``[*]``); :class:`AlphaFold2Loss` weights and sums them. Shapes: ``L`` structure-module
layers, ``N`` residues, ``S`` MSA cluster rows, ``*`` batch dims.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fold_model.geometry import Rigid

from .metrics import lddt

__all__ = [
    "LossConfig",
    "AlphaFold2Loss",
    "fape_loss",
    "backbone_loss",
    "sidechain_loss",
    "compute_renamed_ground_truth",
    "supervised_chi_loss",
    "distogram_loss",
    "masked_msa_loss",
    "lddt_loss",
    "experimentally_resolved_loss",
    "tm_loss",
    "between_residue_bond_loss",
    "between_residue_clash_loss",
    "within_residue_violations",
    "find_structural_violations",
    "violation_loss",
]


@dataclass
class LossConfig:
    """Loss weights and constants; defaults are the AF2 initial-training preset (1.9, Table 4).

    ``L = 0.5 L_FAPE + 0.5 L_aux + 0.3 L_dist + 2.0 L_msa + 0.01 L_conf``; fine-tuning adds
    ``0.01 L_exp_resolved + 1.0 L_viol`` (and optionally 0.1 L_pTM). ``L_aux`` is the mean over the
    structure-module layers of the backbone FAPE plus the torsion loss
    ``L_chi + 0.02 L_anglenorm`` (Alg. 27).
    """

    fape_weight: float = 0.5  # final-layer all-atom FAPE (side-chain frames included)
    aux_weight: float = 0.5  # layer-mean backbone FAPE + torsion loss
    distogram_weight: float = 0.3
    masked_msa_weight: float = 2.0
    plddt_weight: float = 0.01
    experimentally_resolved_weight: float = 0.0  # 0.01 in fine-tuning
    violation_weight: float = 0.0  # 1.0 in fine-tuning
    tm_weight: float = 0.0  # 0.1 in fine-tuning when the pTM head is on

    # FAPE (1.9.2, Alg. 28)
    fape_clamp_distance: float = 10.0
    fape_length_scale: float = 10.0
    fape_eps: float = 1e-4
    sidechain_clamp_distance: float = 10.0
    sidechain_length_scale: float = 10.0
    # Torsion loss (1.9.1, Alg. 27)
    chi_weight: float = 1.0
    angle_norm_weight: float = 0.02
    # Distogram (1.9.8)
    distogram_no_bins: int = 64
    distogram_min_bin: float = 2.3125
    distogram_max_bin: float = 21.6875
    # pLDDT (1.9.6): lDDT-Ca with 15 A inclusion radius, only on 0.1 <= resolution <= 3 A
    plddt_no_bins: int = 50
    plddt_cutoff: float = 15.0
    min_resolution: float = 0.1
    max_resolution: float = 3.0
    # Structural violations (1.9.11)
    violation_tolerance_factor: float = 12.0
    clash_overlap_tolerance: float = 1.5
    # pTM (1.9.7)
    tm_no_bins: int = 64
    tm_max_bin: float = 31.0
    eps: float = 1e-8

    @classmethod
    def initial_training(cls) -> LossConfig:
        """AF2 initial training (supplement 1.9, Table 4, 'initial training' row)."""
        return cls()

    @classmethod
    def finetuning(cls, ptm: bool = False) -> LossConfig:
        """AF2 fine-tuning: adds experimentally-resolved (0.01) and violation (1.0) terms."""
        return cls(
            experimentally_resolved_weight=0.01,
            violation_weight=1.0,
            tm_weight=0.1 if ptm else 0.0,
        )


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _masked_mean(value: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...], eps: float):
    mask = mask.expand_as(value)
    return torch.sum(value * mask, dim=dims) / (eps + torch.sum(mask, dim=dims))


def _resolution_filter(resolution: torch.Tensor, min_res: float, max_res: float) -> torch.Tensor:
    """1 for samples whose resolution lies in [min_res, max_res] (1.9.6, 1.9.10)."""
    return ((resolution >= min_res) & (resolution <= max_res)).to(resolution.dtype)


@functools.cache
def _constants_np() -> dict:
    import numpy as np
    from fold_data import residue_constants as rc

    return {
        "chi_pi_periodic": np.asarray(rc.chi_pi_periodic, dtype=np.float32),
        "atom14_vdw_radius": np.asarray(rc.restype_atom14_vdw_radius, dtype=np.float32),
        "proline": rc.restype_order["P"],
        "cysteine": rc.restype_order["C"],
        "cys_sg_slot": rc.restype_name_to_atom14_names["CYS"].index("SG"),
        "c_n_length": rc.between_res_bond_length_c_n,
        "c_n_stddev": rc.between_res_bond_length_stddev_c_n,
        "cos_ca_c_n": rc.between_res_cos_angles_ca_c_n,
        "cos_c_n_ca": rc.between_res_cos_angles_c_n_ca,
    }


_TENSOR_CACHE: dict[tuple, torch.Tensor] = {}


def _table(name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (name, str(device), dtype)
    if key not in _TENSOR_CACHE:
        table = torch.as_tensor(_constants_np()[name], dtype=dtype, device=device)
        if type(table) is not torch.Tensor:  # a FakeTensor (dry run): not for later calls
            return table
        _TENSOR_CACHE[key] = table
    return _TENSOR_CACHE[key]


def _dist_bounds(
    overlap_tolerance: float, tolerance_factor: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Within-residue atom14 pair bounds ``[21, 14, 14]`` (lower, upper) from the stereo table."""
    key = ("bounds", overlap_tolerance, tolerance_factor, str(device), dtype)
    if key not in _TENSOR_CACHE:
        from fold_data import residue_constants as rc

        lower, upper, _ = rc.make_atom14_dists_bounds(overlap_tolerance, tolerance_factor)
        bounds = torch.stack(
            [torch.as_tensor(lower, dtype=dtype), torch.as_tensor(upper, dtype=dtype)]
        ).to(device)
        if type(bounds) is not torch.Tensor:  # a FakeTensor (dry run): not for later calls
            return bounds[0], bounds[1]
        _TENSOR_CACHE[key] = bounds
    bounds = _TENSOR_CACHE[key]
    return bounds[0], bounds[1]


# ---------------------------------------------------------------------------------------------
# FAPE (1.9.2, Alg. 28) and ambiguous-atom renaming (1.9.3, Alg. 26)
# ---------------------------------------------------------------------------------------------


def fape_loss(
    pred_frames: Rigid,
    target_frames: Rigid,
    frames_mask: torch.Tensor,
    pred_positions: torch.Tensor,
    target_positions: torch.Tensor,
    positions_mask: torch.Tensor,
    length_scale: float = 10.0,
    clamp_distance: float | None = 10.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Frame aligned point error (Alg. 28) -> ``[*]``.

    Frames ``[*, F]`` with mask ``[*, F]``; positions ``[*, P, 3]`` with mask ``[*, P]``. Every
    position is expressed in every frame of the prediction and of the truth; the error is
    ``sqrt(|d|^2 + eps)``, clamped at ``clamp_distance`` (None: unclamped), divided by
    ``length_scale`` and averaged over the valid (frame, position) pairs.
    """
    local_pred = pred_frames.unsqueeze(-1).invert_apply(pred_positions[..., None, :, :])
    local_true = target_frames.unsqueeze(-1).invert_apply(target_positions[..., None, :, :])
    err = torch.sqrt(torch.sum((local_pred - local_true) ** 2, dim=-1) + eps)  # [*, F, P]
    if clamp_distance is not None:
        err = torch.clamp(err, max=clamp_distance)
    err = err / length_scale
    pair_mask = frames_mask[..., :, None] * positions_mask[..., None, :]
    # sum / (|frames| |positions|): both counts get their own epsilon, as in the supplement.
    total = torch.sum(err * pair_mask, dim=(-1, -2))
    return total / ((1e-8 + frames_mask.sum(-1)) * (1e-8 + positions_mask.sum(-1)))


def backbone_loss(
    backbone_rigid_tensor: torch.Tensor,
    backbone_rigid_mask: torch.Tensor,
    traj: torch.Tensor,
    use_clamped_fape: torch.Tensor | None = None,
    clamp_distance: float = 10.0,
    loss_unit_distance: float = 10.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Backbone FAPE of every structure-module layer, averaged over layers (Alg. 20 l. 17) -> [*].

    backbone_rigid_tensor ``[*, N, 4, 4]`` (truth), backbone_rigid_mask ``[*, N]``, traj
    ``[L, *, N, 4, 4]`` (predicted backbone frames of each layer); the positions are the frame
    origins (CA). ``use_clamped_fape`` ``[*]`` mixes clamped (1) and unclamped (0) FAPE (1.11.5).
    """
    pred = Rigid.from_tensor_4x4(traj)
    true = Rigid.from_tensor_4x4(backbone_rigid_tensor)[None]
    mask = backbone_rigid_mask[None]
    args = (pred, true, mask, pred.trans, true.trans, mask, loss_unit_distance)
    clamped = fape_loss(*args, clamp_distance=clamp_distance, eps=eps)  # [L, *]
    if use_clamped_fape is not None:
        unclamped = fape_loss(*args, clamp_distance=None, eps=eps)
        clamped = clamped * use_clamped_fape + unclamped * (1.0 - use_clamped_fape)
    return clamped.mean(0)


def compute_renamed_ground_truth(
    batch: dict[str, torch.Tensor], atom14_pred_positions: torch.Tensor, eps: float = 1e-10
) -> dict[str, torch.Tensor]:
    """Rename symmetric ground-truth atoms to match the prediction (Alg. 26).

    For each residue the ambiguous atoms (e.g. ASP OD1/OD2) are compared, by their distances
    to all non-ambiguous atoms, under the true and the swapped naming; the naming whose
    distances better agree with the prediction wins. atom14_pred_positions ``[*, N, 14, 3]``.
    Returns ``alt_naming_is_better`` ``[*, N]``, ``renamed_atom14_gt_positions`` ``[*, N, 14, 3]``
    and ``renamed_atom14_gt_exists`` ``[*, N, 14]``.
    """
    gt_pos = batch["atom14_gt_positions"]
    alt_pos = batch["atom14_alt_gt_positions"]
    gt_exists = batch["atom14_gt_exists"]
    ambiguous = batch["atom14_atom_is_ambiguous"]
    batch_shape = gt_pos.shape[:-3]

    def dists(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(*batch_shape, -1, 3)  # [*, N*14, 3]
        return torch.sqrt(eps + torch.sum((x[..., :, None, :] - x[..., None, :, :]) ** 2, -1))

    pred_d = dists(atom14_pred_positions)  # [*, N*14, N*14]
    gt_d, alt_d = dists(gt_pos), dists(alt_pos)
    err = torch.sqrt(eps + (pred_d - gt_d) ** 2)
    alt_err = torch.sqrt(eps + (pred_d - alt_d) ** 2)
    exists = gt_exists.reshape(*batch_shape, -1)
    amb = ambiguous.reshape(*batch_shape, -1)
    # ambiguous atom (rows) vs non-ambiguous atom (columns), both resolved
    mask = (exists * amb)[..., :, None] * (exists * (1.0 - amb))[..., None, :]
    n = gt_pos.shape[-3]
    per_res = torch.sum(mask * err, dim=-1).reshape(*batch_shape, n, 14).sum(-1)  # [*, N]
    alt_per_res = torch.sum(mask * alt_err, dim=-1).reshape(*batch_shape, n, 14).sum(-1)
    alt_better = (alt_per_res < per_res).to(gt_pos.dtype)  # [*, N]
    a = alt_better[..., None]
    return {
        "alt_naming_is_better": alt_better,
        "renamed_atom14_gt_positions": (1.0 - a[..., None]) * gt_pos + a[..., None] * alt_pos,
        "renamed_atom14_gt_exists": (1.0 - a) * gt_exists + a * batch["atom14_alt_gt_exists"],
    }


def sidechain_loss(
    sidechain_frames: torch.Tensor,
    sidechain_atom_pos: torch.Tensor,
    rigidgroups_gt_frames: torch.Tensor,
    rigidgroups_alt_gt_frames: torch.Tensor,
    rigidgroups_gt_exists: torch.Tensor,
    renamed_atom14_gt_positions: torch.Tensor,
    renamed_atom14_gt_exists: torch.Tensor,
    alt_naming_is_better: torch.Tensor,
    clamp_distance: float = 10.0,
    length_scale: float = 10.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """All-atom FAPE of the final layer over all 8 rigid groups and all atom14 atoms -> ``[*]``.

    sidechain_frames ``[*, N, 8, 4, 4]``, sidechain_atom_pos ``[*, N, 14, 3]`` (prediction);
    ground-truth frames are swapped to their alternative where ``alt_naming_is_better`` ``[*, N]``.
    """
    a = alt_naming_is_better[..., None, None, None]
    gt_frames = (1.0 - a) * rigidgroups_gt_frames + a * rigidgroups_alt_gt_frames
    batch_shape = sidechain_frames.shape[:-4]
    pred_f = Rigid.from_tensor_4x4(sidechain_frames.reshape(*batch_shape, -1, 4, 4))
    true_f = Rigid.from_tensor_4x4(gt_frames.reshape(*batch_shape, -1, 4, 4))
    return fape_loss(
        pred_f,
        true_f,
        rigidgroups_gt_exists.reshape(*batch_shape, -1),
        sidechain_atom_pos.reshape(*batch_shape, -1, 3),
        renamed_atom14_gt_positions.reshape(*batch_shape, -1, 3),
        renamed_atom14_gt_exists.reshape(*batch_shape, -1),
        length_scale=length_scale,
        clamp_distance=clamp_distance,
        eps=eps,
    )


# ---------------------------------------------------------------------------------------------
# torsion loss (1.9.1, Alg. 27)
# ---------------------------------------------------------------------------------------------


def supervised_chi_loss(
    angles_sin_cos: torch.Tensor,
    unnormalized_angles_sin_cos: torch.Tensor,
    aatype: torch.Tensor,
    seq_mask: torch.Tensor,
    chi_mask: torch.Tensor,
    chi_angles_sin_cos: torch.Tensor,
    chi_weight: float = 1.0,
    angle_norm_weight: float = 0.02,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Side-chain torsion loss plus angle-norm loss, averaged over layers -> ``[*]``.

    angles_sin_cos / unnormalized_angles_sin_cos ``[L, *, N, 7, 2]``; chi_angles_sin_cos
    ``[*, N, 4, 2]`` and chi_mask ``[*, N, 4]`` from the truth. The error of a chi is the squared
    distance of the (sin, cos) vectors, against the true angle or, for pi-periodic chis, the
    angle + pi, whichever is smaller. The norm loss pulls the unnormalised vectors to length 1.
    """
    pred = angles_sin_cos[..., 3:, :]  # [L, *, N, 4, 2]
    periodic = _table("chi_pi_periodic", aatype.device, pred.dtype)[aatype]  # [*, N, 4]
    true = chi_angles_sin_cos.to(pred.dtype)
    alt = true * (1.0 - 2.0 * periodic)[..., None]
    sq_err = torch.minimum(
        torch.sum((pred - true) ** 2, dim=-1), torch.sum((pred - alt) ** 2, dim=-1)
    )  # [L, *, N, 4]
    chi = _masked_mean(sq_err, chi_mask[None], (-1, -2), eps)  # [L, *]
    norm = torch.sqrt(torch.sum(unnormalized_angles_sin_cos**2, dim=-1) + eps)  # [L, *, N, 7]
    norm_err = torch.abs(norm - 1.0)
    norm_loss = _masked_mean(norm_err, seq_mask[None, ..., None], (-1, -2), eps)  # [L, *]
    return (chi_weight * chi + angle_norm_weight * norm_loss).mean(0)


# ---------------------------------------------------------------------------------------------
# distogram, masked MSA, confidence heads
# ---------------------------------------------------------------------------------------------


def distogram_loss(
    logits: torch.Tensor,
    pseudo_beta: torch.Tensor,
    pseudo_beta_mask: torch.Tensor,
    min_bin: float = 2.3125,
    max_bin: float = 21.6875,
    no_bins: int = 64,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Cross-entropy of the distogram against binned CB (CA for Gly) distances (1.9.8) -> [*].

    logits ``[*, N, N, no_bins]``; pseudo_beta ``[*, N, 3]``; pseudo_beta_mask ``[*, N]``.
    ``no_bins - 1`` equally spaced breaks from ``min_bin`` to ``max_bin``; the last bin catches
    everything beyond.
    """
    breaks = torch.linspace(min_bin, max_bin, no_bins - 1, dtype=logits.dtype, device=logits.device)
    sq_dist = torch.sum(
        (pseudo_beta[..., :, None, :] - pseudo_beta[..., None, :, :]) ** 2, dim=-1, keepdim=True
    )  # [*, N, N, 1]
    true_bins = torch.sum(sq_dist > breaks**2, dim=-1)  # [*, N, N]
    ce = -torch.sum(F.one_hot(true_bins, no_bins) * F.log_softmax(logits, dim=-1), dim=-1)
    pair_mask = pseudo_beta_mask[..., :, None] * pseudo_beta_mask[..., None, :]
    return _masked_mean(ce, pair_mask, (-1, -2), eps)


def masked_msa_loss(
    logits: torch.Tensor, true_msa: torch.Tensor, bert_mask: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """Cross-entropy on the BERT-masked MSA positions (1.9.9) -> ``[*]``.

    logits ``[*, S, N, 23]``, true_msa ``[*, S, N]`` (0-22), bert_mask ``[*, S, N]``.
    """
    ce = -torch.sum(
        F.one_hot(true_msa.long(), logits.shape[-1]) * F.log_softmax(logits, dim=-1), dim=-1
    )
    return _masked_mean(ce, bert_mask, (-1, -2), eps)


def lddt_loss(
    logits: torch.Tensor,
    all_atom_pred_pos: torch.Tensor,
    all_atom_positions: torch.Tensor,
    all_atom_mask: torch.Tensor,
    resolution: torch.Tensor,
    cutoff: float = 15.0,
    no_bins: int = 50,
    min_resolution: float = 0.1,
    max_resolution: float = 3.0,
    eps: float = 1e-10,
) -> torch.Tensor:
    """pLDDT loss (1.9.6, Alg. 29): cross-entropy against the binned true lDDT-Ca -> ``[*]``.

    logits ``[*, N, no_bins]``; atom37 prediction/truth ``[*, N, 37, 3]``, mask ``[*, N, 37]``;
    resolution ``[*]``. No gradient flows into the predicted structure.
    """
    ca = 1
    pred_ca = all_atom_pred_pos[..., ca, :].detach()
    true_ca = all_atom_positions[..., ca, :]
    mask = all_atom_mask[..., ca]
    score = lddt(pred_ca, true_ca, mask, cutoff=cutoff, eps=eps).detach()  # [*, N] in [0, 1]
    bins = torch.clamp(torch.floor(score * no_bins).long(), max=no_bins - 1)
    ce = -torch.sum(F.one_hot(bins, no_bins) * F.log_softmax(logits, dim=-1), dim=-1)  # [*, N]
    loss = _masked_mean(ce, mask, (-1,), eps)
    return loss * _resolution_filter(resolution, min_resolution, max_resolution)


def experimentally_resolved_loss(
    logits: torch.Tensor,
    atom37_atom_exists: torch.Tensor,
    all_atom_mask: torch.Tensor,
    resolution: torch.Tensor,
    min_resolution: float = 0.1,
    max_resolution: float = 3.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Sigmoid cross-entropy of per-atom 'resolved' logits ``[*, N, 37]`` (1.9.10) -> ``[*]``."""
    bce = F.binary_cross_entropy_with_logits(logits, all_atom_mask, reduction="none")
    loss = _masked_mean(bce, atom37_atom_exists, (-1, -2), eps)
    return loss * _resolution_filter(resolution, min_resolution, max_resolution)


def tm_loss(
    logits: torch.Tensor,
    final_affine_tensor: torch.Tensor,
    backbone_rigid_tensor: torch.Tensor,
    backbone_rigid_mask: torch.Tensor,
    resolution: torch.Tensor,
    max_bin: float = 31.0,
    no_bins: int = 64,
    min_resolution: float = 0.1,
    max_resolution: float = 3.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Aligned-error (pTM head) loss (1.9.7) -> ``[*]``.

    logits ``[*, N, N, no_bins]``; final_affine_tensor / backbone_rigid_tensor ``[*, N, 4, 4]``.
    The target for (i, j) is the distance between CA j expressed in frame i of the prediction
    and of the truth, binned with ``no_bins - 1`` breaks from 0 to ``max_bin``.
    """
    pred = Rigid.from_tensor_4x4(final_affine_tensor.detach())
    true = Rigid.from_tensor_4x4(backbone_rigid_tensor)
    local_pred = pred.unsqueeze(-1).invert_apply(pred.trans[..., None, :, :])  # [*, N, N, 3]
    local_true = true.unsqueeze(-1).invert_apply(true.trans[..., None, :, :])
    sq_err = torch.sum((local_pred - local_true) ** 2, dim=-1, keepdim=True)  # [*, N, N, 1]
    breaks = torch.linspace(0.0, max_bin, no_bins - 1, dtype=logits.dtype, device=logits.device)
    true_bins = torch.sum(sq_err > breaks**2, dim=-1)
    ce = -torch.sum(F.one_hot(true_bins, no_bins) * F.log_softmax(logits, dim=-1), dim=-1)
    pair_mask = backbone_rigid_mask[..., :, None] * backbone_rigid_mask[..., None, :]
    loss = _masked_mean(ce, pair_mask, (-1, -2), eps)
    return loss * _resolution_filter(resolution, min_resolution, max_resolution)


# ---------------------------------------------------------------------------------------------
# structural violations (1.9.11)
# ---------------------------------------------------------------------------------------------


def _norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.sqrt(eps + torch.sum(x * x, dim=-1))


def between_residue_bond_loss(
    pred_atom_positions: torch.Tensor,
    pred_atom_mask: torch.Tensor,
    residue_index: torch.Tensor,
    aatype: torch.Tensor,
    tolerance_factor_soft: float = 12.0,
    tolerance_factor_hard: float = 12.0,
    eps: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """Peptide-bond length C-N and angles CA-C-N, C-N-CA between consecutive residues.

    pred_atom_positions ``[*, N, 14, 3]`` (atom14: N, CA, C are slots 0, 1, 2), pred_atom_mask
    ``[*, N, 14]``, residue_index / aatype ``[*, N]``. A deviation from the literature value
    (Engh & Huber; proline has its own C-N length) costs only beyond
    ``tolerance_factor_soft`` standard deviations. Returns the three mean losses ``[*]``,
    ``per_residue_loss_sum`` ``[*, N]`` and ``per_residue_violation_mask`` ``[*, N]``.
    """
    c = _constants_np()
    this_ca, this_c = pred_atom_positions[..., :-1, 1, :], pred_atom_positions[..., :-1, 2, :]
    next_n, next_ca = pred_atom_positions[..., 1:, 0, :], pred_atom_positions[..., 1:, 1, :]
    this_ca_mask, this_c_mask = pred_atom_mask[..., :-1, 1], pred_atom_mask[..., :-1, 2]
    next_n_mask, next_ca_mask = pred_atom_mask[..., 1:, 0], pred_atom_mask[..., 1:, 1]
    no_gap = (residue_index[..., 1:] - residue_index[..., :-1] == 1).to(pred_atom_positions.dtype)

    # C(i)-N(i+1) length
    c_n_length = _norm(this_c - next_n, eps)  # [*, N-1]
    next_is_pro = (aatype[..., 1:] == c["proline"]).to(c_n_length.dtype)
    gt_length = (1 - next_is_pro) * c["c_n_length"][0] + next_is_pro * c["c_n_length"][1]
    gt_stddev = (1 - next_is_pro) * c["c_n_stddev"][0] + next_is_pro * c["c_n_stddev"][1]
    c_n_error = torch.sqrt(eps + (c_n_length - gt_length) ** 2)
    c_n_mask = this_c_mask * next_n_mask * no_gap
    c_n_loss_per = c_n_mask * F.relu(c_n_error - tolerance_factor_soft * gt_stddev)
    c_n_loss = torch.sum(c_n_mask * c_n_loss_per, -1) / (eps + torch.sum(c_n_mask, -1))
    c_n_violation = c_n_mask * (c_n_error > tolerance_factor_hard * gt_stddev)

    # angles through their cosines
    c_ca_unit = (this_ca - this_c) / _norm(this_ca - this_c, eps)[..., None]
    c_n_unit = (next_n - this_c) / c_n_length[..., None]
    n_ca_unit = (next_ca - next_n) / _norm(next_ca - next_n, eps)[..., None]

    def angle_term(cos: torch.Tensor, ref: tuple[float, float], mask: torch.Tensor):
        error = torch.sqrt(eps + (cos - ref[0]) ** 2)
        per = mask * F.relu(error - tolerance_factor_soft * ref[1])
        mean = torch.sum(mask * per, -1) / (eps + torch.sum(mask, -1))
        return per, mean, mask * (error > tolerance_factor_hard * ref[1])

    ca_c_n_per, ca_c_n_loss, ca_c_n_violation = angle_term(
        torch.sum(c_ca_unit * c_n_unit, -1), c["cos_ca_c_n"],
        this_ca_mask * this_c_mask * next_n_mask * no_gap,
    )
    c_n_ca_per, c_n_ca_loss, c_n_ca_violation = angle_term(
        torch.sum(-c_n_unit * n_ca_unit, -1), c["cos_c_n_ca"],
        this_c_mask * next_n_mask * next_ca_mask * no_gap,
    )

    # A bond's loss and violation count for both residues it joins.
    per_bond = c_n_loss_per + ca_c_n_per + c_n_ca_per  # [*, N-1]
    per_residue_loss_sum = F.pad(per_bond, (0, 1)) + F.pad(per_bond, (1, 0))
    violation = torch.amax(torch.stack([c_n_violation, ca_c_n_violation, c_n_ca_violation]), 0)
    per_residue_violation = torch.maximum(F.pad(violation, (0, 1)), F.pad(violation, (1, 0)))
    return {
        "c_n_loss_mean": c_n_loss,
        "ca_c_n_loss_mean": ca_c_n_loss,
        "c_n_ca_loss_mean": c_n_ca_loss,
        "per_residue_loss_sum": per_residue_loss_sum,
        "per_residue_violation_mask": per_residue_violation,
    }


def between_residue_clash_loss(
    atom14_pred_positions: torch.Tensor,
    atom14_atom_exists: torch.Tensor,
    atom14_atom_radius: torch.Tensor,
    residue_index: torch.Tensor,
    aatype: torch.Tensor,
    overlap_tolerance_soft: float = 1.5,
    overlap_tolerance_hard: float = 1.5,
    eps: float = 1e-10,
) -> dict[str, torch.Tensor]:
    """Steric clashes between atoms of different residues (1.9.11).

    A pair clashes when closer than the sum of van der Waals radii minus the tolerance; the
    peptide C-N bond and CYS SG-SG disulfides are exempt. AF2's code exempts atom14 slot 5
    pairs of any two residues (its disulfide mask does not look at the residue types); fold
    exempts only the cysteine pairs the supplement describes, so a clash between, e.g., two
    leucine CG atoms is penalised (docs/violation_constants.md). Inputs ``[*, N, 14(, 3)]``,
    residue_index / aatype ``[*, N]``. Returns ``mean_loss`` ``[*]``, ``per_atom_loss_sum`` and
    ``per_atom_clash_mask`` ``[*, N, 14]``.
    """
    c = _constants_np()
    pos = atom14_pred_positions
    n = pos.shape[-3]
    # [*, N_i, N_j, 14_a, 14_b]
    dists = torch.sqrt(
        eps + torch.sum((pos[..., :, None, :, None, :] - pos[..., None, :, None, :, :]) ** 2, -1)
    )
    exists = atom14_atom_exists
    upper = torch.triu(torch.ones(n, n, dtype=pos.dtype, device=pos.device), diagonal=1)
    mask = exists[..., :, None, :, None] * exists[..., None, :, None, :] * upper[..., None, None]

    slot = torch.arange(14, device=pos.device)
    c_slot, n_slot = (slot == 2).to(pos.dtype), (slot == 0).to(pos.dtype)
    neighbour = (residue_index[..., :, None] + 1 == residue_index[..., None, :]).to(pos.dtype)
    c_n_bond = neighbour[..., None, None] * c_slot[:, None] * n_slot[None, :]
    is_cys = (aatype == c["cysteine"]).to(pos.dtype)
    sg = (slot == c["cys_sg_slot"]).to(pos.dtype)
    disulfide = (is_cys[..., :, None] * is_cys[..., None, :])[..., None, None] * (
        sg[:, None] * sg[None, :]
    )
    mask = mask * (1.0 - c_n_bond) * (1.0 - disulfide)

    radius = atom14_atom_radius
    lower = radius[..., :, None, :, None] + radius[..., None, :, None, :]
    errors = mask * F.relu(lower - overlap_tolerance_soft - dists)
    mean_loss = torch.sum(errors, dim=(-4, -3, -2, -1)) / (1e-6 + torch.sum(mask, (-4, -3, -2, -1)))
    per_atom_loss_sum = torch.sum(errors, dim=(-3, -1)) + torch.sum(errors, dim=(-4, -2))
    clash = mask * (dists < lower - overlap_tolerance_hard)
    per_atom_clash = torch.maximum(torch.amax(clash, dim=(-3, -1)), torch.amax(clash, dim=(-4, -2)))
    return {
        "mean_loss": mean_loss,
        "per_atom_loss_sum": per_atom_loss_sum,
        "per_atom_clash_mask": per_atom_clash,
    }


def within_residue_violations(
    atom14_pred_positions: torch.Tensor,
    atom14_atom_exists: torch.Tensor,
    atom14_dists_lower_bound: torch.Tensor,
    atom14_dists_upper_bound: torch.Tensor,
    tighten_bounds_for_loss: float = 0.0,
    eps: float = 1e-10,
) -> dict[str, torch.Tensor]:
    """Bond lengths, bond angles (as 1-3 distances) and clashes inside each residue (1.9.11).

    Positions ``[*, N, 14, 3]``, exists ``[*, N, 14]``, bounds ``[*, N, 14, 14]`` (from the
    stereochemistry table with the tolerance factor applied). Returns ``per_atom_loss_sum`` and
    ``per_atom_violations`` ``[*, N, 14]``.
    """
    pos = atom14_pred_positions
    eye = torch.eye(14, dtype=pos.dtype, device=pos.device)
    mask = (1.0 - eye) * atom14_atom_exists[..., :, None] * atom14_atom_exists[..., None, :]
    dists = torch.sqrt(eps + torch.sum((pos[..., :, None, :] - pos[..., None, :, :]) ** 2, -1))
    lower_err = F.relu(atom14_dists_lower_bound + tighten_bounds_for_loss - dists)
    upper_err = F.relu(dists - (atom14_dists_upper_bound - tighten_bounds_for_loss))
    loss = mask * (lower_err + upper_err)
    per_atom_loss_sum = torch.sum(loss, dim=-2) + torch.sum(loss, dim=-1)
    violations = mask * (
        (dists < atom14_dists_lower_bound) | (dists > atom14_dists_upper_bound)
    ).to(pos.dtype)
    per_atom_violations = torch.maximum(torch.amax(violations, -2), torch.amax(violations, -1))
    return {"per_atom_loss_sum": per_atom_loss_sum, "per_atom_violations": per_atom_violations}


def find_structural_violations(
    batch: dict[str, torch.Tensor],
    atom14_pred_positions: torch.Tensor,
    violation_tolerance_factor: float = 12.0,
    clash_overlap_tolerance: float = 1.5,
) -> dict[str, dict[str, torch.Tensor] | torch.Tensor]:
    """All violation terms of a predicted atom14 structure ``[*, N, 14, 3]`` (1.9.11).

    Reads ``aatype``, ``residue_index``, ``atom14_atom_exists`` (and ``seq_mask`` if present) from
    ``batch``. Returns the three term dicts under ``between_residues``, ``clashes``,
    ``within_residues`` and ``total_per_residue_violations_mask`` ``[*, N]``.
    """
    aatype = batch["aatype"].long()
    dtype, device = atom14_pred_positions.dtype, atom14_pred_positions.device
    exists = batch["atom14_atom_exists"].to(dtype)
    if "seq_mask" in batch:
        exists = exists * batch["seq_mask"].to(dtype)[..., None]
    bonds = between_residue_bond_loss(
        atom14_pred_positions, exists, batch["residue_index"], aatype,
        violation_tolerance_factor, violation_tolerance_factor,
    )
    radius = _table("atom14_vdw_radius", device, dtype)[aatype] * exists
    clashes = between_residue_clash_loss(
        atom14_pred_positions, exists, radius, batch["residue_index"], aatype,
        clash_overlap_tolerance, clash_overlap_tolerance,
    )
    lower, upper = _dist_bounds(clash_overlap_tolerance, violation_tolerance_factor, device, dtype)
    within = within_residue_violations(atom14_pred_positions, exists, lower[aatype], upper[aatype])
    per_residue = torch.amax(
        torch.stack([
            bonds["per_residue_violation_mask"],
            torch.amax(clashes["per_atom_clash_mask"], -1),
            torch.amax(within["per_atom_violations"], -1),
        ]),
        0,
    )
    return {
        "between_residues": bonds,
        "clashes": clashes,
        "within_residues": within,
        "total_per_residue_violations_mask": per_residue,
    }


def violation_loss(
    violations: dict, atom14_atom_exists: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``L_viol = L_bondlength + L_bondangle + L_clash`` (1.9.11, eq. 44-46) -> ``[*]``.

    Clash (between- and within-residue) losses are summed per atom and normalised by the number
    of atoms.
    """
    bonds, clashes, within = (
        violations["between_residues"], violations["clashes"], violations["within_residues"]
    )
    num_atoms = torch.sum(atom14_atom_exists, dim=(-1, -2))
    clash = torch.sum(
        clashes["per_atom_loss_sum"] + within["per_atom_loss_sum"], dim=(-1, -2)
    ) / (eps + num_atoms)
    return bonds["c_n_loss_mean"] + bonds["ca_c_n_loss_mean"] + bonds["c_n_ca_loss_mean"] + clash


# ---------------------------------------------------------------------------------------------
# the total
# ---------------------------------------------------------------------------------------------


class AlphaFold2Loss(nn.Module):
    """The AF2 training loss (1.9): weighted sum of the terms above, averaged over the batch.

    ``forward(outputs, batch) -> (loss, terms)``.

    * ``outputs``: the heads' logits (``distogram_logits``, ``masked_msa_logits``,
      ``lddt_logits``, ``experimentally_resolved_logits``, ``tm_logits`` with the pTM head),
      ``final_atom_positions`` ``[B, N, 37, 3]`` and ``sm``, the structure module's outputs.
    * ``batch``: the ground truth of the last recycling iteration (``fold_data.af2.schema``,
      ``SAMPLE_FEATURES`` without the recycling dim).
    * ``terms``: one scalar per unweighted term (``fape``, ``backbone_fape``,
      ``supervised_chi``, ``aux``, ``distogram``, ``masked_msa``, ``plddt``; with non-zero
      weight also ``experimentally_resolved``, ``violation``, ``tm``) and the total ``loss``.
      Terms with zero weight are not computed.
    """

    def __init__(self, config: LossConfig | None = None) -> None:
        super().__init__()
        self.config = config or LossConfig()

    def forward(
        self, outputs: dict, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.config
        sm = outputs["sm"]
        dtype = sm["frames"].dtype
        b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items()}
        atom14_pred = sm["positions"][-1]  # [B, N, 14, 3]
        terms: dict[str, torch.Tensor] = {}

        renamed = compute_renamed_ground_truth(b, atom14_pred)
        terms["fape"] = sidechain_loss(
            sm["sidechain_frames"][-1], atom14_pred,
            b["rigidgroups_gt_frames"], b["rigidgroups_alt_gt_frames"],
            b["rigidgroups_gt_exists"], renamed["renamed_atom14_gt_positions"],
            renamed["renamed_atom14_gt_exists"], renamed["alt_naming_is_better"],
            cfg.sidechain_clamp_distance, cfg.sidechain_length_scale, cfg.fape_eps,
        )
        terms["backbone_fape"] = backbone_loss(
            b["backbone_rigid_tensor"], b["backbone_rigid_mask"], sm["frames"],
            b.get("use_clamped_fape"), cfg.fape_clamp_distance, cfg.fape_length_scale,
            cfg.fape_eps,
        )
        terms["supervised_chi"] = supervised_chi_loss(
            sm["angles"], sm["unnormalized_angles"], b["aatype"].long(), b["seq_mask"],
            b["chi_mask"], b["chi_angles_sin_cos"], cfg.chi_weight, cfg.angle_norm_weight,
        )
        terms["aux"] = terms["backbone_fape"] + terms["supervised_chi"]
        terms["distogram"] = distogram_loss(
            outputs["distogram_logits"].to(dtype), b["pseudo_beta"], b["pseudo_beta_mask"],
            cfg.distogram_min_bin, cfg.distogram_max_bin, cfg.distogram_no_bins,
        )
        terms["masked_msa"] = masked_msa_loss(
            outputs["masked_msa_logits"].to(dtype), b["true_msa"], b["bert_mask"]
        )
        terms["plddt"] = lddt_loss(
            outputs["lddt_logits"].to(dtype), outputs["final_atom_positions"],
            b["all_atom_positions"], b["all_atom_mask"], b["resolution"], cfg.plddt_cutoff,
            cfg.plddt_no_bins, cfg.min_resolution, cfg.max_resolution,
        )
        weighted = (
            cfg.fape_weight * terms["fape"] + cfg.aux_weight * terms["aux"]
            + cfg.distogram_weight * terms["distogram"]
            + cfg.masked_msa_weight * terms["masked_msa"] + cfg.plddt_weight * terms["plddt"]
        )
        if cfg.experimentally_resolved_weight > 0:
            terms["experimentally_resolved"] = experimentally_resolved_loss(
                outputs["experimentally_resolved_logits"].to(dtype), b["atom37_atom_exists"],
                b["all_atom_mask"], b["resolution"], cfg.min_resolution, cfg.max_resolution,
            )
            weighted = weighted + cfg.experimentally_resolved_weight * terms[
                "experimentally_resolved"
            ]
        if cfg.violation_weight > 0:
            violations = find_structural_violations(
                b, atom14_pred, cfg.violation_tolerance_factor, cfg.clash_overlap_tolerance
            )
            exists = b["atom14_atom_exists"] * b["seq_mask"][..., None]
            terms["violation"] = violation_loss(violations, exists)
            weighted = weighted + cfg.violation_weight * terms["violation"]
        if cfg.tm_weight > 0 and "tm_logits" in outputs:
            terms["tm"] = tm_loss(
                outputs["tm_logits"].to(dtype), sm["frames"][-1], b["backbone_rigid_tensor"],
                b["backbone_rigid_mask"], b["resolution"], cfg.tm_max_bin, cfg.tm_no_bins,
                cfg.min_resolution, cfg.max_resolution,
            )
            weighted = weighted + cfg.tm_weight * terms["tm"]
        out = {k: v.mean() for k, v in terms.items()}
        out["loss"] = weighted.mean()
        return out["loss"], out
