"""AF2 ground truth: schema, frames, torsions, invariance, ambiguous renaming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.af2.ground_truth import (
    atom37_to_torsion_angles,
    make_ground_truth,
    make_pseudo_beta,
    rigid_from_3_points,
)
from fold_data.af2.schema import _GROUND_TRUTH
from fold_data.mmcif import parse_mmcif

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo" / "mmcifs"


@pytest.fixture(scope="module")
def chain():
    c = parse_mmcif(DEMO / "3u8v.cif").get_chain("A")  # partially modelled, altlocs, 93 res
    return c.aatype, c.atom37_positions, c.atom37_mask


def _dihedral(p0, p1, p2, p3):
    """IUPAC dihedral angle in radians (independent formula: normals of the two planes)."""
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1 = b1 / np.linalg.norm(b1)
    v = b0 - np.dot(b0, b1) * b1
    w = b2 - np.dot(b2, b1) * b1
    return np.arctan2(np.dot(np.cross(b1, v), w), np.dot(v, w))


def _random_rigid(rng):
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    a, b, c, d = q
    rot = np.array([
        [a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
        [2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b)],
        [2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d],
    ])
    return rot, rng.normal(size=3) * 20.0


def test_schema_names_dtypes_shapes(chain):
    aatype, pos, mask = chain
    gt = make_ground_truth(aatype, pos, mask)
    n = len(aatype)
    # "resolution" is a header fact of the mmCIF, not computed from the atoms.
    rows = [row for row in _GROUND_TRUTH if row[0] != "resolution"]
    assert set(gt) == {row[0] for row in rows}
    for name, dtype, shape, _ in rows:
        want = tuple(n if d == "N_res" else d for d in shape)
        assert gt[name].dtype == np.dtype(dtype), name
        assert gt[name].shape == want, name
        assert np.isfinite(gt[name]).all(), name


def test_frames_orthonormal_and_backbone_convention(chain):
    aatype, pos, mask = chain
    gt = make_ground_truth(aatype, pos, mask)
    f = gt["rigidgroups_gt_frames"].astype(np.float64)
    ex = gt["rigidgroups_gt_exists"] > 0
    rot = f[ex][:, :3, :3]
    assert np.allclose(rot @ np.swapaxes(rot, 1, 2), np.eye(3), atol=1e-5)
    assert np.allclose(np.linalg.det(rot), 1.0, atol=1e-5)
    # Backbone frame: origin CA, C on +x, N in the xy plane with y > 0.
    bb = gt["backbone_rigid_tensor"].astype(np.float64)
    ok = gt["backbone_rigid_mask"] > 0
    assert ok.sum() > 70 and (~ok).sum() > 0
    rel = lambda atom: np.einsum(  # noqa: E731
        "nji,nj->ni", bb[ok, :3, :3], pos[ok, rc.atom_order[atom]] - bb[ok, :3, 3]
    )
    c_local, n_local = rel("C"), rel("N")
    assert np.allclose(c_local[:, 1:], 0, atol=1e-4) and (c_local[:, 0] > 1.4).all()
    assert np.allclose(n_local[:, 2], 0, atol=1e-4) and (n_local[:, 1] > 1.2).all()
    # Missing groups are identity frames.
    assert np.allclose(f[~ex], np.eye(4))


def test_chi_angles_match_direct_dihedrals(chain):
    aatype, pos, mask = chain
    sin_cos, _, tmask = atom37_to_torsion_angles(aatype, pos, mask)
    checked = 0
    for i in range(len(aatype)):
        resname = rc.resnames[aatype[i]]
        for k, atoms in enumerate(rc.chi_angles_atoms.get(resname, [])):
            if not tmask[i, 3 + k]:
                continue
            p = [pos[i, rc.atom_order[a]].astype(np.float64) for a in atoms]
            chi = _dihedral(*p)
            assert sin_cos[i, 3 + k] == pytest.approx([np.sin(chi), np.cos(chi)], abs=1e-5)
            checked += 1
        if i > 0 and tmask[i, 1]:  # phi: C(i-1), N, CA, C
            p = [pos[i - 1, 2], pos[i, 0], pos[i, 1], pos[i, 2]]
            phi = _dihedral(*[x.astype(np.float64) for x in p])
            assert sin_cos[i, 1] == pytest.approx([np.sin(phi), np.cos(phi)], abs=1e-5)
    assert checked > 100
    norm = np.sum(sin_cos**2, -1)
    assert np.all(np.abs(norm[tmask > 0] - 1) < 1e-5)
    assert np.all(norm[tmask == 0] == 0)
    assert tmask[0, 0] == 0 and tmask[0, 1] == 0  # no previous residue


def test_rigid_motion_invariance(chain):
    aatype, pos, mask = chain
    rng = np.random.default_rng(0)
    rot, trans = _random_rigid(rng)
    moved = (pos.astype(np.float64) @ rot.T + trans) * mask[..., None]
    a = make_ground_truth(aatype, pos, mask)
    b = make_ground_truth(aatype, moved, mask)
    assert np.allclose(a["chi_angles_sin_cos"], b["chi_angles_sin_cos"], atol=1e-4)
    m4 = np.eye(4)
    m4[:3, :3], m4[:3, 3] = rot, trans
    ex = a["rigidgroups_gt_exists"] > 0
    expect = m4 @ a["rigidgroups_gt_frames"].astype(np.float64)[ex]
    assert np.allclose(b["rigidgroups_gt_frames"][ex], expect, atol=2e-3)
    assert np.allclose(b["pseudo_beta"], (a["pseudo_beta"] @ rot.T + trans)
                       * a["pseudo_beta_mask"][:, None], atol=2e-3)


def test_ambiguous_renaming_and_alt_frames(chain):
    aatype, pos, mask = chain
    gt = make_ground_truth(aatype, pos, mask)
    sin_cos, alt, _ = atom37_to_torsion_angles(aatype, pos, mask)
    for i, aa in enumerate(aatype):
        resname = rc.resnames[aa]
        names = rc.restype_name_to_atom14_names[resname]
        for a, b in rc.residue_atom_renaming_swaps.get(resname, {}).items():
            ia, ib = names.index(a), names.index(b)
            assert np.array_equal(gt["atom14_alt_gt_positions"][i, ia],
                                  gt["atom14_gt_positions"][i, ib])
            assert gt["atom14_atom_is_ambiguous"][i, ia] == 1
        last = len(rc.chi_angles_atoms.get(resname, [])) - 1
        if resname in rc.residue_atom_renaming_swaps:
            assert gt["rigidgroups_group_is_ambiguous"][i, 4 + last] == 1
            assert np.allclose(alt[i, 3 + last], -sin_cos[i, 3 + last])
            g = 4 + last
            f, fa = gt["rigidgroups_gt_frames"][i, g], gt["rigidgroups_alt_gt_frames"][i, g]
            assert np.allclose(fa[:3, 0], f[:3, 0]) and np.allclose(fa[:3, 1:3], -f[:3, 1:3])
    # Swapped atoms give the same frame, rotated by pi: rename OD1/OD2 of every ASP.
    asp = np.nonzero(aatype == rc.restype_order["D"])[0]
    assert len(asp) > 0
    swapped = pos.copy()
    o1, o2 = rc.atom_order["OD1"], rc.atom_order["OD2"]
    swapped[asp, o1], swapped[asp, o2] = pos[asp, o2], pos[asp, o1]
    s = make_ground_truth(aatype, swapped, mask)
    ok = gt["rigidgroups_gt_exists"][asp, 5] > 0
    assert np.allclose(s["chi_angles_sin_cos"][asp[ok], 1], -gt["chi_angles_sin_cos"][asp[ok], 1],
                       atol=0.1)  # OD1/OD2 are not exactly 180 degrees apart in real data


def test_atom14_gathers_atom37(chain):
    aatype, pos, mask = chain
    gt = make_ground_truth(aatype, pos, mask)
    idx = gt["residx_atom14_to_atom37"]
    rows = np.arange(len(aatype))[:, None]
    m = gt["atom14_gt_exists"]
    assert np.array_equal(gt["atom14_gt_positions"] * m[..., None],
                          pos[rows, idx] * m[..., None])
    assert np.all(m <= gt["atom14_atom_exists"])
    assert gt["atom14_gt_exists"].sum() == gt["all_atom_mask"].sum() - gt["all_atom_mask"][
        :, rc.atom_order["OXT"]].sum()


def test_pseudo_beta_glycine_and_random_holes():
    rng = np.random.default_rng(1)
    n = 13
    aatype = rng.integers(0, 21, size=n)
    aatype[3] = rc.restype_order["G"]
    pos = rng.normal(size=(n, 37, 3)) * 5
    mask = (rng.random((n, 37)) > 0.3).astype(np.float32)
    mask[3, rc.atom_order["CA"]] = 1
    pb, pbm = make_pseudo_beta(aatype, pos, mask)
    assert np.allclose(pb[3], pos[3, rc.atom_order["CA"]])
    cb = rc.atom_order["CB"]
    for i in range(n):
        if aatype[i] != rc.restype_order["G"]:
            assert pbm[i] == mask[i, cb]
    gt = make_ground_truth(aatype, pos, mask)  # random coordinates: still finite, masked
    for k, v in gt.items():
        assert np.isfinite(v).all(), k
    assert np.all(gt["all_atom_mask"] <= mask)


def test_rigid_from_3_points_alg21():
    rng = np.random.default_rng(2)
    x1, x2, x3 = rng.normal(size=(3, 5, 3))
    f = rigid_from_3_points(x1, x2, x3)
    e1 = (x3 - x2) / np.linalg.norm(x3 - x2, axis=-1, keepdims=True)
    assert np.allclose(f[:, :3, 0], e1, atol=1e-6)
    assert np.allclose(f[:, :3, 3], x2)
    local_x1 = np.einsum("nji,nj->ni", f[:, :3, :3], x1 - x2)
    assert np.allclose(local_x1[:, 2], 0, atol=1e-6) and (local_x1[:, 1] > 0).all()


def test_bad_shapes():
    with pytest.raises(ValueError, match="expected aatype"):
        make_ground_truth(np.zeros(3, int), np.zeros((3, 14, 3)), np.zeros((3, 14)))
