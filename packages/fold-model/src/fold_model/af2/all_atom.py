"""Torsion angles -> rigid-group frames -> atom coordinates (AF2 supplement 1.8.4, Alg. 24-25).

Each residue has 8 rigid groups (supplement Table 2): 0 backbone, 1 pre-omega, 2 phi, 3 psi,
4-7 chi1-chi4. A group's frame is its literature default frame (relative to its parent) rotated
about x by the group's torsion angle; chi2-4 hang off the previous chi group, all others off the
backbone frame. Atoms are placed by applying their group's global frame to their literature
position. The geometry tables come from :mod:`fold_data.residue_constants` and are turned into
tensors once per (device, dtype).
"""

from __future__ import annotations

import torch

from fold_model.geometry import Rigid, make_rot_x

__all__ = [
    "residue_constant_tensors",
    "torsion_angles_to_frames",
    "frames_to_atom14_positions",
    "atom14_to_atom37",
    "atom37_mask",
]

_CACHE: dict[tuple[str, torch.dtype], dict[str, torch.Tensor]] = {}


def residue_constant_tensors(device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The residue-constant tables used here, as tensors on ``device`` (floats in ``dtype``).

    ``default_frames [21, 8, 4, 4]``, ``group_idx [21, 14]`` (long), ``atom14_mask [21, 14]``,
    ``lit_positions [21, 14, 3]``, ``atom37_to_atom14 [21, 37]`` (long), ``atom37_mask [21, 37]``.
    """
    key = (str(device), dtype)
    if key not in _CACHE:
        import numpy as np
        from fold_data import residue_constants as rc

        atom37_mask_np = getattr(rc, "restype_atom37_mask", None)
        if atom37_mask_np is None:
            # atom37 slots that some atom14 slot of the residue type maps to.
            atom37_mask_np = np.zeros((21, 37), dtype=np.float32)
            a14_to_a37 = np.asarray(rc.restype_atom14_to_atom37)
            a14_mask = np.asarray(rc.restype_atom14_mask)
            for r in range(21):
                atom37_mask_np[r, a14_to_a37[r][a14_mask[r] > 0]] = 1.0

        def floats(a: object) -> torch.Tensor:
            return torch.tensor(np.asarray(a, dtype=np.float64), dtype=dtype, device=device)

        def longs(a: object) -> torch.Tensor:
            return torch.tensor(np.asarray(a, dtype=np.int64), device=device)

        tables = {
            "default_frames": floats(rc.restype_rigid_group_default_frame),
            "group_idx": longs(rc.restype_atom14_to_rigid_group),
            "atom14_mask": floats(rc.restype_atom14_mask),
            "lit_positions": floats(rc.restype_atom14_rigid_group_positions),
            "atom37_to_atom14": longs(rc.restype_atom37_to_atom14),
            "atom37_mask": floats(atom37_mask_np),
        }
        # Plain tensors only: tables made under a tensor subclass mode (the FakeTensors of
        # fold-train's dry run) must not be handed to later real calls.
        if type(tables["group_idx"]) is not torch.Tensor:
            return tables
        _CACHE[key] = tables
    return _CACHE[key]


def torsion_angles_to_frames(backbone: Rigid, angles: torch.Tensor, aatype: torch.Tensor) -> Rigid:
    """Global frames of the 8 rigid groups (Alg. 24 lines 1-10).

    backbone: ``[*, N]`` backbone frames (Angstrom); angles: ``[*, N, 7, 2]`` (sin, cos) of
    omega, phi, psi, chi1-4 (normalised); aatype: ``[*, N]`` long. Returns ``Rigid [*, N, 8]``.
    """
    consts = residue_constant_tensors(angles.device, angles.dtype)
    default = Rigid.from_tensor_4x4(consts["default_frames"][aatype])  # [*, N, 8]

    # The backbone group gets the identity torsion (sin 0, cos 1): [*, N, 8, 2].
    identity_angle = torch.stack(
        [torch.zeros_like(angles[..., 0, 0]), torch.ones_like(angles[..., 0, 0])], dim=-1
    )
    angles8 = torch.cat([identity_angle.unsqueeze(-2), angles], dim=-2)
    local = Rigid(
        torch.matmul(default.rots, make_rot_x(angles8)), default.trans
    )  # default ∘ rot_x(alpha): the rotation happens about the group's own x axis.

    # chi2, chi3, chi4 are attached to the previous chi group; chain them (Alg. 24 lines 7-9).
    chi1 = local[..., 4]
    chi2 = chi1.compose(local[..., 5])
    chi3 = chi2.compose(local[..., 6])
    chi4 = chi3.compose(local[..., 7])
    to_backbone = Rigid.cat(
        [local[..., 0:5], chi2.unsqueeze(-1), chi3.unsqueeze(-1), chi4.unsqueeze(-1)], dim=-1
    )  # [*, N, 8], each group relative to the backbone frame
    return backbone.unsqueeze(-1).compose(to_backbone)


def frames_to_atom14_positions(frames: Rigid, aatype: torch.Tensor) -> torch.Tensor:
    """Atom14 coordinates ``[*, N, 14, 3]`` from group frames ``Rigid [*, N, 8]`` (Alg. 24 l. 11).

    Slots the residue type does not have are zero.
    """
    consts = residue_constant_tensors(frames.device, frames.dtype)
    group_idx = consts["group_idx"][aatype]  # [*, N, 14]
    # Pick each atom's group frame: [*, N, 14, 3, 3] and [*, N, 14, 3].
    rots = torch.gather(
        frames.rots, -3, group_idx[..., None, None].expand(*group_idx.shape, 3, 3)
    )
    trans = torch.gather(frames.trans, -2, group_idx[..., None].expand(*group_idx.shape, 3))
    positions = Rigid(rots, trans).apply(consts["lit_positions"][aatype])
    return positions * consts["atom14_mask"][aatype][..., None]


def atom14_to_atom37(atom14: torch.Tensor, aatype: torch.Tensor) -> torch.Tensor:
    """Scatter atom14 data ``[*, N, 14, ...]`` into atom37 slots ``[*, N, 37, ...]``.

    Slots the residue type does not have are zero.
    """
    consts = residue_constant_tensors(atom14.device, torch.float32)
    idx = consts["atom37_to_atom14"][aatype]  # [*, N, 37]
    mask = consts["atom37_mask"][aatype].to(atom14.dtype)  # [*, N, 37]
    extra = atom14.shape[idx.dim():]
    idx = idx.reshape(*idx.shape, *([1] * len(extra))).expand(*idx.shape, *extra)
    atom37 = torch.gather(atom14, idx.dim() - 1 - len(extra), idx)
    return atom37 * mask.reshape(*mask.shape, *([1] * len(extra)))


def atom37_mask(aatype: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[*, N, 37]``: 1 where the residue type has the atom37 slot."""
    return residue_constant_tensors(aatype.device, dtype)["atom37_mask"][aatype]
