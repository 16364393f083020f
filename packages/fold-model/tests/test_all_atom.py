"""Torsions -> rigid-group frames -> atom14/atom37 (Alg. 24) vs literature and real geometry."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fold_data import residue_constants as rc
from fold_model.af2.all_atom import (
    atom14_to_atom37,
    frames_to_atom14_positions,
    torsion_angles_to_frames,
)
from fold_model.geometry import Rigid

REPO = Path(__file__).resolve().parents[3]
DEMO_4ZEY = REPO / "data" / "demo" / "mmcifs" / "4zey.cif"


def _identity_torsions(shape: tuple[int, ...]) -> torch.Tensor:
    angles = torch.zeros(*shape, 7, 2, dtype=torch.float64)
    angles[..., 1] = 1.0  # (sin 0, cos 0)
    return angles


def test_zero_torsions_give_literature_positions_for_every_residue_type() -> None:
    aatype = torch.arange(20)
    backbone = Rigid.identity((20,), dtype=torch.float64)
    frames = torsion_angles_to_frames(backbone, _identity_torsions((20,)), aatype)
    atom14 = frames_to_atom14_positions(frames, aatype).numpy()
    for aa in range(20):
        resname = rc.resnames[aa]
        names14 = rc.restype_name_to_atom14_names[resname]
        # Reference: each group's default frame chained through its parents (numpy, float64).
        default = rc.restype_rigid_group_default_frame[aa].astype(np.float64)
        group_frame = {g: default[g] for g in range(5)}
        for g in range(5, 8):
            group_frame[g] = group_frame[g - 1] @ default[g]
        for name, group, pos in rc.rigid_group_atom_positions[resname]:
            expected = (group_frame[group] @ np.array([*pos, 1.0]))[:3]
            np.testing.assert_allclose(atom14[aa, names14.index(name)], expected, atol=1e-5,
                                       err_msg=f"{resname} {name}")
            if group == 0:  # backbone atoms sit at their literature positions unchanged
                np.testing.assert_allclose(atom14[aa, names14.index(name)], pos, atol=1e-6)
        # absent slots are zero
        absent = rc.restype_atom14_mask[aa] == 0
        assert np.all(atom14[aa, absent] == 0.0)


def _angle(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    u, v = a - b, c - b
    return math.acos(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v))


def _closes_proline_ring(resname: str, atoms: tuple[str, ...]) -> bool:
    # The proline CD-N bond closes a ring across the chi1/chi2 joints: it is only ideal for
    # the ring's own torsions, not for random ones.
    return resname == "PRO" and "CD" in atoms and "N" in atoms


def test_random_torsions_keep_literature_bond_lengths_and_angles() -> None:
    gen = torch.Generator().manual_seed(0)
    aatype = torch.arange(20).repeat(2)  # [40]
    theta = (torch.rand(40, 7, generator=gen, dtype=torch.float64) - 0.5) * 2 * math.pi
    angles = torch.stack([theta.sin(), theta.cos()], -1)
    backbone = Rigid.from_quat_and_trans(
        torch.randn(40, 4, generator=gen, dtype=torch.float64),
        10 * torch.randn(40, 3, generator=gen, dtype=torch.float64),
    )
    atom14 = frames_to_atom14_positions(
        torsion_angles_to_frames(backbone, angles, aatype), aatype
    ).numpy()
    bonds, _, bond_angles = rc.load_stereo_chemical_props()
    checked = 0
    for r, aa in enumerate(aatype.tolist()):
        resname = rc.resnames[aa]
        names14 = rc.restype_name_to_atom14_names[resname]
        xyz = {n: atom14[r, i] for i, n in enumerate(names14) if n}
        for b in bonds[resname]:
            if _closes_proline_ring(resname, (b.atom1_name, b.atom2_name)):
                continue
            d = np.linalg.norm(xyz[b.atom1_name] - xyz[b.atom2_name])
            # literature positions are rounded to 1e-3 A and idealised: a few sigma at most
            assert abs(d - b.length) < 0.05, (resname, b)
            checked += 1
        for a in bond_angles[resname]:
            if _closes_proline_ring(resname, (a.atom1_name, a.atom2_name, a.atom3_name)):
                continue
            got = _angle(xyz[a.atom1_name], xyz[a.atom2_name], xyz[a.atom3_name])
            assert abs(got - a.angle_rad) < math.radians(4.0), (resname, a)
    assert checked > 300


def test_torsions_rotate_side_chains() -> None:
    # A chi1 change moves CG of LEU but not its backbone atoms.
    leu = torch.tensor([rc.restype_order["L"]])
    backbone = Rigid.identity((1,), dtype=torch.float64)
    a0 = _identity_torsions((1,))
    a1 = a0.clone()
    a1[0, 3] = torch.tensor([math.sin(1.0), math.cos(1.0)])
    p0 = frames_to_atom14_positions(torsion_angles_to_frames(backbone, a0, leu), leu)
    p1 = frames_to_atom14_positions(torsion_angles_to_frames(backbone, a1, leu), leu)
    names = rc.restype_name_to_atom14_names["LEU"]
    torch.testing.assert_close(p0[0, :5], p1[0, :5])  # N CA C O CB
    assert (p0[0, names.index("CG")] - p1[0, names.index("CG")]).norm() > 0.5


def test_atom14_to_atom37_round_trip() -> None:
    gen = torch.Generator().manual_seed(1)
    aatype = torch.randint(0, 21, (2, 6), generator=gen)
    atom14 = torch.randn(2, 6, 14, 3, generator=gen) * torch.from_numpy(
        rc.restype_atom14_mask
    )[aatype][..., None]
    atom37 = atom14_to_atom37(atom14, aatype)
    assert atom37.shape == (2, 6, 37, 3)
    a14_to_a37 = torch.from_numpy(rc.restype_atom14_to_atom37).long()[aatype]
    back = torch.gather(atom37, 2, a14_to_a37[..., None].expand(2, 6, 14, 3))
    torch.testing.assert_close(back * (atom14 != 0), atom14)
    # atom37 slots a residue lacks are 0
    lacks = torch.from_numpy(rc.restype_atom37_mask)[aatype] == 0
    assert torch.all(atom37[lacks] == 0)


def test_reconstruction_of_a_real_structure_from_its_torsions() -> None:
    if not DEMO_4ZEY.exists():
        pytest.skip(f"{DEMO_4ZEY} absent")
    from fold_data.af2.ground_truth import atom37_to_torsion_angles, make_ground_truth
    from fold_data.mmcif import parse_mmcif

    chain = parse_mmcif(DEMO_4ZEY).get_chain("A")
    aatype = chain.aatype.astype(np.int64)
    pos, mask = chain.atom37_positions, chain.atom37_mask
    gt = make_ground_truth(aatype, pos, mask)
    sin_cos, _, torsion_mask = atom37_to_torsion_angles(aatype, gt["all_atom_positions"],
                                                        gt["all_atom_mask"])
    aa_t = torch.from_numpy(aatype)
    backbone = Rigid.from_tensor_4x4(torch.from_numpy(gt["backbone_rigid_tensor"]).double())
    atom14 = frames_to_atom14_positions(
        torsion_angles_to_frames(backbone, torch.from_numpy(sin_cos).double(), aa_t), aa_t
    )
    # Residues with resolved backbone, psi and every chi of their type.
    needed = np.concatenate([np.ones((len(aatype), 1)), rc.chi_angles_mask[aatype]], axis=1)
    complete = (np.all(torsion_mask[:, [2, 3, 4, 5, 6]] >= needed, axis=1)
                & (gt["backbone_rigid_mask"] > 0) & (aatype < 20))
    atoms = (gt["atom14_gt_exists"] > 0) & complete[:, None]
    assert atoms.sum() > 500
    diff = atom14.numpy()[atoms] - gt["atom14_gt_positions"][atoms]
    rmsd = float(np.sqrt(np.mean(np.sum(diff**2, -1))))
    assert rmsd < 0.3, rmsd
    # CA is the frame origin (exact); N and C differ only by the idealised bond geometry
    ca = np.zeros_like(atoms)
    ca[:, 1] = atoms[:, 1]
    assert np.abs(atom14.numpy()[ca] - gt["atom14_gt_positions"][ca]).max() < 1e-4
    bb = atoms.copy()
    bb[:, 3:] = False
    assert np.abs(atom14.numpy()[bb] - gt["atom14_gt_positions"][bb]).max() < 0.2
