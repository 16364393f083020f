"""AF3 structure losses (supplement 4.1-4.2): the weighted MSE after weighted rigid alignment,
the bond loss, smooth lDDT, the distogram loss, and the diffusion loss that combines them with the
EDM weight of each sample's noise level; lDDT itself (the metric, and what smooth lDDT
approximates).

Shapes: ``B`` batch, ``S`` diffusion samples, ``A`` atoms, ``N`` tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from fold_model.af3.alignment import weighted_rigid_align
from fold_model.af3.pair_loss import (
    LDDT_THRESHOLDS,
    PairList,
    _compute_dtype,
    bond_pair_list,
    lddt_pair_list,
    lddt_sum,
    pair_capacity,
    pair_distances,
    smooth_lddt_sum,
)

__all__ = [
    "LossPairs",
    "loss_pair_lists",
    "atom_of_tokens",
    "diffusion_atom_weights",
    "weighted_mse_loss",
    "bond_loss",
    "bond_loss_dense",
    "lddt",
    "lddt_dense",
    "smooth_lddt_loss",
    "smooth_lddt_loss_dense",
    "distogram_loss",
    "diffusion_loss",
    "LDDT_THRESHOLDS",
]


def atom_of_tokens(token_values: torch.Tensor, atom_to_token: torch.Tensor) -> torch.Tensor:
    """Token values ``[B, N]`` broadcast to atoms ``[B, A]``."""
    return torch.gather(token_values, 1, atom_to_token.long())


def diffusion_atom_weights(feats: dict[str, torch.Tensor], cfg) -> torch.Tensor:
    """``w_l = 1 + alpha_dna is_dna + alpha_rna is_rna + alpha_ligand is_ligand`` (Eq. 4),
    ``[B, A]``."""
    tok = feats["atom_to_token"]
    w = 1.0 + cfg.alpha_dna * atom_of_tokens(feats["is_dna"], tok).float()
    w = w + cfg.alpha_rna * atom_of_tokens(feats["is_rna"], tok).float()
    return w + cfg.alpha_ligand * atom_of_tokens(feats["is_ligand"], tok).float()


def weighted_mse_loss(
    x_pred: torch.Tensor, x_gt: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Eq. 2-3: ``1/3 mean_l w_l |x_l - x_gt_aligned_l|^2`` with the ground truth superposed on
    each prediction (weighted, stop-gradient). ``x_pred, x_gt [B, S, A, 3]``, ``weights, mask
    [B, A]`` -> per sample ``[B, S]``."""
    w = (weights * mask).unsqueeze(1).expand(x_pred.shape[:-1])  # [B, S, A]
    aligned = weighted_rigid_align(x_gt, x_pred.detach(), w)
    sq = (x_pred - aligned).square().sum(-1)  # [B, S, A]
    m = mask.unsqueeze(1).to(sq.dtype)
    return (w * sq).sum(-1) / (3.0 * m.sum(-1).clamp_min(1.0))


def bond_loss(
    x_pred: torch.Tensor, x_gt: torch.Tensor, feats: dict[str, torch.Tensor],
    pairs: PairList | None = None,
) -> torch.Tensor:
    """Eq. 5: ``mean_(l, m) (|x_l - x_m| - |x_gt_l - x_gt_m|)^2`` over bonded pairs, per sample
    ``[B, S]``. The pairs are the centre atoms of the bonded token pairs (``token_bonds``: bonds
    with a one-atom ligand token, whose centre is the bonded atom itself), as a pair list
    (:func:`bond_pair_list`): ``[P, S]`` distances, no ``[N, N]`` per sample. Distances in fp32
    (fp64 for fp64 input)."""
    if pairs is None:
        pairs = bond_pair_list(feats, _compute_dtype(x_pred))
    err = (pair_distances(x_pred, pairs) - pair_distances(x_gt, pairs)).square()  # [P, S]
    num = torch.zeros(x_pred.shape[:2], dtype=err.dtype, device=err.device)
    num = num.index_add(0, pairs.batch, err * pairs.weight.to(err.dtype)[:, None])
    return num / pairs.count.to(err.dtype).clamp_min(1.0)[:, None]


def _cdist(x: torch.Tensor) -> torch.Tensor:
    """All-pairs distances ``[..., A, A]`` by differences (not ``|x|^2 + |y|^2 - 2 x.y``, whose
    cancellation errs by ~1e-6 A for coincident atoms even in fp64): the dense references."""
    return torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")


def bond_loss_dense(
    x_pred: torch.Tensor, x_gt: torch.Tensor, feats: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Reference for :func:`bond_loss`: the same loss with ``[B, S, N, N]`` ``cdist``."""
    center = feats["token_center_atom"].long()  # [B, N]
    idx = center[:, None, :, None].expand(-1, x_pred.shape[1], -1, 3)
    p = torch.gather(x_pred, 2, idx)  # [B, S, N, 3]
    g = torch.gather(x_gt, 2, idx)
    ok = feats["atom_resolved"].gather(1, center) * feats["token_mask"]  # [B, N]
    bonds = torch.triu(feats["token_bonds"], 1) * ok[:, :, None] * ok[:, None, :]  # [B, N, N]
    dp = _cdist(p)  # [B, S, N, N]
    dg = _cdist(g)
    err = (dp - dg).square() * bonds[:, None]
    return err.sum((-1, -2)) / bonds.sum((-1, -2)).clamp_min(1.0)[:, None]


def _lddt_pairs_dense(x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor):
    """Pairs scored by lDDT: ``l != m``, both real, ground-truth distance under 15 A (30 A when
    ``m`` is a nucleotide atom). Returns ``(d_gt [B, S, A, A], c [B, S, A, A])``."""
    d_gt = _cdist(x_gt)
    radius = torch.where(is_nucleotide.bool(), 30.0, 15.0).to(d_gt.dtype)  # [B, A]
    c = (d_gt < radius[:, None, None, :]).to(d_gt.dtype)
    pair = mask[:, :, None] * mask[:, None, :]
    eye = torch.eye(mask.shape[-1], dtype=d_gt.dtype, device=d_gt.device)
    return d_gt, c * (pair * (1 - eye)).unsqueeze(1).to(d_gt.dtype)


def _pairs_of(x_gt, is_nucleotide, mask, pairs):
    if pairs is None:
        pairs = lddt_pair_list(x_gt[:, 0], is_nucleotide, mask)
    return pairs


def lddt(
    x_pred: torch.Tensor, x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor,
    pairs: PairList | None = None,
) -> torch.Tensor:
    """All-atom lDDT (fraction of preserved distances at 0.5, 1, 2, 4 A), per sample ``[B, S]``.
    ``x_pred [B, S, A, 3]``, ``x_gt [B, S or 1, A, 3]``, ``is_nucleotide, mask [B, A]``. Over the
    pair list of :func:`lddt_pair_list` (built from ``x_gt[:, 0]`` unless given)."""
    pairs = _pairs_of(x_gt, is_nucleotide, mask, pairs)
    num = lddt_sum(x_pred, x_gt, pairs)
    return num / pairs.count.to(num.dtype).clamp_min(1e-8)[:, None]


def lddt_dense(
    x_pred: torch.Tensor, x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Reference for :func:`lddt` over dense ``[B, S, A, A]`` distances."""
    d_gt, c = _lddt_pairs_dense(x_gt, is_nucleotide, mask)
    err = (_cdist(x_pred) - d_gt).abs()
    score = sum((err < t).to(err.dtype) for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    return (c * score).sum((-1, -2)) / c.sum((-1, -2)).clamp_min(1e-8)


def smooth_lddt_loss(
    x_pred: torch.Tensor, x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor,
    sharpness: float = 1.0, pairs: PairList | None = None, chunk_elements: int | None = None,
) -> torch.Tensor:
    """Alg. 27: ``1 - lDDT`` with each step ``|d - d_gt| < t`` replaced by
    ``sigmoid(k (t - |d - d_gt|))`` (AF3: ``k = 1``; ``k -> inf`` gives lDDT). Per sample
    ``[B, S]``; ``x_pred [B, S, A, 3]``, ``x_gt [B, S or 1, A, 3]`` (no gradient), ``is_nucleotide,
    mask [B, A]``. Over the pair list of :func:`lddt_pair_list` (from ``x_gt[:, 0]`` unless
    given), chunked and recomputed in backward: saves ``O(B S A 3 + P)``, never ``[S, A, A]``."""
    pairs = _pairs_of(x_gt, is_nucleotide, mask, pairs)
    num = smooth_lddt_sum(x_pred, x_gt, pairs, sharpness, chunk_elements)
    return 1.0 - num / pairs.count.to(num.dtype).clamp_min(1e-8)[:, None]


def smooth_lddt_loss_dense(
    x_pred: torch.Tensor, x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor,
    sharpness: float = 1.0,
) -> torch.Tensor:
    """Reference for :func:`smooth_lddt_loss` over dense ``[B, S, A, A]`` distances (autograd
    keeps several ``[B, S, A, A]`` tensors: 4 GiB each in fp32 at A = 4608, S = 48)."""
    d_gt, c = _lddt_pairs_dense(x_gt, is_nucleotide, mask)
    diff = (_cdist(x_pred) - d_gt).abs()
    eps = sum(torch.sigmoid(sharpness * (t - diff)) for t in LDDT_THRESHOLDS) / 4.0
    return 1.0 - (c * eps).sum((-1, -2)) / c.sum((-1, -2)).clamp_min(1e-8)


def distogram_loss(
    logits: torch.Tensor, feats: dict[str, torch.Tensor], min_bin: float = 2.0,
    max_bin: float = 22.0,
) -> torch.Tensor:
    """Cross-entropy of the distogram head ``[B, N, N, no_bins]`` against the binned ground-truth
    distances of the tokens' representative atoms (section 4.4: ``token_pseudo_beta_atom``, CB,
    CA for glycine, C4 / C2 for purines / pyrimidines, the atom of a one-atom token), mean over
    token pairs whose representative atoms are resolved ``[B]``."""
    rep = feats["token_pseudo_beta_atom"].long()  # [B, N]
    pos = torch.gather(feats["atom_positions"], 1, rep[..., None].expand(-1, -1, 3))
    ok = feats["atom_resolved"].gather(1, rep) * feats["token_mask"]  # [B, N]
    no_bins = logits.shape[-1]
    edges = torch.linspace(min_bin, max_bin, no_bins - 1, device=logits.device)
    target = torch.bucketize(torch.cdist(pos.float(), pos.float()), edges)  # [B, N, N]
    ce = nn.functional.cross_entropy(logits.float().movedim(-1, 1), target, reduction="none")
    pair = ok[:, :, None] * ok[:, None, :]
    return (ce * pair).sum((-1, -2)) / pair.sum((-1, -2)).clamp_min(1.0)


class LossPairs(NamedTuple):
    """The atom pairs of the diffusion loss's smooth lDDT (``lddt``) and bond (``bond``; None
    when the bond loss is off) terms: functions of the ground truth alone, so they can be built
    before the step (:func:`loss_pair_lists`), e.g. outside a captured CUDA graph."""

    lddt: PairList
    bond: PairList | None

    def padded(self, lddt_capacity: int, bond_capacity: int | None = None) -> LossPairs:
        """Both lists at fixed lengths (:meth:`PairList.padded`)."""
        bond = self.bond
        if bond is not None:
            bond = bond.padded(bond_capacity if bond_capacity is not None else bond.n_pairs)
        return LossPairs(self.lddt.padded(lddt_capacity), bond)

    def capacities(self, headroom: float = 1.25) -> tuple[int, int | None]:
        """:func:`pair_capacity` of each list."""
        return (pair_capacity(self.lddt.n_pairs, headroom),
                None if self.bond is None else pair_capacity(self.bond.n_pairs, headroom, 256))

    def tensors(self, prefix: str = "pairs") -> dict[str, torch.Tensor]:
        """The lists as a flat dict (``{prefix}/lddt/batch`` ...), e.g. static graph inputs."""
        out = {f"{prefix}/lddt/{k}": v for k, v in self.lddt._asdict().items()}
        if self.bond is not None:
            out.update({f"{prefix}/bond/{k}": v for k, v in self.bond._asdict().items()})
        return out

    @classmethod
    def from_tensors(cls, d: dict[str, torch.Tensor], prefix: str = "pairs") -> LossPairs:
        """Inverse of :meth:`tensors`."""
        def one(name: str) -> PairList | None:
            keys = [f"{prefix}/{name}/{k}" for k in PairList._fields]
            return PairList(*(d[k] for k in keys)) if keys[0] in d else None

        lddt = one("lddt")
        if lddt is None:
            raise KeyError(f"no {prefix}/lddt/* tensors in {sorted(d)}")
        return cls(lddt, one("bond"))

    @classmethod
    def split(cls, d: dict[str, torch.Tensor], prefix: str = "pairs"
              ) -> tuple[dict[str, torch.Tensor], LossPairs | None]:
        """``d`` without the :meth:`tensors` entries, and the lists they hold (None if none)."""
        rest = {k: v for k, v in d.items() if not k.startswith(prefix + "/")}
        return rest, (cls.from_tensors(d, prefix) if len(rest) < len(d) else None)


def _lddt_inputs(feats: dict[str, torch.Tensor], dtype: torch.dtype):
    """Ground truth ``[B, 1, A, 3]`` in ``dtype``, nucleotide atoms and scored atoms ``[B, A]``."""
    mask = feats["atom_mask"] * feats["atom_resolved"]  # [B, A]
    tok = feats["atom_to_token"]
    nucleotide = (atom_of_tokens(feats["is_dna"], tok) + atom_of_tokens(feats["is_rna"], tok)) > 0
    return feats["atom_positions"].to(dtype)[:, None], nucleotide, mask


def loss_pair_lists(feats: dict[str, torch.Tensor], cfg, dtype: torch.dtype = torch.float32
                    ) -> LossPairs:
    """The pair lists :func:`diffusion_loss` builds from ``feats`` (loss config ``cfg``; the
    bond list only when ``cfg.bond_weight > 0``), for passing in as ``pairs``. ``dtype``: the
    coordinates' (fp32, or fp64 in fp64 runs)."""
    x_ref, nucleotide, mask = _lddt_inputs(feats, dtype)
    lddt_pairs = lddt_pair_list(x_ref[:, 0], nucleotide, mask)
    bond = bond_pair_list(feats, dtype) if cfg.bond_weight > 0 else None
    return LossPairs(lddt_pairs, bond)


def diffusion_loss(
    x_denoised: torch.Tensor,
    x_gt_aug: torch.Tensor,
    sigma: torch.Tensor,
    feats: dict[str, torch.Tensor],
    cfg,
    sigma_data: float,
    pairs: LossPairs | None = None,
) -> dict[str, torch.Tensor]:
    """Eq. 6: ``EDM weight(sigma) (L_MSE + alpha_bond L_bond) + L_smooth_lddt``, mean over the
    samples and the batch. The EDM weight is ``(sigma^2 + sigma_data^2) / (sigma sigma_data)^2``
    (Karras et al. 2022; the supplement's printed denominator ``(sigma + sigma_data)^2`` is taken as
    a typo). ``x_denoised, x_gt_aug [B, S, A, 3]``, ``sigma [B, S]``.

    The bond and smooth lDDT terms only need ground-truth distances, which the rigid augmentation
    leaves unchanged: they take them from ``feats["atom_positions"]`` in fp32 (one copy, sparse
    pair lists), not from the ``S`` augmented copies (which are fp32 too, also under autocast:
    :mod:`fold_model.af3.diffusion`).

    ``pairs``: the pair lists of :func:`loss_pair_lists` (built here when None; given, e.g.
    padded to a fixed length, the loss has no data-dependent shapes and no host sync)."""
    x_ref, nucleotide, mask = _lddt_inputs(feats, _compute_dtype(x_denoised))
    weights = diffusion_atom_weights(feats, cfg).to(x_denoised.dtype)
    mse = weighted_mse_loss(x_denoised, x_gt_aug, weights, mask)  # [B, S]
    edm = (sigma.square() + sigma_data**2) / (sigma * sigma_data).square()
    structural = mse
    bond = torch.zeros_like(mse)
    if cfg.bond_weight > 0:
        bond = bond_loss(x_denoised, x_ref, feats, None if pairs is None else pairs.bond)
        structural = mse + cfg.bond_weight * bond
    smooth = smooth_lddt_loss(x_denoised, x_ref, nucleotide, mask,
                              pairs=None if pairs is None else pairs.lddt)
    total = (edm * structural).mean() + cfg.smooth_lddt_weight * smooth.mean()
    return {"diffusion": total, "mse": mse.mean(), "bond": bond.mean(),
            "smooth_lddt": smooth.mean()}
