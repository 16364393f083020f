"""Rigid transforms (rotation + translation) as plain tensors.

A rigid transform ``T = (R, t)`` maps local coordinates ``x`` to global ``R x + t``. ``Rigid`` holds
``rots [*, 3, 3]`` and ``trans [*, 3]``; every operation is a differentiable tensor expression with
no data-dependent Python control flow, so modules using it trace with torch.fx and compile.
Conventions follow the AF2 supplement 1.8 (frames ``T_i = (R_i, t_i)``, Alg. 21 and 23).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "Rigid",
    "quat_to_rot",
    "make_rot_x",
    "rigid_from_3_points",
    "rot_matmul",
    "rot_vec_mul",
]


def rot_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for rotation stacks ``[*, 3, 3]`` (broadcasting leading dims)."""
    return torch.matmul(a, b)


def rot_vec_mul(r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``r v`` for ``r [*, 3, 3]`` and ``v [*, 3]`` (written out: no batched tiny matmuls)."""
    x, y, z = v.unbind(-1)
    return torch.stack(
        [
            r[..., 0, 0] * x + r[..., 0, 1] * y + r[..., 0, 2] * z,
            r[..., 1, 0] * x + r[..., 1, 1] * y + r[..., 1, 2] * z,
            r[..., 2, 0] * x + r[..., 2, 1] * y + r[..., 2, 2] * z,
        ],
        dim=-1,
    )


def quat_to_rot(quat: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``[*, 3, 3]`` from quaternions ``[*, 4]`` = (a, b, c, d), a the real part.

    The quaternion is normalised first, so any non-zero ``(1, b, c, d)`` (Alg. 23) is valid.
    """
    quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
    a, b, c, d = quat.unbind(-1)
    rows = [
        a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c),
        2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b),
        2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d,
    ]
    return torch.stack(rows, dim=-1).reshape(*quat.shape[:-1], 3, 3)


def make_rot_x(sin_cos: torch.Tensor) -> torch.Tensor:
    """Rotation about the x axis from ``[*, 2]`` = (sin a, cos a) (Alg. 25) -> ``[*, 3, 3]``."""
    s, c = sin_cos.unbind(-1)
    zero = torch.zeros_like(s)
    one = torch.ones_like(s)
    rows = [one, zero, zero, zero, c, -s, zero, s, c]
    return torch.stack(rows, dim=-1).reshape(*sin_cos.shape[:-1], 3, 3)


def _normalize(v: torch.Tensor, eps: float) -> torch.Tensor:
    # sqrt(|v|^2 + eps) keeps the gradient finite for (near-)coincident points.
    return v / torch.sqrt(torch.sum(v * v, dim=-1, keepdim=True) + eps)


class Rigid:
    """A stack of rigid transforms: ``rots [*, 3, 3]``, ``trans [*, 3]``."""

    __slots__ = ("rots", "trans")

    def __init__(self, rots: torch.Tensor, trans: torch.Tensor) -> None:
        self.rots = rots
        self.trans = trans

    # -- construction -----------------------------------------------------------------------
    @staticmethod
    def identity(
        shape: tuple[int, ...],
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        requires_grad: bool = False,
    ) -> Rigid:
        """Identity transforms of batch shape ``shape``."""
        rots = torch.eye(3, dtype=dtype, device=device).expand(*shape, 3, 3).clone()
        trans = torch.zeros(*shape, 3, dtype=dtype, device=device)
        rots.requires_grad_(requires_grad)
        trans.requires_grad_(requires_grad)
        return Rigid(rots, trans)

    @staticmethod
    def from_tensor_4x4(m: torch.Tensor) -> Rigid:
        """From homogeneous matrices ``[*, 4, 4]`` (last row 0 0 0 1)."""
        return Rigid(m[..., :3, :3], m[..., :3, 3])

    @staticmethod
    def from_quat_and_trans(quat: torch.Tensor, trans: torch.Tensor) -> Rigid:
        """From quaternions ``[*, 4]`` (normalised here) and translations ``[*, 3]``."""
        return Rigid(quat_to_rot(quat), trans)

    @staticmethod
    def from_3_points(
        x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, eps: float = 1e-8
    ) -> Rigid:
        """Alg. 21; see :func:`rigid_from_3_points`."""
        return rigid_from_3_points(x1, x2, x3, eps)

    # -- conversion -------------------------------------------------------------------------
    def to_tensor_4x4(self) -> torch.Tensor:
        """Homogeneous matrices ``[*, 4, 4]``."""
        top = torch.cat([self.rots, self.trans.unsqueeze(-1)], dim=-1)  # [*, 3, 4]
        # [0, 0, 0, 1] made on the device (no host-to-device copy: CUDA-graph capturable)
        last_row = F.pad(torch.ones_like(self.trans[..., :1]), (3, 0))  # [*, 4]
        bottom = last_row.unsqueeze(-2)  # [*, 1, 4]
        return torch.cat([top, bottom], dim=-2)

    @property
    def shape(self) -> torch.Size:
        return self.trans.shape[:-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.trans.dtype

    @property
    def device(self) -> torch.device:
        return self.trans.device

    # -- algebra ----------------------------------------------------------------------------
    def compose(self, other: Rigid) -> Rigid:
        """``self ∘ other``: apply ``other`` first, then ``self``."""
        return Rigid(
            rot_matmul(self.rots, other.rots), rot_vec_mul(self.rots, other.trans) + self.trans
        )

    def invert(self) -> Rigid:
        """``T^-1 = (R^T, -R^T t)``."""
        rots_t = self.rots.transpose(-1, -2)
        return Rigid(rots_t, -rot_vec_mul(rots_t, self.trans))

    def apply(self, pts: torch.Tensor) -> torch.Tensor:
        """``R x + t`` for points ``[*, 3]`` broadcasting against the frames."""
        return rot_vec_mul(self.rots, pts) + self.trans

    def invert_apply(self, pts: torch.Tensor) -> torch.Tensor:
        """``R^T (x - t)``: global points into the local frame."""
        return rot_vec_mul(self.rots.transpose(-1, -2), pts - self.trans)

    def apply_rotation(self, vecs: torch.Tensor) -> torch.Tensor:
        return rot_vec_mul(self.rots, vecs)

    # -- shape helpers ----------------------------------------------------------------------
    def unsqueeze(self, dim: int) -> Rigid:
        """Insert a batch dim at ``dim`` (counted over the batch dims, negative from the end)."""
        d_rot = dim if dim >= 0 else dim - 2
        d_tr = dim if dim >= 0 else dim - 1
        return Rigid(self.rots.unsqueeze(d_rot), self.trans.unsqueeze(d_tr))

    def __getitem__(self, index: int | slice | tuple) -> Rigid:
        if not isinstance(index, tuple):
            index = (index,)
        return Rigid(self.rots[index + (slice(None),) * 2], self.trans[index + (slice(None),)])

    def scale_translation(self, factor: float) -> Rigid:
        return Rigid(self.rots, self.trans * factor)

    def stop_rot_gradient(self) -> Rigid:
        """Detach the rotation (Alg. 20 line 20: gradients flow only through translations)."""
        return Rigid(self.rots.detach(), self.trans)

    def detach(self) -> Rigid:
        return Rigid(self.rots.detach(), self.trans.detach())

    def to(self, dtype: torch.dtype) -> Rigid:
        return Rigid(self.rots.to(dtype), self.trans.to(dtype))

    @staticmethod
    def cat(rigids: list[Rigid], dim: int) -> Rigid:
        d_rot = dim if dim >= 0 else dim - 2
        d_tr = dim if dim >= 0 else dim - 1
        return Rigid(
            torch.cat([r.rots for r in rigids], d_rot), torch.cat([r.trans for r in rigids], d_tr)
        )

    @staticmethod
    def stack(rigids: list[Rigid], dim: int) -> Rigid:
        d_rot = dim if dim >= 0 else dim - 2
        d_tr = dim if dim >= 0 else dim - 1
        return Rigid(
            torch.stack([r.rots for r in rigids], d_rot),
            torch.stack([r.trans for r in rigids], d_tr),
        )

    def __repr__(self) -> str:
        return f"Rigid(shape={tuple(self.shape)}, dtype={self.dtype})"


def rigid_from_3_points(
    x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, eps: float = 1e-8
) -> Rigid:
    """Frame from three points (Alg. 21), e.g. ``x1`` = N, ``x2`` = CA, ``x3`` = C; ``[*, 3]`` each.

    Gram-Schmidt: ``e1`` along ``x3 - x2``, ``e2`` the part of ``x1 - x2`` orthogonal to ``e1``,
    ``e3 = e1 x e2``; ``R = [e1 e2 e3]`` (columns), ``t = x2``.
    """
    v1 = x3 - x2
    v2 = x1 - x2
    e1 = _normalize(v1, eps)
    u2 = v2 - e1 * torch.sum(e1 * v2, dim=-1, keepdim=True)
    e2 = _normalize(u2, eps)
    e3 = torch.cross(e1, e2, dim=-1)
    rots = torch.stack([e1, e2, e3], dim=-1)  # columns: [*, 3, 3]
    return Rigid(rots, x2)
