"""Geometry shared by AF2 and AF3: rigid frames (rotation + translation) as plain tensors."""

from __future__ import annotations

from fold_model.geometry.rigid import (
    Rigid,
    make_rot_x,
    quat_to_rot,
    rigid_from_3_points,
    rot_matmul,
    rot_vec_mul,
)

__all__ = ["Rigid", "quat_to_rot", "make_rot_x", "rigid_from_3_points", "rot_matmul", "rot_vec_mul"]
