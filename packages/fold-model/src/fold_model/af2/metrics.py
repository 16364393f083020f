"""Structure metrics in torch: lDDT (Mariani et al. 2013) as used by AF2 (supplement 1.9.6).

fold-train adds more metrics later; these are the ones the losses and heads need.
"""

from __future__ import annotations

import torch

__all__ = ["lddt", "lddt_ca", "LDDT_THRESHOLDS"]

LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # Angstrom
_CA = 1  # atom37 index of CA


def lddt(
    pred: torch.Tensor,
    true: torch.Tensor,
    mask: torch.Tensor,
    cutoff: float = 15.0,
    eps: float = 1e-10,
    per_residue: bool = True,
) -> torch.Tensor:
    """Superposition-free lDDT in [0, 1] over one atom per residue.

    pred, true: ``[*, N, 3]``; mask: ``[*, N]`` (1 = atom present in the truth). Pairs are the
    distinct atoms within ``cutoff`` in the *true* structure; a pair scores the fraction of the
    thresholds 0.5, 1, 2, 4 A that its distance error is under. Returns ``[*, N]`` (score of each
    residue over its pairs) or ``[*]`` (over all pairs) when ``per_residue`` is False.
    """
    n = pred.shape[-2]
    d_true = torch.cdist(true, true)  # [*, N, N]
    d_pred = torch.cdist(pred, pred)
    eye = torch.eye(n, dtype=pred.dtype, device=pred.device)
    scored = (d_true < cutoff).to(pred.dtype) * mask[..., :, None] * mask[..., None, :] * (1 - eye)
    err = torch.abs(d_true - d_pred)
    score = sum((err < t).to(pred.dtype) for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    dims = (-1,) if per_residue else (-2, -1)
    return (eps + torch.sum(scored * score, dim=dims)) / (eps + torch.sum(scored, dim=dims))


def lddt_ca(
    all_atom_pred: torch.Tensor,
    all_atom_true: torch.Tensor,
    all_atom_mask: torch.Tensor,
    cutoff: float = 15.0,
    eps: float = 1e-10,
    per_residue: bool = True,
) -> torch.Tensor:
    """lDDT-Ca from atom37 arrays ``[*, N, 37, 3]`` and mask ``[*, N, 37]``; see :func:`lddt`."""
    return lddt(
        all_atom_pred[..., _CA, :],
        all_atom_true[..., _CA, :],
        all_atom_mask[..., _CA],
        cutoff=cutoff,
        eps=eps,
        per_residue=per_residue,
    )
