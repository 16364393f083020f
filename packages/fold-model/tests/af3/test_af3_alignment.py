"""AF3 weighted rigid alignment (Alg. 28), the quaternion path (Horn's method, Jacobi sweeps: no
host sync, CUDA-graph capturable) against the SVD path: the same rotation on random masked
inputs in fp32 and fp64, a known rotation recovered (also near 180 degrees), a mirror image
matched by a proper rotation, degenerate inputs (collinear, coplanar, one atom, no weights, equal
eigenvalues) giving a proper rotation no worse than the SVD's, and no linalg or host read."""

from __future__ import annotations

import math

import pytest
import torch
from _af3_helpers import holes, rel_err
from fold_model.af3 import alignment
from fold_model.af3.alignment import weighted_rigid_align, weighted_rigid_transform
from fold_model.af3.diffusion import random_rotation

G = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
F64 = torch.float64
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _chain(shape, n, seed, dtype=F64):
    """Random-walk coordinates ``[*shape, n, 3]`` (~3.8 A steps), away from the origin."""
    steps = torch.randn(*shape, n, 3, generator=G(seed), dtype=F64) * 2.2
    return (torch.cumsum(steps, -2) + 30.0).to(dtype)


def _axis_angle(axis, angle):
    """Rodrigues: the rotation ``[3, 3]`` by ``angle`` about ``axis`` (fp64)."""
    a = torch.as_tensor(axis, dtype=F64)
    x, y, z = (a / a.norm()).tolist()
    k = torch.tensor([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]], dtype=F64)
    return torch.eye(3, dtype=F64) + math.sin(angle) * k + (1 - math.cos(angle)) * (k @ k)


def _rmsd(rot, mu_m, mu_f, moving, fixed, w):
    """Weighted RMSD ``[*]`` of ``rot (moving - mu_m) + mu_f`` against ``fixed``, in fp64."""
    rot, mu_m, mu_f, moving, fixed, w = (t.double() for t in (rot, mu_m, mu_f, moving, fixed, w))
    out = torch.einsum("...ij,...aj->...ai", rot, moving - mu_m) + mu_f
    sq = (w * (out - fixed).square().sum(-1)).sum(-1) / w.sum(-1).clamp_min(1e-8)
    return sq.sqrt()


def _assert_proper(rot, tol=1e-12):
    r = rot.double()
    assert torch.isfinite(r).all()
    eye = torch.eye(3, dtype=F64).expand_as(r)
    assert (r @ r.transpose(-1, -2) - eye).abs().max() < tol
    assert (torch.linalg.det(r) - 1.0).abs().max() < tol


@pytest.mark.parametrize("dtype, tol", [(F64, 1e-10), (torch.float32, 1e-5)])
def test_quaternion_matches_svd_on_random_masked_inputs(dtype, tol):
    shape, n = (3, 5), 37
    x = _chain(shape, n, 0, dtype)
    rot = random_rotation(shape, G(1), F64)
    y = torch.einsum("...ij,...aj->...ai", rot, x.double()) - 12.0
    y = (y + 1.5 * torch.randn(y.shape, generator=G(2), dtype=F64)).to(dtype)  # ~1.5 A RMSD
    mask = holes((*shape, n), seed=3).to(dtype)
    w = mask * (torch.rand(*shape, n, generator=G(4), dtype=F64) + 0.5).to(dtype)
    x_far = torch.where(mask[..., None] > 0, x, x + 500.0)  # left-out atoms anywhere
    # A second set with no relation between the two (the optimum far from identity, large RMSD).
    z = (torch.randn(*shape, n, 3, generator=G(5), dtype=F64) * 8.0).to(dtype)
    for moving, fixed in ((x_far, y), (x, z)):
        r_s, mu_ms, mu_fs = weighted_rigid_transform(moving, fixed, w, method="svd")
        r_q, mu_mq, mu_fq = weighted_rigid_transform(moving, fixed, w, method="quaternion")
        expect = torch.promote_types(dtype, torch.float32)
        assert r_q.dtype == mu_mq.dtype == mu_fq.dtype == expect
        assert r_q.shape == (*shape, 3, 3) and mu_mq.shape == mu_fq.shape == (*shape, 1, 3)
        assert rel_err(r_q, r_s) < tol and rel_err(mu_mq, mu_ms) < tol
        assert rel_err(mu_fq, mu_fs) < tol
        a_s = weighted_rigid_align(moving, fixed, w, method="svd")
        a_q = weighted_rigid_align(moving, fixed, w, method="quaternion")
        assert a_q.dtype == dtype
        keep = mask > 0
        assert rel_err(a_q[keep], a_s[keep]) < tol
        _assert_proper(r_q, 1e-12 if dtype == F64 else 1e-6)


def test_quaternion_recovers_known_rotation():
    """Exact data: the rotation and translation come back to fp64 rounding, including rotations
    by (nearly) 180 degrees, where the quaternion's real part w is ~0, and the identity."""
    shape, n = (2, 6), 23
    x = torch.randn(*shape, n, 3, generator=G(10), dtype=F64) * 6.0
    rot = random_rotation(shape, G(11), F64)
    axes = torch.randn(5, 3, generator=G(12), dtype=F64)
    for i, angle in enumerate((math.pi, math.pi - 1e-7, math.pi - 1e-3, 1e-9, 0.0)):
        rot[1, i] = _axis_angle(axes[i], angle)
    t = torch.randn(*shape, 1, 3, generator=G(13), dtype=F64) * 10.0
    y = torch.einsum("...ij,...aj->...ai", rot, x) + t
    w = torch.rand(*shape, n, generator=G(14), dtype=F64) + 0.5
    w[..., 7] = 0.0
    y_out = y.clone()
    y_out[..., 7, :] -= 80.0  # a zero-weight atom may be anywhere
    r_est, mu_m, mu_f = weighted_rigid_transform(x, y_out, w, method="quaternion")
    assert rel_err(r_est, rot) < 1e-10
    assert rel_err(mu_f - torch.einsum("...ij,...aj->...ai", r_est, mu_m), t) < 1e-10
    aligned = weighted_rigid_align(x, y_out, w, method="quaternion")
    keep = w > 0
    assert rel_err(aligned[keep], y[keep]) < 1e-10
    _assert_proper(r_est)


def test_quaternion_mirror_image_gets_svd_reflection_fixed_rotation():
    """``fixed`` the mirror image of ``moving``: no rotation fits; both paths return the same
    proper rotation (the SVD's with its smallest axis flipped), never a reflection."""
    shape, n = (4,), 29
    x = _chain(shape, n, 20)
    rot = random_rotation(shape, G(21), F64)
    mirror = x * torch.tensor([1.0, -1.0, 1.0], dtype=F64)
    y = torch.einsum("...ij,...aj->...ai", rot, mirror) + 5.0
    w = holes((*shape, n), seed=22).double() * 2.0
    r_s, _, _ = weighted_rigid_transform(x, y, w, method="svd")
    r_q, _, _ = weighted_rigid_transform(x, y, w, method="quaternion")
    _assert_proper(r_q)
    assert rel_err(r_q, r_s) < 1e-10
    a_s = weighted_rigid_align(x, y, w, method="svd")
    a_q = weighted_rigid_align(x, y, w, method="quaternion")
    assert rel_err(a_q, a_s) < 1e-10


def _degenerate(case):
    """``moving, fixed [4, 11, 3]``, ``weights [4, 11]`` with a non-unique optimal rotation or a
    rank-deficient covariance; ``fixed`` a rotated, shifted, slightly noisy copy of ``moving``
    (the noise keeps H's rank: ``H = sum_l w_l m_l f_l^T`` has the rank of the centred moving)."""
    n = 11
    w = torch.rand(4, n, generator=G(32), dtype=F64) + 0.5
    mirror = torch.tensor([1.0, 1.0, 1.0], dtype=F64)
    if case == "collinear":  # rank-1 covariance: any rotation about the line fits as well
        s = torch.randn(4, n, 1, generator=G(33), dtype=F64) * 4.0
        x = s * torch.tensor([0.3, -1.2, 0.7], dtype=F64) + 3.0
    elif case == "coplanar":  # rank-2 covariance
        uv = torch.randn(4, n, 2, generator=G(34), dtype=F64) * 4.0
        x = uv @ torch.tensor([[1.0, 0.5, -0.2], [-0.3, 0.2, 1.1]], dtype=F64) - 2.0
    elif case == "isotropic_mirror":  # a cube mirrored: K's top eigenvalue is threefold
        corners = torch.cartesian_prod(*[torch.tensor([-2.5, 2.5], dtype=F64)] * 3) + 1.0
        extra = torch.randn(3, 3, generator=G(35), dtype=F64)  # [8 + 3, 3], the 3 left out
        x = torch.cat([corners, extra]).expand(4, n, 3)
        w = torch.cat([torch.full((4, 8), 1.3, dtype=F64), torch.zeros(4, 3, dtype=F64)], -1)
        mirror = torch.tensor([1.0, 1.0, -1.0], dtype=F64)
    else:
        x = torch.randn(4, n, 3, generator=G(36), dtype=F64) * 5.0
        w = torch.zeros(4, n, dtype=F64)
        if case == "single_atom":  # H ~ 0 (rounding of the centroid)
            w[:, 4] = 0.8
        # else "no_weights": all weights 0, H == 0 exactly
    rot = random_rotation((4,), G(30), F64)
    t = torch.randn(4, 1, 3, generator=G(31), dtype=F64) * 7.0
    y = torch.einsum("...ij,...aj->...ai", rot, x * mirror) + t
    noise = 0.0 if case == "isotropic_mirror" else 0.05  # noise would split the eigenvalues
    return x, y + noise * torch.randn(y.shape, generator=G(37), dtype=F64), w


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize(
    "case", ["collinear", "coplanar", "isotropic_mirror", "single_atom", "no_weights"]
)
def test_quaternion_degenerate_inputs_give_a_proper_rotation(case, dtype):
    x, y, w = (t.to(dtype) for t in _degenerate(case))
    r_q, mu_mq, mu_fq = weighted_rigid_transform(x, y, w, method="quaternion")
    r_s, mu_ms, mu_fs = weighted_rigid_transform(x, y, w, method="svd")
    assert torch.isfinite(mu_mq).all() and torch.isfinite(mu_fq).all()
    _assert_proper(r_q, 1e-12 if dtype == F64 else 1e-6)
    aligned = weighted_rigid_align(x, y, w, method="quaternion")
    assert torch.isfinite(aligned).all()
    rmsd_q, rmsd_s = _rmsd(r_q, mu_mq, mu_fq, x, y, w), _rmsd(r_s, mu_ms, mu_fs, x, y, w)
    # the SVD's rotation is optimal: the quaternion's fits as well (residuals ~0.05 A of noise,
    # the mirror image's ~4 A, 0 without weights)
    assert (rmsd_q <= rmsd_s + (1e-6 if dtype == F64 else 1e-4)).all()
    if case == "no_weights":  # H == 0: every rotation fits; the identity comes back
        assert torch.equal(r_q, torch.eye(3, dtype=dtype).expand_as(r_q))


def test_method_argument():
    x, y = _chain((2,), 9, 40), _chain((2,), 9, 41)
    w = torch.rand(2, 9, generator=G(42), dtype=F64)
    with pytest.raises(ValueError, match="method must be one of"):
        weighted_rigid_transform(x, y, w, method="kabsch")
    with pytest.raises(ValueError, match="method must be one of"):
        weighted_rigid_align(x, y, w, method="QUATERNION")
    # eagerly (no CUDA stream capturing) "auto" is the SVD path
    for a, b in zip(weighted_rigid_transform(x, y, w),
                    weighted_rigid_transform(x, y, w, method="svd")):
        assert torch.equal(a, b)


def test_quaternion_path_makes_no_linalg_call_and_no_host_read(monkeypatch):
    """No torch.linalg (its CUDA solvers read ``info`` on the host), and it runs on meta tensors,
    which have no data: no ``.item()``, no data-dependent shape, no branch on a value."""
    def refuse(*args, **kwargs):
        raise AssertionError("torch.linalg called on the quaternion path")

    for name in ("svd", "det", "eigh", "eig", "qr", "norm", "vector_norm", "solve"):
        monkeypatch.setattr(torch.linalg, name, refuse)
    x, y = _chain((3, 5), 37, 50, torch.float32), _chain((3, 5), 37, 51, torch.float32)
    w = holes((3, 5, 37), seed=52)
    r, mu_m, mu_f = weighted_rigid_transform(x, y, w, method="quaternion")
    assert torch.isfinite(r).all()
    meta = [t.to("meta") for t in (x, y, w)]
    # autocast has no meta device: the solver itself, as weighted_rigid_transform calls it
    r, mu_m, mu_f = alignment._rigid_transform_quaternion(*meta)
    assert r.is_meta and r.shape == (3, 5, 3, 3) and r.dtype == torch.float32
    assert mu_m.shape == mu_f.shape == (3, 5, 1, 3)


@pytest.mark.gpu
@gpu
def test_quaternion_path_captured_in_a_cuda_graph():
    """On CUDA: no host sync eagerly (sync debug mode 'error'), and ``weighted_rigid_align`` in a
    ``torch.cuda.graph`` (auto picks the quaternion path) replays to the eager SVD answer."""
    shape, n = (3, 16), 37
    x = _chain(shape, n, 60, torch.float32).cuda()
    rot = random_rotation(shape, G(61), torch.float32).cuda()
    y = torch.einsum("...ij,...aj->...ai", rot, x) + torch.randn(x.shape, generator=G(62)).cuda()
    w = holes((*shape, n), seed=63).cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        weighted_rigid_align(x, y, w, method="quaternion")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    static = [t.clone() for t in (x, y, w)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as before any capture
        weighted_rigid_align(*static, method="quaternion")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = weighted_rigid_align(*static)
    for seed in (64, 65):
        y2 = y + torch.randn(y.shape, generator=G(seed)).cuda()
        static[1].copy_(y2)
        graph.replay()
        torch.cuda.synchronize()
        eager = weighted_rigid_align(x, y2, w, method="svd")
        keep = w > 0
        assert rel_err(out[keep], eager[keep]) < 1e-5
