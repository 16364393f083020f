"""The cell list's close pairs against every pair compared directly (the same float64
differences, so the sets must be equal, not nearly): uniform, collapsed, linear, duplicated,
huge and negative coordinates, 0 / 1 / odd numbers of atoms, scalar and per-atom cutoffs,
batches smaller than one cell's pairs."""

from __future__ import annotations

import numpy as np
import pytest
from fold_train.neighbours import CellList, close_pairs, iter_close_pairs


def brute_pairs(x: np.ndarray, cutoff) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``i < j`` with ``|xi - xj|^2 < cutoff^2`` (or ``(ri + rj)^2``), by rows."""
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, close to nothing
        d = x[:, None, :] - x[None, :, :]  # [A, A, 3]
    d2 = d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1] + d[..., 2] * d[..., 2]  # [A, A]
    lim = cutoff[:, None] + cutoff[None, :] if np.ndim(cutoff) else cutoff
    close = (d2 < lim * lim) & np.triu(np.ones(d2.shape, bool), 1)
    return np.nonzero(close)  # row-major: sorted by i then j


def cloud(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, 3]`` points of one kind."""
    if kind == "uniform":
        return rng.uniform(0.0, 25.0, (n, 3))
    if kind == "collapsed":  # an untrained model's prediction: every atom within ~5 A
        return rng.normal(size=(n, 3)) * 1.5
    if kind == "line":
        t = np.linspace(0.0, 0.9 * n, n)
        return np.stack([t, 0.5 * t, np.zeros(n)], -1) + rng.normal(size=(n, 3)) * 0.05
    if kind == "duplicated":  # each point three times
        return np.repeat(rng.uniform(0.0, 8.0, (n, 3)), 3, 0)[:n]
    if kind == "huge":  # far from the origin and far apart in groups: a squeezed grid
        return (rng.integers(-3, 3, (n, 3)) * 1e11 + rng.uniform(0.0, 4.0, (n, 3)))
    if kind == "negative":
        return -5e4 + rng.uniform(0.0, 15.0, (n, 3))
    raise ValueError(kind)


KINDS = ["uniform", "collapsed", "line", "duplicated", "huge", "negative"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 97, 613])
def test_close_pairs_equal_every_pair(kind, n):
    rng = np.random.default_rng(n * 7 + KINDS.index(kind))
    x = cloud(kind, n, rng)
    for cutoff in (1.1, 3.7, rng.uniform(0.3, 2.5, n), np.zeros(n) + 1.6):
        for max_pairs in (1 << 22, 5):  # 5: batches much smaller than the cells' pairs
            i, j = close_pairs(x, cutoff, max_pairs=max_pairs)
            bi, bj = brute_pairs(x, cutoff)
            np.testing.assert_array_equal(i, bi)
            np.testing.assert_array_equal(j, bj)
    if kind in ("collapsed", "duplicated") and n > 10:
        assert len(close_pairs(x, 1.1)[0]) > n  # the test has pairs to find


def test_pairs_at_the_cutoff_and_across_cells():
    """Points on a lattice of spacing 1.1 (exactly at the cutoff: not close) and 1.1 minus a
    round-off (close), straddling cell walls, including negative coordinates."""
    g = np.arange(-4, 5, dtype=np.float64)
    x = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)  # [729, 3]
    for spacing in (1.1, np.nextafter(1.1, 0.0), 0.55, 1.1 / 3.0):
        pts = x * spacing
        i, j = close_pairs(pts, 1.1)
        bi, bj = brute_pairs(pts, 1.1)
        np.testing.assert_array_equal(i, bi)
        np.testing.assert_array_equal(j, bj)


def test_non_finite_atoms_are_close_to_nothing():
    rng = np.random.default_rng(5)
    x = rng.uniform(0.0, 6.0, (60, 3))
    x[[3, 17]] = np.nan
    x[22, 1] = np.inf
    x[40] = -np.inf
    i, j = close_pairs(x, 2.0)
    bi, bj = brute_pairs(x, 2.0)
    np.testing.assert_array_equal(i, bi)
    np.testing.assert_array_equal(j, bj)
    assert not np.isin([3, 17, 22, 40], np.concatenate([i, j])).any()


def test_batches_are_bounded_and_cover_each_pair_once():
    x = cloud("collapsed", 400, np.random.default_rng(1))
    batches = list(iter_close_pairs(x, 2.0, max_pairs=1000))
    assert len(batches) > 10
    i = np.concatenate([b[0] for b in batches])
    j = np.concatenate([b[1] for b in batches])
    assert (i < j).all()
    assert len(np.unique(i * len(x) + j)) == len(i) == len(brute_pairs(x, 2.0)[0])


def test_near_is_a_sorted_superset_of_the_close_atoms():
    rng = np.random.default_rng(2)
    x = np.concatenate([cloud("uniform", 500, rng), cloud("collapsed", 200, rng)])
    cells = CellList(x, 3.0)
    for rows in (np.arange(0, 64), np.arange(530, 600), np.array([7]), np.zeros(0, int)):
        near = cells.near(rows)
        assert (np.diff(near) > 0).all()
        d2 = ((x[rows, None, :] - x[None, :, :]) ** 2).sum(-1)  # [b, A]
        assert np.isin(np.flatnonzero((d2 < 9.0).any(0)), near).all()
        assert len(rows) == 0 or len(near) < len(x)  # not every atom: the cells cut the search


def test_bad_cutoffs_raise():
    x = np.zeros((4, 3))
    for bad in (-1.0, np.nan, np.inf, np.ones(3), np.array([1.0, 1.0, -0.5, 1.0])):
        with pytest.raises(ValueError, match="cutoff"):
            close_pairs(x, bad)
    with pytest.raises(ValueError, match=r"\[A, 3\]"):
        close_pairs(np.zeros((4, 2)), 1.0)
    assert len(close_pairs(x, 0.0)[0]) == 0  # strict <: nothing closer than 0
