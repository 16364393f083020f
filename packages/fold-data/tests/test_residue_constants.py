"""Residue constants: consistency of the tables, geometry against real structures and the
Engh & Huber stereochemistry table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.af2.ground_truth import atom37_to_torsion_angles, make_ground_truth
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo" / "mmcifs"


def test_alphabets_and_sizes():
    assert "".join(rc.restypes) == "ARNDCQEGHILKMFPSTWYV"
    assert rc.restype_num == 20 and rc.unk_restype_index == 20
    assert rc.atom_type_num == 37 and rc.atom_types[-1] == "OXT"
    assert rc.atom_types[:5] == ["N", "CA", "C", "CB", "O"]
    assert all(len(v) == 14 for v in rc.restype_name_to_atom14_names.values())
    assert rc.chi_angles_mask.shape == (21, 4)
    assert rc.chi_angles_mask.sum(1).tolist()[:5] == [0, 4, 2, 2, 1]  # A R N D C
    # HHblits ids map onto ours letter by letter; gap -> 21.
    for hh_id, letter in rc.ID_TO_HHBLITS_AA.items():
        ours = rc.MAP_HHBLITS_AATYPE_TO_OUR_AATYPE[hh_id]
        assert rc.restypes_with_x_and_gap[ours] == letter
    assert rc.sequence_to_aatype("ARX-u").tolist() == [0, 1, 20, 20, 20]


def test_index_maps_are_inverse():
    for aa in range(20):
        for slot in np.nonzero(rc.restype_atom14_mask[aa])[0]:
            a37 = rc.restype_atom14_to_atom37[aa, slot]
            assert rc.restype_atom37_mask[aa, a37] == 1
            assert rc.restype_atom37_to_atom14[aa, a37] == slot
    assert rc.restype_atom14_mask.sum() == rc.restype_atom37_mask.sum()
    assert rc.restype_atom14_mask[20].sum() == 0
    # The swap permutation is an involution that only moves ambiguous atoms.
    swap = rc.restype_atom14_ambiguous_atoms_swap_idx
    assert np.array_equal(np.take_along_axis(swap, swap, 1), np.tile(np.arange(14), (21, 1)))
    moved = swap != np.arange(14)
    assert np.array_equal(moved, rc.restype_atom14_ambiguous_atoms > 0)
    assert rc.restype_atom14_ambiguous_atoms.sum() == 2 + 2 + 4 + 4


def test_default_frames_are_rigid():
    f = rc.restype_rigid_group_default_frame.astype(np.float64)
    rot = f[..., :3, :3]
    eye = np.broadcast_to(np.eye(3), rot.shape)
    assert np.allclose(rot @ np.swapaxes(rot, -1, -2), eye, atol=1e-6)
    assert np.allclose(np.linalg.det(rot), 1.0, atol=1e-6)
    assert np.allclose(f[..., 3, :], [0, 0, 0, 1])


def _ideal_residue(resname: str) -> dict[str, np.ndarray]:
    """Global atom positions of a residue at all torsions 0, from the default frames."""
    aa = rc.resname_to_idx[resname]
    dflt = rc.restype_rigid_group_default_frame[aa].astype(np.float64)
    frames = [np.eye(4)] * 8
    for g in range(1, 8):
        frames[g] = (frames[0] if g <= 4 else frames[g - 1]) @ dflt[g]
    return {
        name: (frames[g] @ np.array([*pos, 1.0]))[:3]
        for name, g, pos in rc.rigid_group_atom_positions[resname]
    }


def test_literature_positions_agree_with_stereo_table():
    bonds, virtual_bonds, angles = rc.load_stereo_chemical_props()
    checked = 0
    for resname in rc.residue_atoms:
        pos = _ideal_residue(resname)
        for b in bonds[resname]:
            if resname == "PRO" and {b.atom1_name, b.atom2_name} == {"CD", "N"}:
                continue  # ring closure depends on the pucker (chi angles), not on one frame
            d = np.linalg.norm(pos[b.atom1_name] - pos[b.atom2_name])
            assert abs(d - b.length) < 3 * b.stddev, (resname, b, d)
            checked += 1
        names = set(rc.residue_atoms[resname])
        for a in angles[resname]:
            assert {a.atom1_name, a.atom2_name, a.atom3_name} <= names | {"N"}
    assert checked > 150
    # Virtual 1-3 bonds: law of cosines, e.g. N...C across CA.
    nc = next(b for b in virtual_bonds["ALA"] if {b.atom1_name, b.atom2_name} == {"N", "C"})
    assert 2.4 < nc.length < 2.6 and 0 < nc.stddev < 0.1


def test_virtual_bond_stddev_adds_in_quadrature_like_af2():
    """AF2's load_stereo_chemical_props: c = sqrt(a^2 + b^2 - 2ab cos g), errors propagated as
    uncorrelated (partials of c^2 / 2c, squared and summed), for every 1-3 pair of the table."""
    bonds, virtual_bonds, angles = rc.load_stereo_chemical_props()
    for resname, table in angles.items():
        length = {frozenset((b.atom1_name, b.atom2_name)): b for b in bonds[resname]}
        for ang, virtual in zip(table, virtual_bonds[resname]):
            b1 = length[frozenset((ang.atom1_name, ang.atom2_name))]
            b2 = length[frozenset((ang.atom2_name, ang.atom3_name))]
            g = ang.angle_rad
            c = np.sqrt(b1.length**2 + b2.length**2 - 2 * b1.length * b2.length * np.cos(g))
            dl_outer = 0.5 / c
            dl_dgamma = 2 * b1.length * b2.length * np.sin(g) * dl_outer
            dl_db1 = (2 * b1.length - 2 * b2.length * np.cos(g)) * dl_outer
            dl_db2 = (2 * b2.length - 2 * b1.length * np.cos(g)) * dl_outer
            stddev = np.sqrt((dl_dgamma * ang.stddev) ** 2 + (dl_db1 * b1.stddev) ** 2
                             + (dl_db2 * b2.stddev) ** 2)
            assert (virtual.atom1_name, virtual.atom2_name) == (ang.atom1_name, ang.atom3_name)
            assert virtual.length == pytest.approx(c, rel=1e-12)
            assert virtual.stddev == pytest.approx(stddev, rel=1e-12)


def test_every_bond_graph_angle_is_in_the_table():
    bonds, _, angles = rc.load_stereo_chemical_props()
    for resname in rc.residue_atoms:
        graph: dict[str, set[str]] = {}
        for b in bonds[resname]:
            graph.setdefault(b.atom1_name, set()).add(b.atom2_name)
            graph.setdefault(b.atom2_name, set()).add(b.atom1_name)
        expected = {
            (min(a, c), v, max(a, c)) for v, nb in graph.items() for a in nb for c in nb if a < c
        }
        got = {(min(a.atom1_name, a.atom3_name), a.atom2_name, max(a.atom1_name, a.atom3_name))
               for a in angles[resname]}
        assert got == expected, resname


def test_bond_bounds():
    lo, hi = rc.restype_atom14_bond_lower_bound, rc.restype_atom14_bond_upper_bound
    assert lo.shape == hi.shape == (21, 14, 14)
    assert np.array_equal(lo, np.swapaxes(lo, 1, 2)) and np.all(lo <= hi)
    ala = rc.resname_to_idx["ALA"]
    assert lo[ala, 0, 1] == pytest.approx(1.458 - 15 * 0.019, abs=1e-5)  # N-CA bond
    assert hi[ala, 0, 3] == pytest.approx(1e10)  # N..O: non-bonded, no upper bound
    assert lo[ala, 0, 3] == pytest.approx(1.55 + 1.52 - 1.5)


def test_stereo_table_errors(tmp_path):
    bad = tmp_path / "stereo.txt"
    bad.write_text("Bond Residue Mean StdDev\nN-CA ALA 1.458\n-\n")
    with pytest.raises(InputError, match="line 2"):
        rc.load_stereo_chemical_props(bad)
    bad.write_text("Bond Residue Mean StdDev\nN-CA ALA 1.458 0.019\n")
    with pytest.raises(InputError, match="truncated"):
        rc.load_stereo_chemical_props(bad)


def _rebuild(aatype, backbone, sin_cos):
    """Atom14 positions from the backbone frame and torsions (supplement Alg. 24 + 1.8)."""
    s, c = sin_cos[..., 0], sin_cos[..., 1]
    rot = np.zeros(sin_cos.shape[:-1] + (4, 4))
    rot[..., 0, 0] = rot[..., 3, 3] = 1.0
    rot[..., 1, 1], rot[..., 1, 2], rot[..., 2, 1], rot[..., 2, 2] = c, -s, s, c
    dflt = rc.restype_rigid_group_default_frame[aatype].astype(np.float64)
    frames = np.zeros((len(aatype), 8, 4, 4))
    frames[:, 0] = backbone
    for g in range(1, 8):
        parent = frames[:, 0] if g <= 4 else frames[:, g - 1]
        frames[:, g] = parent @ dflt[:, g] @ rot[:, g - 1]
    group = rc.restype_atom14_to_rigid_group[aatype]
    local = rc.restype_atom14_rigid_group_positions[aatype].astype(np.float64)
    f = frames[np.arange(len(aatype))[:, None], group]
    return np.einsum("nkij,nkj->nki", f[..., :3, :3], local) + f[..., :3, 3], frames


@pytest.mark.parametrize("pdb", ["4zey", "3u8v"])
def test_rebuild_real_side_chains(pdb):
    chain = parse_mmcif(DEMO / f"{pdb}.cif").get_chain("A")
    aatype = chain.aatype
    gt = make_ground_truth(aatype, chain.atom37_positions, chain.atom37_mask)
    sin_cos, _, tmask = atom37_to_torsion_angles(aatype, chain.atom37_positions, chain.atom37_mask)
    pos, _ = _rebuild(aatype, gt["backbone_rigid_tensor"].astype(np.float64), sin_cos)
    complete = (tmask[:, 2] > 0) & np.all(tmask[:, 3:] >= rc.chi_angles_mask[aatype], axis=1)
    # ARG's NH1/NH2 are not symmetry-corrected by AF2 and some entries name them the other way.
    complete &= aatype != rc.restype_order["R"]
    m = gt["atom14_gt_exists"] * complete[:, None]
    d2 = np.sum((pos - gt["atom14_gt_positions"]) ** 2, axis=-1)
    assert m.sum() > 400
    rmsd = np.sqrt((d2 * m).sum() / m.sum())
    assert rmsd < 0.3, rmsd
