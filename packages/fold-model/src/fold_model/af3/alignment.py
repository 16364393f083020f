"""Weighted rigid alignment (AF3 supplement Alg. 28): the weighted Kabsch superposition used to
align the ground truth onto each denoised sample before the MSE loss (under stop-gradient)."""

from __future__ import annotations

import torch

__all__ = ["weighted_rigid_transform", "weighted_rigid_align"]


def weighted_rigid_transform(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The proper rotation ``R [*, 3, 3]`` and centroids ``mu_moving, mu_fixed [*, 1, 3]`` that
    minimise ``sum_l w_l |R (moving_l - mu_m) + mu_f - fixed_l|^2``. ``moving, fixed [*, A, 3]``,
    ``weights [*, A]`` (0 for atoms left out). Computed in at least fp32, also under autocast
    (which would run the covariance einsum in bf16, for which there is no SVD)."""
    with torch.autocast(moving.device.type, enabled=False):
        return _rigid_transform(moving, fixed, weights)


def _rigid_transform(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(moving.dtype, torch.float32)
    m, f, w = moving.to(dtype), fixed.to(dtype), weights.to(dtype)[..., None]  # w: [*, A, 1]
    total = w.sum(-2, keepdim=True).clamp_min(1e-8)  # [*, 1, 1]
    mu_m = (w * m).sum(-2, keepdim=True) / total  # [*, 1, 3]
    mu_f = (w * f).sum(-2, keepdim=True) / total
    h = torch.einsum("...ai,...aj->...ij", w * (m - mu_m), f - mu_f)  # [*, 3, 3]
    u, _, vh = torch.linalg.svd(h)
    v = vh.transpose(-1, -2)
    # Reflection fix: flip the axis of the smallest singular value when det(V U^T) < 0.
    d = torch.sign(torch.linalg.det(v @ u.transpose(-1, -2)))
    d = torch.where(d == 0, torch.ones_like(d), d)
    flip = torch.ones(*d.shape, 3, dtype=dtype, device=d.device)
    flip[..., 2] = d
    rot = (v * flip[..., None, :]) @ u.transpose(-1, -2)  # V diag(1, 1, d) U^T
    return rot, mu_m, mu_f


def weighted_rigid_align(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``moving [*, A, 3]`` superposed onto ``fixed`` with per-atom ``weights [*, A]``; detached
    (Alg. 28 ends in stop_gradient), in ``moving``'s dtype."""
    with torch.no_grad(), torch.autocast(moving.device.type, enabled=False):
        rot, mu_m, mu_f = weighted_rigid_transform(moving, fixed, weights)
        out = torch.einsum("...ij,...aj->...ai", rot, moving.to(rot.dtype) - mu_m) + mu_f
    return out.to(moving.dtype)
