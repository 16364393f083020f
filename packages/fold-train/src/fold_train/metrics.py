"""Structure-comparison metrics in numpy: RMSD (Kabsch), lDDT-Ca, TM-score, GDT-TS, GDT-HA.

All functions take one atom per residue (usually CA): ``pred, true: [N, 3]`` and an optional
``mask: [N]`` (1 = the residue is present in the true structure), and compare residue ``i`` of
``pred`` with residue ``i`` of ``true`` (the residue correspondence is given, as when scoring a
prediction against the structure of its own sequence).

* RMSD after optimal superposition: Kabsch (1976), with the sign correction that keeps a proper
  rotation (no reflection).
* lDDT-Ca (Mariani et al. 2013): superposition-free; the pairs are the distinct residues whose
  distance in the *true* structure is under the inclusion radius (15 A), each scored by the
  fraction of the thresholds 0.5, 1, 2 and 4 A that its distance error is under. The global
  score averages over all scored pairs (as AF2 reports lDDT-Ca, supplement 1.9.6).
* TM-score (Zhang & Skolnick 2004): ``max over superpositions of (1/L) sum_i 1 / (1 + (d_i /
  d0)^2)`` with ``d0 = 1.24 (L - 15)^(1/3) - 1.8`` (at least 0.5) and ``L`` the length of the
  true structure. The maximum is searched as the TM-score program does: seed superpositions on
  contiguous fragments of length L, L/2, L/4, ... (at least 4), each refined by iterating
  "superpose on the residues within the search radius of the current superposition" until the
  selection stops changing; the best score of every superposition visited is kept.
* GDT-TS / GDT-HA (Zemla 2003, LGA): the mean over the cutoffs (1, 2, 4, 8 A) / (0.5, 1, 2, 4 A)
  of the largest fraction of residues within the cutoff under one superposition, searched per
  cutoff with the same fragment seeds and "superpose on the residues under the cutoff"
  refinement. Like LGA it is a heuristic search: it finds a lower bound of the true maximum that
  is exact in the cases the tests construct (rigid motions, rigid cores with outliers).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = [
    "GDT_HA_CUTOFFS",
    "GDT_TS_CUTOFFS",
    "LDDT_THRESHOLDS",
    "gdt",
    "gdt_ha",
    "gdt_ts",
    "kabsch",
    "lddt_ca",
    "rmsd",
    "superpose",
    "tm_score",
    "tm_d0",
]

LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # Angstrom
GDT_TS_CUTOFFS = (1.0, 2.0, 4.0, 8.0)
GDT_HA_CUTOFFS = (0.5, 1.0, 2.0, 4.0)
_MAX_REFINE = 20  # refinement iterations per seed (the TM-score program uses 20)


def _prepare(
    pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``[N_present, 3]`` arrays of the residues present in ``mask``."""
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.ndim != 2 or pred.shape[-1] != 3 or pred.shape != true.shape:
        raise ValueError(
            f"expected pred and true of one shape [N, 3], got {pred.shape} and {true.shape}"
        )
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != pred.shape[:1]:
            raise ValueError(f"expected mask of shape [{pred.shape[0]}], got {mask.shape}")
        keep = mask > 0
        pred, true = pred[keep], true[keep]
    if not (np.isfinite(pred).all() and np.isfinite(true).all()):
        raise ValueError("coordinates must be finite (NaN or inf found)")
    return pred, true


def kabsch(
    mobile: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rotation ``R [3, 3]`` and translation ``t [3]`` minimizing
    ``sum_i w_i |R mobile_i + t - target_i|^2`` (a proper rotation, det R = +1).

    mobile, target: ``[N, 3]``; weights: ``[N]`` (default all 1). Needs at least one point; with
    fewer than three non-collinear points the rotation is one of the optimal ones.
    """
    mobile = np.asarray(mobile, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    w = np.ones(len(mobile)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError("kabsch needs at least one point with positive weight")
    w = w / w.sum()
    mu_m = w @ mobile  # [3]
    mu_t = w @ target
    cov = (mobile - mu_m).T @ ((target - mu_t) * w[:, None])  # [3, 3] sum_i w_i m_i t_i^T
    u, _, vt = np.linalg.svd(cov)
    # Flip the last singular direction if the best orthogonal map is a reflection.
    d = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    rot = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    return rot, mu_t - rot @ mu_m


def superpose(
    mobile: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    """``mobile [N, 3]`` moved onto ``target`` by the Kabsch fit over the masked residues."""
    rot, t = kabsch(*_prepare(mobile, target, mask))
    return np.asarray(mobile, dtype=np.float64) @ rot.T + t


def rmsd(
    pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None = None, *, align: bool = True
) -> float:
    """Root-mean-square deviation in A over the masked residues, after optimal superposition
    (Kabsch) unless ``align=False``."""
    p, t = _prepare(pred, true, mask)
    if len(p) == 0:
        raise ValueError("rmsd of an empty structure (mask selects no residue)")
    if align:
        rot, tr = kabsch(p, t)
        p = p @ rot.T + tr
    return float(np.sqrt(np.mean(np.sum((p - t) ** 2, axis=-1))))


def lddt_ca(
    pred: np.ndarray,
    true: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    cutoff: float = 15.0,
    per_residue: bool = False,
) -> float | np.ndarray:
    """lDDT of one atom per residue (CA), superposition-free, in [0, 1].

    Pairs: distinct residues closer than ``cutoff`` in ``true``, both present in ``mask``.
    ``per_residue=True`` returns ``[N]`` scores (NaN for a residue with no pair); otherwise the
    average over all scored pairs (1.0 when there are none is *not* assumed: NaN is returned).
    """
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    _prepare(pred, true, mask)  # shape and finiteness checks
    m = np.ones(len(pred)) if mask is None else (np.asarray(mask) > 0).astype(np.float64)
    d_true = np.linalg.norm(true[:, None] - true[None], axis=-1)  # [N, N]
    d_pred = np.linalg.norm(pred[:, None] - pred[None], axis=-1)
    scored = (d_true < cutoff) * m[:, None] * m[None, :] * (1.0 - np.eye(len(pred)))
    err = np.abs(d_true - d_pred)
    score = np.mean([err < t for t in LDDT_THRESHOLDS], axis=0)  # [N, N]
    if per_residue:
        n_pairs = scored.sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n_pairs > 0, (scored * score).sum(-1) / n_pairs, np.nan)
    total = scored.sum()
    return float((scored * score).sum() / total) if total > 0 else float("nan")


def tm_d0(length: int) -> float:
    """TM-score's distance scale ``d0(L) = 1.24 (L - 15)^(1/3) - 1.8``, at least 0.5 A."""
    if length <= 21:  # the formula is < 0.5 (or undefined) for short chains
        return 0.5
    return max(0.5, 1.24 * (length - 15) ** (1.0 / 3.0) - 1.8)


def _seeds(n: int, min_len: int = 4) -> Iterable[np.ndarray]:
    """Index sets of contiguous fragments of length n, n/2, n/4, ... (>= min_len), slid along the
    chain with a step of half the fragment (all residues when n < min_len)."""
    if n <= min_len:
        yield np.arange(n)
        return
    length = n
    while length >= min_len:
        step = max(1, length // 2)
        starts = list(range(0, n - length + 1, step))
        if starts[-1] != n - length:
            starts.append(n - length)
        for s in starts:
            yield np.arange(s, s + length)
        length //= 2


def _search(
    p: np.ndarray, t: np.ndarray, score_fn, select_fn
) -> float:
    """Best ``score_fn(distances)`` over the seed superpositions and their refinements, where
    refinement re-fits on ``select_fn(distances)`` (a boolean selection) until it is stable."""
    best = -np.inf
    for seed in _seeds(len(p)):
        sel = np.zeros(len(p), dtype=bool)
        sel[seed] = True
        for _ in range(_MAX_REFINE):
            rot, tr = kabsch(p[sel], t[sel])
            dist = np.linalg.norm(p @ rot.T + tr - t, axis=-1)
            best = max(best, score_fn(dist))
            new = select_fn(dist)
            if new.sum() < 3 or np.array_equal(new, sel):
                break
            sel = new
    return float(best)


def tm_score(
    pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None = None, *,
    length: int | None = None,
) -> float:
    """TM-score of ``pred`` against ``true`` (normalized by ``length``, default the number of
    residues present in ``true``), maximized over superpositions (see the module docstring)."""
    p, t = _prepare(pred, true, mask)
    n_norm = len(t) if length is None else length
    if len(p) == 0 or n_norm < 1:
        raise ValueError("tm_score of an empty structure (mask selects no residue)")
    d0 = tm_d0(n_norm)
    # The TM-score program's search radius: d0 clamped to [4.5, 8] A.
    d_search = min(max(d0, 4.5), 8.0)

    def score(dist: np.ndarray) -> float:
        return float(np.sum(1.0 / (1.0 + (dist / d0) ** 2)) / n_norm)

    def select(dist: np.ndarray) -> np.ndarray:
        cut = d_search
        sel = dist < cut
        while sel.sum() < 3 and cut < 1e4:  # widen until a superposition is defined
            cut += 0.5
            sel = dist < cut
        return sel

    if len(p) < 3:
        rot, tr = kabsch(p, t)
        return score(np.linalg.norm(p @ rot.T + tr - t, axis=-1))
    return _search(p, t, score, select)


def gdt(
    pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None = None, *,
    cutoffs: Iterable[float] = GDT_TS_CUTOFFS,
) -> float:
    """Mean over ``cutoffs`` of the largest fraction of residues within the cutoff under one
    superposition (searched per cutoff); the fraction is of the residues present in ``true``."""
    p, t = _prepare(pred, true, mask)
    if len(p) == 0:
        raise ValueError("gdt of an empty structure (mask selects no residue)")
    fractions = []
    for c in cutoffs:
        if len(p) < 3:
            rot, tr = kabsch(p, t)
            fractions.append(float(np.mean(np.linalg.norm(p @ rot.T + tr - t, axis=-1) < c)))
            continue
        fractions.append(_search(p, t, lambda d, c=c: float(np.mean(d < c)),
                                 lambda d, c=c: d < c))
    return float(np.mean(fractions))


def gdt_ts(pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None = None) -> float:
    """GDT-TS: :func:`gdt` over the cutoffs 1, 2, 4, 8 A, in [0, 1]."""
    return gdt(pred, true, mask, cutoffs=GDT_TS_CUTOFFS)


def gdt_ha(pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None = None) -> float:
    """GDT-HA (high accuracy): :func:`gdt` over the cutoffs 0.5, 1, 2, 4 A, in [0, 1]."""
    return gdt(pred, true, mask, cutoffs=GDT_HA_CUTOFFS)
