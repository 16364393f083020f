"""Close atom pairs by a cell list (Allen & Tildesley, *Computer Simulation of Liquids*, 5.3.2):
atoms binned on a uniform grid whose cell edge is at least the largest cutoff, so that a pair
closer than the cutoff lies in the same cell or in two of the 26 cells around it. Time grows
with the atoms and the pairs found, not with ``A^2`` (unless the atoms are piled into a few
cells, e.g. a collapsed prediction, where every pair is close anyway).

All numpy and vectorised over atoms and cells; candidate pairs are expanded in batches of at
most ``max_pairs`` (or one cell's atoms when more), so memory stays bounded for any ``A``.
Atoms with a non-finite coordinate are close to nothing, as in the all-pairs comparison (NaN
and inf distances fail ``<``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["CellList", "close_pairs", "iter_close_pairs"]

MAX_PAIRS = 1 << 22  # candidate pairs per batch: ~200 MiB of index and distance arrays
# The 13 neighbouring cells after the cell itself in lexicographic order: with the cell itself
# (pairs i < j within it) each unordered pair of cells is visited once.
_HALF_SHELL = np.array([(dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1)
                        for dz in (-1, 0, 1) if (dx, dy, dz) > (0, 0, 0)])  # [13, 3]
_SHELL = np.array([(dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1)
                   for dz in (-1, 0, 1)])  # [27, 3]


def _ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a loop."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)  # [T]
    # each element's offset from its run's first element, plus that run's start
    within = np.arange(total) - np.repeat(ends - lengths, lengths)
    return np.repeat(starts, lengths) + within


class CellList:
    """The atoms of ``x [A, 3]`` binned in cubic cells of edge at least ``edge`` (A).

    The edge is widened by a relative 2^-20 and by a few float64 round-offs of the largest
    coordinate, so that two atoms whose computed distance is below ``edge`` always fall in the
    same or adjacent cells, whatever the rounding of ``x / edge``. Cells are indexed by their
    integer position on each axis, with empty stretches of an axis squeezed to one empty cell
    (neighbourhood kept), so huge or spread-out coordinates need no huge grid.
    """

    def __init__(self, x: np.ndarray, edge: float):
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != 3:
            raise ValueError(f"positions must be [A, 3], got shape {x.shape}")
        if not (np.isfinite(edge) and edge > 0):
            raise ValueError(f"cell edge must be finite and > 0, got {edge}")
        self.n_atoms = len(x)
        binned = np.flatnonzero(np.isfinite(x).all(-1))  # [B] atoms with a cell
        scale = float(np.abs(x[binned]).max()) if len(binned) else 0.0
        self.edge = edge * (1.0 + 2.0 ** -20) + 8.0 * np.finfo(np.float64).eps * scale
        f = np.floor(x[binned] / self.edge)  # [B, 3] cell position on each axis (float)
        cell = np.empty((len(binned), 3), np.int64)
        size = []
        for k in range(3):
            values, inverse = np.unique(f[:, k], return_inverse=True)  # [U], [B]
            # neighbours stay neighbours; a gap of several empty cells becomes one empty cell
            step = np.where(np.diff(values) == 1.0, 1, 2)  # [U - 1]
            squeezed = np.concatenate([[1], 1 + np.cumsum(step)])  # [U], from 1: 0 stays free
            cell[:, k] = squeezed[inverse.reshape(-1)]
            size.append(int(squeezed[-1]) + 2 if len(values) else 2)  # one free cell past the end
        self._size = size
        # one int64 key per cell: the (x, y) column's rank among occupied columns, then z
        # (rank * size_z < A * 2A, where a plain x*y*z product could overflow for huge spreads)
        column = cell[:, 0] * size[1] + cell[:, 1]  # [B]
        self._columns, rank = np.unique(column, return_inverse=True)  # [C], [B]
        key = rank.reshape(-1) * size[2] + cell[:, 2]  # [B]
        order = np.argsort(key, kind="stable")
        self.atoms = binned[order]  # [B] atom indices grouped by cell, ascending in a cell
        keys, self.starts, self.counts = np.unique(key[order], return_index=True,
                                                   return_counts=True)  # [K] occupied cells
        self._keys = keys
        self._cell = cell[order][self.starts]  # [K, 3] each occupied cell's axis positions
        self._cell_of_atom = np.full(self.n_atoms, -1)  # [A] occupied cell index, -1 if none
        self._cell_of_atom[self.atoms] = np.repeat(np.arange(len(keys)), self.counts)
        self._around: np.ndarray | None = None  # [K, 27] occupied cells around each, -1 empty

    def neighbour_cells(self, cells: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """For occupied cells ``cells [n]`` (indices), the occupied cell at ``offset [3]``
        (each -1, 0 or 1) from each, or -1 where that cell is empty ``[n]``."""
        pos = self._cell[cells] + offset  # [n, 3]; >= 0 and < size since positions start at 1
        column = pos[:, 0] * self._size[1] + pos[:, 1]
        rank = np.minimum(np.searchsorted(self._columns, column), len(self._columns) - 1)
        key = rank * self._size[2] + pos[:, 2]
        found = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
        ok = (self._columns[rank] == column) & (self._keys[found] == key)
        return np.where(ok, found, -1)

    def near(self, rows: np.ndarray) -> np.ndarray:
        """Atoms in the cells around (and in) the cells of atoms ``rows``: a superset of every
        atom closer than ``edge`` to one of them, ascending ``[m]``."""
        cells = np.unique(self._cell_of_atom[rows])
        cells = cells[cells >= 0]
        if len(cells) == 0:
            return np.zeros(0, np.int64)
        if self._around is None:  # every occupied cell's 27 cells, once: near() runs per block
            everything = np.arange(len(self._keys))
            self._around = np.stack([self.neighbour_cells(everything, o) for o in _SHELL], -1)
        around = self._around[cells].reshape(-1)  # [27 n]
        around = np.unique(around[around >= 0])
        return np.sort(self.atoms[_ragged_arange(self.starts[around], self.counts[around])])

    def candidate_pairs(self, max_pairs: int = MAX_PAIRS) -> Iterator[tuple[np.ndarray,
                                                                              np.ndarray]]:
        """Yield batches ``(i, j)`` of atom pairs in the same or adjacent cells, each unordered
        pair once (no atom with itself): a superset of the pairs closer than ``edge``. A batch
        holds at most ``max_pairs`` pairs, or one atom's partners in one cell when more."""
        n_cells = len(self._keys)
        # tasks: an atom (its position p in self.atoms) against a run of positions [s, s + n)
        p_cell = np.arange(len(self.atoms))
        cell_end = np.repeat(self.starts + self.counts, self.counts)  # [B]
        tasks = [(p_cell, p_cell + 1, cell_end - p_cell - 1)]  # the same cell, later atoms
        cells = np.arange(n_cells)
        for offset in _HALF_SHELL:
            other = self.neighbour_cells(cells, offset)  # [K]
            has = other >= 0
            a, b = cells[has], other[has]
            p = _ragged_arange(self.starts[a], self.counts[a])  # atoms of the cells a
            b = np.repeat(b, self.counts[a])
            tasks.append((p, self.starts[b], self.counts[b]))
        p, start, length = (np.concatenate(t) for t in zip(*tasks, strict=True))
        keep = length > 0
        p, start, length = p[keep], start[keep], length[keep]
        # batches of whole tasks with at most max_pairs pairs (a longer task goes alone)
        ends = np.cumsum(length)
        first = 0
        while first < len(p):
            base = ends[first - 1] if first else 0
            last = max(first + 1, int(np.searchsorted(ends, base + max_pairs, "right")))
            q = _ragged_arange(start[first:last], length[first:last])
            i = np.repeat(p[first:last], length[first:last])
            yield self.atoms[i], self.atoms[q]
            first = last


def _cutoffs(cutoff, n_atoms: int) -> tuple[np.ndarray | None, float]:
    """``(radii [A] or None, largest pair cutoff)``, checked."""
    c = np.asarray(cutoff, np.float64)
    if c.ndim == 0:
        if not (np.isfinite(c) and c >= 0):
            raise ValueError(f"cutoff must be finite and >= 0, got {cutoff}")
        return None, float(c)
    if c.shape != (n_atoms,):
        raise ValueError(f"per-atom cutoffs must be [A] = [{n_atoms}], got shape {c.shape}")
    if not (np.isfinite(c).all() and (c >= 0).all()):
        raise ValueError("per-atom cutoffs must be finite and >= 0")
    return c, 2.0 * float(c.max()) if n_atoms else 0.0


def iter_close_pairs(x: np.ndarray, cutoff, *, max_pairs: int = MAX_PAIRS
                     ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield batches ``(i, j)`` (``i < j``) of the atom pairs of ``x [A, 3]`` closer than
    ``cutoff``: a scalar, or per atom ``[A]`` (the pair's cutoff is ``cutoff[i] +
    cutoff[j]``). Each pair once, in no particular order; at most ``max_pairs`` candidate pairs
    are held at a time. Distances are float64 differences, ``|xi - xj|^2 < cutoff^2``."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"positions must be [A, 3], got shape {x.shape}")
    radii, largest = _cutoffs(cutoff, len(x))
    if largest == 0.0 or len(x) < 2:
        return  # strict <: nothing is closer than 0
    for i, j in CellList(x, largest).candidate_pairs(max_pairs):
        d = x[i] - x[j]  # [n, 3]
        d2 = d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2]  # [n]
        lim = largest if radii is None else radii[i] + radii[j]
        close = d2 < lim * lim
        i, j = i[close], j[close]
        yield np.minimum(i, j), np.maximum(i, j)


def close_pairs(x: np.ndarray, cutoff, *, max_pairs: int = MAX_PAIRS
                ) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``(i [P], j [P])`` of :func:`iter_close_pairs`, ``i < j``, sorted by ``i``
    then ``j``."""
    batches = list(iter_close_pairs(x, cutoff, max_pairs=max_pairs))
    if not batches:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = (np.concatenate(b) for b in zip(*batches, strict=True))
    order = np.lexsort((j, i))
    return i[order], j[order]
