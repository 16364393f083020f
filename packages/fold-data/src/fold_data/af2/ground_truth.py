"""Ground truth for the AF2 losses, from atom37 coordinates (numpy, deterministic).

AF2 supplement references:

* 1.2.1: atom14 representation; 1.9.3: ambiguous atoms and their renaming (the "alt" arrays);
* 1.8 and Alg. 21 (``rigid_from_3_points``): the 8 rigid-group frames per residue, built by
  Gram-Schmidt from three atoms each;
* Alg. 24 conventions: torsions omega (pre-omega), phi, psi, chi1-chi4 as (sin, cos).

Frames are homogeneous 4x4 matrices ``[..., 4, 4]``: rotation in ``[:3, :3]`` (columns are the
frame's axes in global coordinates), translation in ``[:3, 3]``, last row ``0 0 0 1``. Frames of
groups whose atoms are missing are the identity (and masked out).
"""

from __future__ import annotations

import numpy as np

from fold_data import residue_constants as rc

__all__ = [
    "atom37_to_frames",
    "atom37_to_torsion_angles",
    "make_atom14",
    "make_ground_truth",
    "make_pseudo_beta",
    "rigid_from_3_points",
]

_EPS = 1e-8


def _build_group_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per residue type: atom37 indices of the 3 atoms defining each ground-truth frame.

    Returns ``base_atom37_idx`` [21, 8, 3] int, ``group_mask`` [21, 8], ``is_ambiguous`` [21, 8]
    and ``ambiguity_rot`` [21, 8, 3, 3].

    The three atoms are (point on the -x axis, origin, point in the xy plane with y > 0):
    backbone (group 0) C, CA, N, flipped afterwards so that C is on +x (see ``atom37_to_frames``);
    psi (group 3) CA, C, O; chi k (group 4 + k) the last three atoms of the chi, so that the
    chi's fourth atom lies in the xy plane as in ``rigid_group_atom_positions``. Groups 1 and 2
    (pre-omega, phi) have no ground-truth frame.
    """
    n = rc.restype_num + 1
    base = np.zeros((n, 8, 3), dtype=np.int64)
    group_mask = np.zeros((n, 8), dtype=np.float32)
    ambiguous = np.zeros((n, 8), dtype=np.float32)
    rots = np.tile(np.eye(3, dtype=np.float32), (n, 8, 1, 1))
    for aa in range(rc.restype_num):
        resname = rc.resnames[aa]
        base[aa, 0] = [rc.atom_order[a] for a in ("C", "CA", "N")]
        base[aa, 3] = [rc.atom_order[a] for a in ("CA", "C", "O")]
        group_mask[aa, [0, 3]] = 1.0
        chis = rc.chi_angles_atoms[resname]
        for k, atoms in enumerate(chis):
            base[aa, 4 + k] = [rc.atom_order[a] for a in atoms[1:]]
            group_mask[aa, 4 + k] = 1.0
        if resname in rc.residue_atom_renaming_swaps:
            # The last chi of ASP, GLU, PHE, TYR is pi-periodic: renaming the symmetric atoms
            # is a 180-degree rotation of that group's frame about its x axis.
            last = 4 + len(chis) - 1
            ambiguous[aa, last] = 1.0
            rots[aa, last] = np.diag([1.0, -1.0, -1.0])
    # UNK (row 20) has only a backbone frame.
    base[rc.unk_restype_index, 0] = [rc.atom_order[a] for a in ("C", "CA", "N")]
    base[rc.unk_restype_index, 3] = [rc.atom_order[a] for a in ("CA", "C", "O")]
    group_mask[rc.unk_restype_index, [0, 3]] = 1.0
    return base, group_mask, ambiguous, rots


(
    _GROUP_BASE_ATOM37_IDX,
    _GROUP_MASK,
    _GROUP_IS_AMBIGUOUS,
    _GROUP_AMBIGUITY_ROT,
) = _build_group_tables()


def _check_inputs(aatype: np.ndarray, positions: np.ndarray, mask: np.ndarray) -> None:
    n = aatype.shape[0]
    if aatype.ndim != 1 or positions.shape != (n, 37, 3) or mask.shape != (n, 37):
        raise ValueError(
            "expected aatype [N], positions [N, 37, 3], mask [N, 37]; got "
            f"{aatype.shape}, {positions.shape}, {mask.shape}"
        )
    if n and (aatype.min() < 0 or aatype.max() > rc.unk_restype_index):
        raise ValueError(
            f"aatype must be in 0..{rc.unk_restype_index}, got {aatype.min()}..{aatype.max()}"
        )


def rigid_from_3_points(x1: np.ndarray, x2: np.ndarray, x3: np.ndarray) -> np.ndarray:
    """Frame with origin ``x2``, x axis towards ``x3``, ``x1`` in the xy plane (y > 0).

    Supplement Alg. 21 (Gram-Schmidt): e1 = unit(x3 - x2), e2 = unit of the part of x1 - x2
    orthogonal to e1, e3 = e1 x e2. Inputs [..., 3]; returns [..., 4, 4] float64.
    """
    v1 = x3 - x2
    v2 = x1 - x2
    e1 = v1 / np.sqrt(np.sum(v1 * v1, axis=-1, keepdims=True) + _EPS)
    u2 = v2 - e1 * np.sum(e1 * v2, axis=-1, keepdims=True)
    e2 = u2 / np.sqrt(np.sum(u2 * u2, axis=-1, keepdims=True) + _EPS)
    e3 = np.cross(e1, e2)
    frames = np.zeros(x1.shape[:-1] + (4, 4), dtype=np.float64)
    frames[..., :3, :3] = np.stack([e1, e2, e3], axis=-1)  # columns e1, e2, e3
    frames[..., :3, 3] = x2
    frames[..., 3, 3] = 1.0
    return frames


def _invert_apply(frames: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Global points [..., 3] into the local coordinates of frames [..., 4, 4]."""
    rot, trans = frames[..., :3, :3], frames[..., :3, 3]
    return np.einsum("...ji,...j->...i", rot, points - trans)  # R^T (x - t)


def atom37_to_frames(
    aatype: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> dict[str, np.ndarray]:
    """The 8 rigid-group frames of each residue from its atoms (supplement 1.8).

    aatype [N] int, positions [N, 37, 3], mask [N, 37]. Returns float32 arrays
    ``rigidgroups_gt_frames`` / ``rigidgroups_alt_gt_frames`` [N, 8, 4, 4],
    ``rigidgroups_gt_exists``, ``rigidgroups_group_exists``, ``rigidgroups_group_is_ambiguous``
    [N, 8].
    """
    aatype = np.asarray(aatype, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.float64)
    mask = np.asarray(mask, dtype=np.float32)
    _check_inputs(aatype, positions, mask)
    n = aatype.shape[0]
    base_idx = _GROUP_BASE_ATOM37_IDX[aatype]  # [N, 8, 3]
    res = np.arange(n)[:, None, None]
    base_pos = positions[res, base_idx]  # [N, 8, 3 atoms, 3]
    group_exists = _GROUP_MASK[aatype]  # [N, 8]
    gt_exists = group_exists * np.min(mask[res, base_idx], axis=-1)  # all 3 atoms resolved

    # Base atoms are (point on -x, origin, point in xy): x axis = origin - first atom.
    origin = base_pos[..., 1, :]
    frames = rigid_from_3_points(
        x1=base_pos[..., 2, :], x2=origin, x3=2.0 * origin - base_pos[..., 0, :]
    )
    # Backbone: AF2 puts C on +x (not -x) with N in the xy plane; flipping x and z of the
    # (C -> CA, N) frame gives exactly that right-handed frame.
    frames[:, 0, :3, :3] = frames[:, 0, :3, :3] @ np.diag([-1.0, 1.0, -1.0])

    identity = np.eye(4)
    frames = np.where(gt_exists[..., None, None] > 0, frames, identity)
    alt_frames = frames.copy()
    alt_frames[..., :3, :3] = frames[..., :3, :3] @ _GROUP_AMBIGUITY_ROT[aatype]
    return {
        "rigidgroups_gt_frames": frames.astype(np.float32),
        "rigidgroups_gt_exists": gt_exists.astype(np.float32),
        "rigidgroups_group_exists": group_exists.astype(np.float32),
        "rigidgroups_group_is_ambiguous": _GROUP_IS_AMBIGUOUS[aatype].astype(np.float32),
        "rigidgroups_alt_gt_frames": alt_frames.astype(np.float32),
    }


def _chi_atom37_tables() -> tuple[np.ndarray, np.ndarray]:
    """[21, 4, 4] atom37 indices of each chi's atoms and [21, 4] chi existence."""
    idx = np.zeros((rc.restype_num + 1, 4, 4), dtype=np.int64)
    for aa in range(rc.restype_num):
        for k, atoms in enumerate(rc.chi_angles_atoms[rc.resnames[aa]]):
            idx[aa, k] = [rc.atom_order[a] for a in atoms]
    return idx, rc.chi_angles_mask.astype(np.float32)


_CHI_ATOM37_IDX, _CHI_MASK = _chi_atom37_tables()


def atom37_to_torsion_angles(
    aatype: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 7 torsions (omega, phi, psi, chi1-chi4) of each residue as (sin, cos).

    Atoms: omega CA(i-1), C(i-1), N, CA; phi C(i-1), N, CA, C; psi N, CA, C, O (the psi
    group's frame is defined with O, so psi is reported shifted by pi, i.e. (sin, cos) negated,
    as in AF2); chi k the atoms of ``chi_angles_atoms``. The torsion of atoms (a0, a1, a2, a3)
    is the angle of a3 around the a1 -> a2 axis, measured from a0, in the frame of
    ``rigid_from_3_points(a0, a2, a2 + (a2 - a1))``: angle = atan2(z, y) (the IUPAC dihedral).

    aatype [N], positions [N, 37, 3], mask [N, 37]. Returns ``sin_cos`` [N, 7, 2], ``alt_sin_cos``
    [N, 7, 2] (pi-periodic chis shifted by pi, supplement 1.9.3) and ``torsion_mask`` [N, 7],
    float32. Masked torsions are (0, 0).
    """
    aatype = np.asarray(aatype, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.float64)
    mask = np.asarray(mask, dtype=np.float32)
    _check_inputs(aatype, positions, mask)
    n = aatype.shape[0]
    n_, ca, c, o = (rc.atom_order[a] for a in ("N", "CA", "C", "O"))

    # The previous residue's atoms; the first residue has none (mask 0). Chain breaks are
    # not detected here: like AF2, consecutive array rows are taken as bonded neighbours.
    prev_pos = np.concatenate([np.zeros((1, 37, 3)), positions[:-1]], axis=0)[:n]
    prev_mask = np.concatenate([np.zeros((1, 37), dtype=np.float32), mask[:-1]], axis=0)[:n]

    pre_omega = np.stack([prev_pos[:, ca], prev_pos[:, c], positions[:, n_], positions[:, ca]], 1)
    phi = np.stack([prev_pos[:, c], positions[:, n_], positions[:, ca], positions[:, c]], 1)
    psi = np.stack([positions[:, n_], positions[:, ca], positions[:, c], positions[:, o]], 1)
    chi_idx = _CHI_ATOM37_IDX[aatype]  # [N, 4, 4]
    res = np.arange(n)[:, None, None]
    chis = positions[res, chi_idx]  # [N, 4 chis, 4 atoms, 3]
    atoms = np.concatenate([pre_omega[:, None], phi[:, None], psi[:, None], chis], axis=1)

    torsion_mask = np.stack(
        [
            prev_mask[:, ca] * prev_mask[:, c] * mask[:, n_] * mask[:, ca],
            prev_mask[:, c] * mask[:, n_] * mask[:, ca] * mask[:, c],
            mask[:, n_] * mask[:, ca] * mask[:, c] * mask[:, o],
        ],
        axis=1,
    )
    chi_mask = _CHI_MASK[aatype] * np.prod(mask[res, chi_idx], axis=-1)
    torsion_mask = np.concatenate([torsion_mask, chi_mask], axis=1)  # [N, 7]

    a0, a1, a2, a3 = (atoms[:, :, i] for i in range(4))  # each [N, 7, 3]
    frames = rigid_from_3_points(x1=a0, x2=a2, x3=2.0 * a2 - a1)
    local = _invert_apply(frames, a3)  # [N, 7, 3]
    sin_cos = np.stack([local[..., 2], local[..., 1]], axis=-1)
    sin_cos = sin_cos / np.sqrt(np.sum(sin_cos**2, axis=-1, keepdims=True) + _EPS)
    sin_cos[:, 2] *= -1.0  # psi measured with O: shift by pi
    sin_cos = sin_cos * torsion_mask[..., None]

    mirror = np.concatenate([np.ones((n, 3)), 1.0 - 2.0 * rc.chi_pi_periodic[aatype]], axis=1)
    alt_sin_cos = sin_cos * mirror[..., None]
    return (
        sin_cos.astype(np.float32),
        alt_sin_cos.astype(np.float32),
        torsion_mask.astype(np.float32),
    )


def make_pseudo_beta(
    aatype: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """CB position (CA for glycine) [N, 3] and its mask [N], float32 (supplement 1.9.5)."""
    aatype = np.asarray(aatype)
    is_gly = aatype == rc.restype_order["G"]
    idx = np.where(is_gly, rc.atom_order["CA"], rc.atom_order["CB"])
    rows = np.arange(aatype.shape[0])
    pb = np.asarray(positions)[rows, idx].astype(np.float32)
    pb_mask = np.asarray(mask)[rows, idx].astype(np.float32)
    return pb * pb_mask[:, None], pb_mask


def make_atom14(
    aatype: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> dict[str, np.ndarray]:
    """atom14 ground truth, its renamed alternative and the index maps (supplement 1.2.1, 1.9.3)."""
    aatype = np.asarray(aatype, dtype=np.int64)
    rows = np.arange(aatype.shape[0])[:, None]
    a14_to_a37 = rc.restype_atom14_to_atom37[aatype]  # [N, 14]
    atom14_exists = rc.restype_atom14_mask[aatype]  # [N, 14]
    gt_exists = atom14_exists * np.asarray(mask, dtype=np.float32)[rows, a14_to_a37]
    gt_pos = np.asarray(positions, dtype=np.float32)[rows, a14_to_a37] * gt_exists[..., None]
    swap = rc.restype_atom14_ambiguous_atoms_swap_idx[aatype]  # [N, 14]
    return {
        "atom14_gt_positions": gt_pos.astype(np.float32),
        "atom14_gt_exists": gt_exists.astype(np.float32),
        "atom14_atom_exists": atom14_exists.astype(np.float32),
        "atom14_alt_gt_positions": gt_pos[rows, swap].astype(np.float32),
        "atom14_alt_gt_exists": gt_exists[rows, swap].astype(np.float32),
        "atom14_atom_is_ambiguous": rc.restype_atom14_ambiguous_atoms[aatype].astype(np.float32),
        "residx_atom14_to_atom37": a14_to_a37.astype(np.int32),
        "residx_atom37_to_atom14": rc.restype_atom37_to_atom14[aatype].astype(np.int32),
        "atom37_atom_exists": rc.restype_atom37_mask[aatype].astype(np.float32),
    }


def make_ground_truth(
    aatype: np.ndarray, all_atom_positions: np.ndarray, all_atom_mask: np.ndarray
) -> dict[str, np.ndarray]:
    """Every ground-truth array of the AF2 schema (``schema._GROUND_TRUTH``) for one chain.

    aatype [N] int (0-20), all_atom_positions [N, 37, 3], all_atom_mask [N, 37]. Atoms the
    residue type does not have are dropped from the mask, so that the frames, torsions and
    atom14 arrays agree.
    """
    aatype = np.asarray(aatype, dtype=np.int64)
    positions = np.asarray(all_atom_positions, dtype=np.float64)
    mask = np.asarray(all_atom_mask, dtype=np.float32)
    _check_inputs(aatype, positions, mask)
    # Keep OXT (no atom14 slot, but a real atom) and the atoms the residue type has.
    allowed = rc.restype_atom37_mask[aatype].copy()
    allowed[:, rc.atom_order["OXT"]] = 1.0
    mask = mask * allowed
    positions = positions * mask[..., None]

    out = {
        "all_atom_positions": positions.astype(np.float32),
        "all_atom_mask": mask.astype(np.float32),
    }
    out.update(make_atom14(aatype, positions, mask))
    frames = atom37_to_frames(aatype, positions, mask)
    out.update(frames)
    out["backbone_rigid_tensor"] = frames["rigidgroups_gt_frames"][:, 0]
    out["backbone_rigid_mask"] = frames["rigidgroups_gt_exists"][:, 0]
    sin_cos, _, torsion_mask = atom37_to_torsion_angles(aatype, positions, mask)
    out["chi_angles_sin_cos"] = sin_cos[:, 3:]
    out["chi_mask"] = torsion_mask[:, 3:]
    out["pseudo_beta"], out["pseudo_beta_mask"] = make_pseudo_beta(aatype, positions, mask)
    return out
