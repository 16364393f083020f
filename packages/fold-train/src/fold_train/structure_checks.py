"""The two terms of AlphaFold3's ranking score that come from the predicted coordinates, not the
confidence head (supplement 5.9.3; definitions from AF3's released ``confidences.py``):

* ``has_clash``: a polymer chain with more than 100 atoms, or more than half its atoms, within
  1.1 A of a polymer atom of another chain or of a residue more than one position away;
* ``fraction_disordered``: the fraction of protein residues whose relative solvent accessible
  surface area (RASA), averaged over a window of 25 residues, exceeds 0.581 (AlphaFold-RSA,
  Piovesan et al. 2022). AF3 measures the accessibility with DSSP; fold computes it with the
  Shrake-Rupley method, DSSP's atom radii (N 1.65, CA 1.87, C 1.76, O 1.40, other atoms 1.80 A)
  and a 1.4 A probe, each chain on its own as AF3 does, normalised by the residue's maximum
  (Sander & Rost 1994).

Both are numpy, on all-atom coordinates of any size. Close atoms are found with a cell list
(:mod:`fold_train.neighbours`), so the time grows with the atoms, not their square (a
49k-atom prediction's ``has_clash`` took 11 s with all pairs); ``neighbours="all"`` keeps the
all-pairs search as the reference the tests hold the cell list to. A crowded structure (an
untrained model's collapsed prediction) still puts every atom within reach of every other;
``device=`` computes the accessible areas on the GPU that predicted instead
(:mod:`fold_train.sasa_device`), which ``fold-train predict`` does on a GPU.
"""

from __future__ import annotations

import numpy as np

from fold_train.neighbours import CellList, iter_close_pairs

__all__ = ["fraction_disordered", "has_clash", "relative_sasa"]

CLASH_DISTANCE = 1.1  # A
MIN_CLASHES = 100
MIN_CLASH_FRACTION = 0.5
RASA_CUTOFF = 0.581
RASA_WINDOW = 25
PROBE = 1.4  # A, water
_DSSP_RADII = {"N": 1.65, "CA": 1.87, "C": 1.76, "O": 1.4}
_SIDE_CHAIN_RADIUS = 1.8
# Sander & Rost 1994 (AF3 confidences.MAX_ACCESSIBLE_SURFACE_AREA); unknown residues as ALA
MAX_ASA = {"ALA": 106.0, "ARG": 248.0, "ASN": 157.0, "ASP": 163.0, "CYS": 135.0, "GLN": 198.0,
           "GLU": 194.0, "GLY": 84.0, "HIS": 184.0, "ILE": 169.0, "LEU": 164.0, "LYS": 205.0,
           "MET": 188.0, "PHE": 197.0, "PRO": 136.0, "SER": 130.0, "THR": 142.0, "TRP": 227.0,
           "TYR": 222.0, "VAL": 142.0}
_BLOCK_ELEMENTS = 1 << 22  # distances per block of rows: 32 MiB of float64
_NEIGHBOUR_CHUNK = 64  # neighbours tested at a time against a block's still-free points
NEIGHBOURS = ("cells", "all")  # how close atoms are found: a cell list, or every pair


def _close_blocks(x: np.ndarray, cutoff: float | np.ndarray):
    """Yield ``(rows, close [b, A])``: for blocks of atoms ``rows`` of ``x [A, 3]``, which atoms
    are closer than ``cutoff`` (a scalar, or per atom ``[A]``: the pair's cutoff is
    ``cutoff[i] + cutoff[j]``), the atom itself included. Memory bounded for any ``A``."""
    per_atom = np.ndim(cutoff) > 0
    block = max(1, _BLOCK_ELEMENTS // max(len(x), 1))
    sq = (x * x).sum(-1)  # [A]
    for start in range(0, len(x), block):
        rows = np.arange(start, min(start + block, len(x)))
        d2 = sq[rows, None] + sq[None, :] - 2.0 * x[rows] @ x.T  # [b, A], |a|^2 + |b|^2 - 2ab
        lim = cutoff[rows, None] + cutoff[None, :] if per_atom else cutoff
        yield rows, d2 < lim ** 2


def _check_neighbours(neighbours: str) -> None:
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")


def _clashing(positions: np.ndarray, chain: np.ndarray, residue: np.ndarray,
              polymer: np.ndarray, neighbours: str = "cells") -> np.ndarray:
    """Which polymer atoms ``[A]`` lie within 1.1 A of a polymer atom of another chain or of a
    residue more than one position away (non-polymer atoms: False)."""
    _check_neighbours(neighbours)
    keep = np.flatnonzero(polymer)
    out = np.zeros(len(positions), bool)
    if len(keep) == 0:
        return out
    x, ch, res = positions[keep].astype(np.float64), chain[keep], residue[keep]
    clashing = np.zeros(len(keep), bool)
    if neighbours == "all":
        for rows, close in _close_blocks(x, CLASH_DISTANCE):  # close: [b, A]
            r, j = np.nonzero(close)  # few pairs: the rest of the block is far apart
            i = rows[r]
            apart = (ch[i] != ch[j]) | (np.abs(res[i] - res[j]) > 1)  # excludes the atom itself
            clashing[i[apart]] = True
    else:
        for i, j in iter_close_pairs(x, CLASH_DISTANCE):  # [p] each, i < j
            apart = (ch[i] != ch[j]) | (np.abs(res[i] - res[j]) > 1)
            clashing[i[apart]] = True
            clashing[j[apart]] = True
    out[keep] = clashing
    return out


def has_clash(positions: np.ndarray, chain: np.ndarray, residue: np.ndarray,
              polymer: np.ndarray, *, neighbours: str = "cells") -> bool:
    """Whether a polymer chain clashes. ``positions [A, 3]``, ``chain [A]``, ``residue [A]``
    (index within the chain), ``polymer [A]`` (protein / RNA / DNA atoms; ligands are not
    counted). ``neighbours``: ``"cells"`` (a cell list) or ``"all"`` (every pair: the
    reference, ``O(A^2)`` time)."""
    keep = np.flatnonzero(polymer)
    clashing, ch = _clashing(positions, chain, residue, polymer, neighbours)[keep], chain[keep]
    for c in np.unique(ch):
        in_chain = ch == c
        n = int(clashing[in_chain].sum())
        if n > MIN_CLASHES or n / in_chain.sum() > MIN_CLASH_FRACTION:
            return True
    return False


def _sphere(n: int = 100) -> np.ndarray:
    """``n`` points spread evenly on the unit sphere (golden-section spiral) ``[n, 3]``."""
    k = np.arange(n) + 0.5
    z = 1.0 - 2.0 * k / n
    r = np.sqrt(1.0 - z * z)
    phi = np.pi * (1.0 + 5 ** 0.5) * k
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)


def atom_sasa(positions: np.ndarray, radii: np.ndarray, n_points: int = 100, *,
              neighbours: str = "cells", device=None) -> np.ndarray:
    """Shrake-Rupley solvent accessible area of each atom ``[A]`` (A^2) of ``positions [A, 3]``
    with van der Waals ``radii [A]`` and a water probe: the fraction of ``n_points`` points on
    the atom's expanded sphere that no other expanded sphere covers. ``neighbours``:
    ``"cells"`` (candidates from a cell list) or ``"all"`` (every atom a candidate: the
    reference); the same areas either way. ``device`` (a torch device, e.g. the GPU that
    predicted): computed there instead (:mod:`fold_train.sasa_device`; ``neighbours`` unused),
    whatever the structure's density."""
    _check_neighbours(neighbours)
    x = positions.astype(np.float64)
    r = radii.astype(np.float64) + PROBE  # [A]
    if not np.isfinite(r).all() or (r <= 0).any():
        bad = int(np.flatnonzero(~np.isfinite(r) | (r <= 0))[0])
        raise ValueError(f"atom_sasa: atom {bad} has radius {radii[bad]!r}; expected a finite "
                         f"van der Waals radius > -{PROBE} A")
    dots = _sphere(n_points)  # [P, 3]
    if device is not None:
        from fold_train.sasa_device import atom_sasa_device

        return atom_sasa_device(x, r, dots, device)
    area = np.zeros(len(x))
    block = 64  # consecutive atoms (a few residues): spatially compact, few candidates
    sq = (x * x).sum(-1)
    # every expanded sphere that can cover a point of atom i's lies within r_i + r_j <= 2 max r
    cells = CellList(x, 2.0 * r.max()) if neighbours == "cells" and len(x) else None
    for start in range(0, len(x), block):
        rows = np.arange(start, min(start + block, len(x)))
        if cells is None:  # every atom a candidate (no copy of x)
            cand, xc, sqc, rc = np.arange(len(x)), x, sq, r  # [c = A]
        else:
            cand = cells.near(rows)  # [c] ascending
            xc, sqc, rc = x[cand], sq[cand], r[cand]
        d2 = sq[rows, None] + sqc[None, :] - 2.0 * x[rows] @ xc.T  # [b, c]
        hit = (d2 < (r[rows, None] + rc[None, :]) ** 2).any(0)  # [c]
        near = cand[hit]  # [m]
        # nearest first: in a crowded (e.g. collapsed, untrained) structure the first few
        # neighbours cover most points, and only the points still free meet the next ones
        near = near[np.argsort(d2[:, hit].min(0), kind="stable")]
        pts = (x[rows, None, :] + r[rows, None, None] * dots).reshape(-1, 3)  # [b * P, 3]
        owner = np.repeat(rows, len(dots))  # [b * P]: the atom of each point
        free = np.ones(len(pts), bool)
        for start in range(0, len(near), _NEIGHBOUR_CHUNK):
            live = np.flatnonzero(free)
            if len(live) == 0:
                break
            nb = near[start:start + _NEIGHBOUR_CHUNK]  # [k]
            p = pts[live]
            p2 = (p * p).sum(-1)[:, None] + sq[nb][None, :] - 2.0 * p @ x[nb].T  # [l, k]
            covered = (p2 < r[nb] ** 2) & (nb[None, :] != owner[live, None])  # not by itself
            free[live[covered.any(-1)]] = False
        area[rows] = 4.0 * np.pi * r[rows] ** 2 * free.reshape(len(rows), len(dots)).mean(-1)
    return area


def relative_sasa(positions: np.ndarray, atom_names: np.ndarray, residue: np.ndarray,
                  res_names: list[str], *, neighbours: str = "cells",
                  device=None) -> np.ndarray:
    """RASA ``[R]`` of one protein chain: each residue's accessible area (DSSP radii) over its
    maximum, capped at 1. ``residue [A]`` indexes ``res_names`` (three-letter codes)."""
    radii = np.array([_DSSP_RADII.get(str(n), _SIDE_CHAIN_RADIUS) for n in atom_names])
    area = atom_sasa(positions, radii, neighbours=neighbours, device=device)
    per_res = np.bincount(residue, weights=area, minlength=len(res_names))
    max_asa = np.array([MAX_ASA.get(n, MAX_ASA["ALA"]) for n in res_names])
    return np.minimum(per_res / max_asa, 1.0)


def fraction_disordered(positions: np.ndarray, chain: np.ndarray, residue: np.ndarray,
                        protein: np.ndarray, atom_names: np.ndarray,
                        res_names: dict[int, list[str]], *, neighbours: str = "cells",
                        device=None) -> float:
    """Fraction of protein residues with windowed RASA above 0.581 (0 without protein).
    ``chain``, ``residue`` ``[A]`` (residue index within the chain, from 0), ``protein [A]``,
    ``atom_names [A]``, ``res_names``: chain -> its residues' three-letter codes;
    ``neighbours`` and ``device`` as for :func:`atom_sasa`."""
    rasa: list[np.ndarray] = []
    for c in np.unique(chain[protein.astype(bool)]):
        sel = np.flatnonzero((chain == c) & protein.astype(bool))
        names = res_names[int(c)]
        per_res = relative_sasa(positions[sel], atom_names[sel], residue[sel], names,
                                neighbours=neighbours, device=device)
        present = np.unique(residue[sel])  # residues with atoms (all, in a prediction)
        values = per_res[present]
        half = (RASA_WINDOW - 1) // 2
        padded = np.pad(values, (half, half), "reflect") if len(values) > 1 else values
        window = np.ones(min(RASA_WINDOW, len(padded)))
        rasa.append(np.convolve(padded, window, "valid") / len(window))
    if not rasa:
        return 0.0
    return float((np.concatenate(rasa) > RASA_CUTOFF).mean())
