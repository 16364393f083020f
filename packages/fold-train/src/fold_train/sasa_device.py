"""Shrake-Rupley accessible areas on a torch device (the GPU that ran the prediction).

:func:`fold_train.structure_checks.atom_sasa` finds each atom's neighbours with a cell list,
which is linear in the atoms for a folded structure but not for a crowded one: an untrained or
collapsed prediction puts every atom within reach of every other, and the numpy loop over the
points still free then meets all ``A`` atoms (a 3072-token AF3 prediction of random weights:
28 s per sample on the CPU, longer than the model). On a GPU the ``A * P`` points against
all ``A`` atoms are a few blocked distance matrices, whatever the density.

Same method, radii and points as the numpy path, float64, the same ``|p|^2 + |x|^2 - 2 p.x``
distances: the areas agree with it to the rounding of points that lie on a sphere's surface.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["atom_sasa_device"]

_PAIRS = 1 << 25  # point-atom distances per step: 256 MiB of float64


def atom_sasa_device(positions: np.ndarray, radii: np.ndarray, dots: np.ndarray,
                     device: str | torch.device) -> np.ndarray:
    """Accessible area ``[A]`` (A^2) of each atom of ``positions [A, 3]`` with expanded radii
    ``radii [A]`` (van der Waals + probe, checked by the caller) and ``dots [P, 3]`` unit-sphere
    points, computed on ``device``: a point of atom i is free when no other expanded sphere
    contains it."""
    dev = torch.device(device)
    x = torch.as_tensor(np.asarray(positions, np.float64), device=dev)  # [A, 3]
    r = torch.as_tensor(np.asarray(radii, np.float64), device=dev)  # [A]
    unit = torch.as_tensor(np.asarray(dots, np.float64), device=dev)  # [P, 3]
    n_atoms, n_points = len(x), len(unit)
    area = torch.zeros(n_atoms, dtype=torch.float64, device=dev)
    if n_atoms == 0:
        return area.cpu().numpy()
    sq = (x * x).sum(-1)  # [A]
    block = max(1, min(n_atoms, 256))  # atoms per block: b * P points
    for start in range(0, n_atoms, block):
        rows = torch.arange(start, min(start + block, n_atoms), device=dev)  # [b]
        # candidates: atoms whose expanded sphere meets one of the block's (the block included)
        d2 = sq[rows, None] + sq[None, :] - 2.0 * x[rows] @ x.T  # [b, A]
        cand = torch.nonzero(
            (d2 < (r[rows, None] + r[None, :]) ** 2).any(0)).squeeze(1)  # [c]
        pts = (x[rows, None, :] + r[rows, None, None] * unit).reshape(-1, 3)  # [b * P, 3]
        owner = rows.repeat_interleave(n_points)  # [b * P]: the atom each point belongs to
        p2 = (pts * pts).sum(-1)  # [b * P]
        free = torch.ones(len(pts), dtype=torch.bool, device=dev)
        step = max(1, _PAIRS // len(pts))
        for c0 in range(0, len(cand), step):
            nb = cand[c0:c0 + step]  # [k]
            dist2 = p2[:, None] + sq[nb][None, :] - 2.0 * pts @ x[nb].T  # [b * P, k]
            covered = (dist2 < r[nb][None, :] ** 2) & (nb[None, :] != owner[:, None])
            free &= ~covered.any(-1)
        frac = free.reshape(len(rows), n_points).double().mean(-1)  # [b]
        area[rows] = 4.0 * math.pi * r[rows] ** 2 * frac
    return area.cpu().numpy()
