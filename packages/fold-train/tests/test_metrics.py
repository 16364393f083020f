"""Metrics on known cases: identical structures, rigid motions, known perturbations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from fold_train import metrics as M

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _chain(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random-walk CA trace with 3.8 A steps: ``[n, 3]``."""
    steps = rng.normal(size=(n, 3))
    steps = 3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True)
    return np.cumsum(steps, axis=0)


@pytest.fixture(scope="module")
def real_ca() -> np.ndarray:
    """CA coordinates of 4ZEY chain A (bundled real data), or a random walk if absent."""
    path = DEMO / "mmcifs" / "4zey.cif"
    if not path.exists():
        return _chain(61, np.random.default_rng(0))
    import gemmi

    st = gemmi.read_structure(str(path))
    return np.array([[a.pos.x, a.pos.y, a.pos.z] for r in st[0]["A"] for a in r
                     if a.name == "CA"])


def _horn_rmsd(p: np.ndarray, t: np.ndarray) -> float:
    """Independent reference: minimal RMSD from the quaternion eigenproblem (Horn 1987)."""
    p = p - p.mean(0)
    t = t - t.mean(0)
    s = p.T @ t
    sxx, sxy, sxz, syx, syy, syz, szx, szy, szz = s.ravel()
    k = np.array([
        [sxx + syy + szz, syz - szy, szx - sxz, sxy - syx],
        [syz - szy, sxx - syy - szz, sxy + syx, szx + sxz],
        [szx - sxz, sxy + syx, -sxx + syy - szz, syz + szy],
        [sxy - syx, szx + sxz, syz + szy, -sxx - syy + szz],
    ])
    lam = np.linalg.eigvalsh(k)[-1]
    e = (p**2).sum() + (t**2).sum() - 2 * lam
    return math.sqrt(max(e, 0.0) / len(p))


def test_identical_structures_score_perfectly(real_ca):
    assert M.rmsd(real_ca, real_ca) == pytest.approx(0.0, abs=1e-6)
    assert M.lddt_ca(real_ca, real_ca) == 1.0
    assert M.tm_score(real_ca, real_ca) == pytest.approx(1.0, abs=1e-12)
    assert M.gdt_ts(real_ca, real_ca) == 1.0
    assert M.gdt_ha(real_ca, real_ca) == 1.0


def test_known_rotation_and_translation_are_invisible(real_ca):
    rng = np.random.default_rng(1)
    rot = _rotation(rng)
    moved = real_ca @ rot.T + np.array([12.5, -40.0, 7.25])
    assert M.rmsd(moved, real_ca) == pytest.approx(0.0, abs=1e-6)
    # without superposition the RMSD is what the motion does to the points
    direct = np.sqrt(np.mean(np.sum((moved - real_ca) ** 2, -1)))
    assert M.rmsd(moved, real_ca, align=False) == pytest.approx(direct)
    r, t = M.kabsch(moved, real_ca)
    np.testing.assert_allclose(r, rot.T, atol=1e-9)
    np.testing.assert_allclose(M.superpose(moved, real_ca), real_ca, atol=1e-9)
    assert M.lddt_ca(moved, real_ca) == 1.0
    assert M.tm_score(moved, real_ca) == pytest.approx(1.0, abs=1e-12)
    assert M.gdt_ts(moved, real_ca) == 1.0


def test_kabsch_never_reflects():
    rng = np.random.default_rng(2)
    x = _chain(17, rng)
    mirrored = x * np.array([1.0, 1.0, -1.0])
    r, _ = M.kabsch(mirrored, x)
    assert np.linalg.det(r) == pytest.approx(1.0)
    # a mirror image of a non-planar chain cannot be superposed exactly
    assert M.rmsd(mirrored, x) > 0.5


def test_rmsd_matches_quaternion_reference_on_random_pairs():
    rng = np.random.default_rng(3)
    for n in (3, 7, 29):
        a, b = _chain(n, rng), _chain(n, rng)
        assert M.rmsd(a, b) == pytest.approx(_horn_rmsd(a, b), rel=1e-9, abs=1e-9)


def test_rmsd_of_a_scaled_copy_is_known():
    """A copy scaled by s about its centroid: the best rotation is the identity, so the RMSD is
    |s - 1| times the RMS radius."""
    rng = np.random.default_rng(4)
    x = _chain(23, rng)
    x = x - x.mean(0)
    radius = np.sqrt(np.mean(np.sum(x**2, -1)))
    assert M.rmsd(1.1 * x, x) == pytest.approx(0.1 * radius, rel=1e-9)


def test_mask_drops_residues():
    rng = np.random.default_rng(5)
    x = _chain(19, rng)
    y = x.copy()
    y[[3, 11]] += 50.0  # garbage in the masked-out residues must not matter
    mask = np.ones(19)
    mask[[3, 11]] = 0
    assert M.rmsd(y, x, mask) == pytest.approx(0.0, abs=1e-6)
    assert M.lddt_ca(y, x, mask) == 1.0
    assert M.tm_score(y, x, mask) == pytest.approx(1.0)
    assert M.gdt_ts(y, x, mask) == 1.0


def test_lddt_hand_computed_case():
    """Three CAs on a line at 0, 5, 10 A; the last moved out by 0.7 A. Pairs (0,2) and (1,2)
    change by 0.7 (passes 1, 2, 4 A: 3/4), pair (0,1) is exact: (1 + 0.75 + 0.75) / 3."""
    true = np.array([[0.0, 0, 0], [5.0, 0, 0], [10.0, 0, 0]])
    pred = true.copy()
    pred[2, 0] = 10.7
    assert M.lddt_ca(pred, true) == pytest.approx((1 + 0.75 + 0.75) / 3)
    np.testing.assert_allclose(M.lddt_ca(pred, true, per_residue=True), [0.875, 0.875, 0.75])
    # pairs beyond the 15 A inclusion radius (in the truth) do not count
    far = np.array([[0.0, 0, 0], [5.0, 0, 0], [20.0, 0, 0]])
    moved = far.copy()
    moved[2, 0] = 40.0
    assert M.lddt_ca(moved, far) == 1.0  # only pair (0, 1) is scored


def test_lddt_agrees_with_fold_model():
    torch = pytest.importorskip("torch")
    from fold_model.af2.metrics import lddt

    rng = np.random.default_rng(6)
    true = _chain(31, rng)
    pred = true + rng.normal(scale=1.5, size=true.shape)
    mask = (rng.random(31) > 0.2).astype(np.float64)
    ref = lddt(torch.from_numpy(pred), torch.from_numpy(true), torch.from_numpy(mask),
               per_residue=False)
    assert M.lddt_ca(pred, true, mask) == pytest.approx(float(ref), abs=1e-9)


def test_outliers_give_the_analytic_tm_and_gdt(real_ca):
    """A rigid core with k residues thrown 100 A away: the best superposition is the core's, so
    TM = ((L - k) + k / (1 + (100 / d0)^2)) / L and every GDT fraction is (L - k) / L."""
    n = len(real_ca)
    rng = np.random.default_rng(7)
    k = n // 4
    idx = rng.choice(n, size=k, replace=False)
    direction = rng.normal(size=(k, 3))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    pred = real_ca.copy()
    pred[idx] += 100.0 * direction
    pred = pred @ _rotation(rng).T + 3.0
    d0 = M.tm_d0(n)
    expected_tm = ((n - k) + k / (1 + (100.0 / d0) ** 2)) / n
    assert M.tm_score(pred, real_ca) == pytest.approx(expected_tm, abs=1e-5)
    assert M.gdt_ts(pred, real_ca) == pytest.approx((n - k) / n)
    assert M.gdt_ha(pred, real_ca) == pytest.approx((n - k) / n)
    # Kabsch on everything is pulled by the outliers: the search must beat it
    aligned = M.superpose(pred, real_ca)
    all_fit = np.mean(1 / (1 + (np.linalg.norm(aligned - real_ca, axis=-1) / d0) ** 2))
    assert M.tm_score(pred, real_ca) > all_fit


def test_tm_d0_formula():
    assert M.tm_d0(100) == pytest.approx(1.24 * 85 ** (1 / 3) - 1.8)
    assert M.tm_d0(10) == 0.5
    assert M.tm_d0(22) == pytest.approx(max(0.5, 1.24 * 7 ** (1 / 3) - 1.8))


def test_noisy_structure_scores_are_ordered_and_bounded():
    rng = np.random.default_rng(8)
    true = _chain(40, rng)
    scores = []
    for noise in (0.3, 1.5, 4.0):
        pred = true + rng.normal(scale=noise, size=true.shape)
        tm, ts, ha = M.tm_score(pred, true), M.gdt_ts(pred, true), M.gdt_ha(pred, true)
        assert 0 < tm <= 1 and 0 <= ha <= ts <= 1
        scores.append((tm, ts, ha, M.lddt_ca(pred, true)))
    for a, b in zip(scores, scores[1:]):
        assert all(x > y for x, y in zip(a, b))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one shape"):
        M.rmsd(np.zeros((4, 3)), np.zeros((5, 3)))
    bad = np.ones((4, 3))
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        M.tm_score(bad, np.ones((4, 3)))
    with pytest.raises(ValueError, match="empty"):
        M.rmsd(np.ones((4, 3)), np.ones((4, 3)), np.zeros(4))
