"""Rigid transforms: group identities, quaternions, Alg. 21 against a direct Gram-Schmidt."""

from __future__ import annotations

import numpy as np
import torch
from fold_model.geometry import Rigid, make_rot_x, quat_to_rot, rigid_from_3_points


def random_rigid(shape: tuple[int, ...], gen: torch.Generator) -> Rigid:
    quat = torch.randn(*shape, 4, generator=gen, dtype=torch.float64)
    trans = 5.0 * torch.randn(*shape, 3, generator=gen, dtype=torch.float64)
    return Rigid.from_quat_and_trans(quat, trans)


def test_quat_to_rot_is_orthonormal_with_det_one() -> None:
    gen = torch.Generator().manual_seed(0)
    rots = quat_to_rot(torch.randn(5, 7, 4, generator=gen, dtype=torch.float64))
    eye = torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(
        rots @ rots.transpose(-1, -2), eye.expand_as(rots), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(torch.linalg.det(rots), torch.ones(5, 7, dtype=torch.float64))


def test_quat_to_rot_known_rotation() -> None:
    # 90 degrees about z: q = (cos 45, 0, 0, sin 45) maps x -> y.
    half = np.sqrt(0.5)
    rot = quat_to_rot(torch.tensor([half, 0.0, 0.0, half], dtype=torch.float64))
    torch.testing.assert_close(rot @ torch.tensor([1.0, 0, 0], dtype=torch.float64),
                               torch.tensor([0.0, 1, 0], dtype=torch.float64))
    # unnormalised input (2, 0, 0, 0) is the identity
    torch.testing.assert_close(quat_to_rot(torch.tensor([2.0, 0, 0, 0])), torch.eye(3))


def test_make_rot_x() -> None:
    a = torch.tensor([0.3, -2.0, 1.1], dtype=torch.float64)
    rot = make_rot_x(torch.stack([a.sin(), a.cos()], -1))
    for i, ang in enumerate(a.tolist()):
        c, s = np.cos(ang), np.sin(ang)
        np.testing.assert_allclose(rot[i].numpy(), [[1, 0, 0], [0, c, -s], [0, s, c]], atol=1e-14)


def test_compose_invert_apply_identities() -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = random_rigid((3, 5), gen), random_rigid((3, 5), gen)
    x = torch.randn(3, 5, 3, generator=gen, dtype=torch.float64)
    # (a ∘ b) x = a (b x)
    torch.testing.assert_close(a.compose(b).apply(x), a.apply(b.apply(x)))
    # a^-1 a x = x, and invert_apply == invert().apply
    torch.testing.assert_close(a.invert().apply(a.apply(x)), x)
    torch.testing.assert_close(a.invert_apply(x), a.invert().apply(x))
    ident = a.compose(a.invert())
    torch.testing.assert_close(ident.rots, torch.eye(3, dtype=torch.float64).expand(3, 5, 3, 3))
    torch.testing.assert_close(ident.trans, torch.zeros(3, 5, 3, dtype=torch.float64))
    # compose is associative
    c = random_rigid((3, 5), gen)
    torch.testing.assert_close(a.compose(b).compose(c).to_tensor_4x4(),
                               a.compose(b.compose(c)).to_tensor_4x4())


def test_4x4_round_trip_and_matrix_product() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = random_rigid((4,), gen), random_rigid((4,), gen)
    m = a.to_tensor_4x4()
    assert m.shape == (4, 4, 4)
    last_row = torch.tensor([0, 0, 0, 1.0], dtype=torch.float64).expand(4, 4)
    torch.testing.assert_close(m[..., 3, :], last_row)
    back = Rigid.from_tensor_4x4(m)
    torch.testing.assert_close(back.rots, a.rots)
    torch.testing.assert_close(back.trans, a.trans)
    torch.testing.assert_close(a.compose(b).to_tensor_4x4(), m @ b.to_tensor_4x4())


def test_shape_helpers() -> None:
    gen = torch.Generator().manual_seed(3)
    a = random_rigid((2, 6), gen)
    assert a.unsqueeze(-1).shape == (2, 6, 1)
    assert a.unsqueeze(0).shape == (1, 2, 6)
    assert a[..., 2:4].shape == (2, 2)
    torch.testing.assert_close(a[1].trans, a.trans[1])
    cat = Rigid.cat([a, a], dim=-1)
    assert cat.shape == (2, 12)
    stacked = Rigid.stack([a, a], dim=0)
    assert stacked.shape == (2, 2, 6)


def _gram_schmidt_reference(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    e1 = (c - ca) / np.linalg.norm(c - ca)
    u2 = (n - ca) - np.dot(n - ca, e1) * e1
    e2 = u2 / np.linalg.norm(u2)
    e3 = np.cross(e1, e2)
    return np.stack([e1, e2, e3], axis=1)


def test_rigid_from_3_points_matches_gram_schmidt() -> None:
    rng = np.random.default_rng(4)
    pts = rng.normal(size=(9, 3, 3)) * 3.0
    t = torch.from_numpy(pts)
    rigid = rigid_from_3_points(t[:, 0], t[:, 1], t[:, 2], eps=0.0)
    for i in range(9):
        ref = _gram_schmidt_reference(*pts[i])
        np.testing.assert_allclose(rigid.rots[i].numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(rigid.trans.numpy(), pts[:, 1])
    # The local coordinates of C lie on +x, N in the xy plane with y > 0.
    c_local = rigid.invert_apply(t[:, 2])
    n_local = rigid.invert_apply(t[:, 0])
    assert torch.all(c_local[:, 0] > 0)
    torch.testing.assert_close(c_local[:, 1:], torch.zeros(9, 2, dtype=torch.float64))
    assert torch.all(n_local[:, 1] > 0)
    torch.testing.assert_close(n_local[:, 2], torch.zeros(9, dtype=torch.float64))


def test_rigid_from_3_points_gradient_finite_for_degenerate_points() -> None:
    x = torch.zeros(2, 3, 3, requires_grad=True)
    rigid = rigid_from_3_points(x[:, 0], x[:, 1], x[:, 2])
    (rigid.rots.sum() + rigid.trans.sum()).backward()
    assert torch.isfinite(x.grad).all()


def test_stop_rot_gradient_detaches_only_the_rotation() -> None:
    gen = torch.Generator().manual_seed(5)
    quat = torch.randn(4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    trans = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    frozen = Rigid.from_quat_and_trans(quat, trans).stop_rot_gradient()
    x = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    frozen.apply(x).sum().backward()
    assert quat.grad is None
    assert trans.grad is not None and torch.all(trans.grad == 1.0)
