"""Weighted rigid alignment (AF3 supplement Alg. 28): the weighted Kabsch superposition used to
align the ground truth onto each denoised sample before the MSE loss (under stop-gradient).

The optimal rotation has two solvers, giving the same answer:

- ``"svd"`` (Kabsch, the default when run eagerly): ``torch.linalg.svd`` of the 3x3 weighted
  covariance with the determinant's reflection fix.
- ``"quaternion"`` (Horn 1987): the rotation's unit quaternion is the top eigenvector of a symmetric
  4x4 matrix built from the same covariance, found by a fixed number of Jacobi sweeps in float64
  with elementwise ops, reductions and small matmuls only.

Two exist for CUDA graph capture. On CUDA, ``torch.linalg.svd`` checks its solver's ``info``
result on the host (a device-to-host sync), which is not allowed while a stream is captured, so a
training step that calls it cannot be put in a ``torch.cuda.graph``. The quaternion path makes no
``torch.linalg`` call, no host read, has no data-dependent shapes and no branch on tensor values;
``method="auto"`` takes it while the current CUDA stream is capturing.
"""

from __future__ import annotations

import torch

__all__ = ["weighted_rigid_transform", "weighted_rigid_align"]

_METHODS = ("auto", "svd", "quaternion")

# Jacobi sweeps over the 4x4 matrix. Cyclic Jacobi converges quadratically once the off-diagonal
# is small, also with equal eigenvalues. Measured in fp64 on 1e7 random covariances and on spectra
# with equal or 1e-8-close eigenvalues: relative off-diagonal norm <= 1e-2 after 3 sweeps,
# <= 1e-7 after 4, at rounding (5e-16) after 5 for every matrix. The sixth is a whole sweep of
# margin (it would take 1e-4 left after 4 sweeps for 6 not to reach rounding). Each sweep is
# ~55 kernels; a whole call ~360 (48 x 1500 atoms on an H100: 0.7 ms replayed in a graph, 10 ms
# eagerly, where the SVD path takes 1.3 ms: hence the SVD stays the eager default).
_SWEEPS = 6

# A sweep as three rounds of two rotations on disjoint index pairs: the two commute, so each round
# is one 4x4 rotation J applied to the whole batch at once.
_ROUNDS = (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2)))


def weighted_rigid_transform(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor, *, method: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The proper rotation ``R [*, 3, 3]`` and centroids ``mu_moving, mu_fixed [*, 1, 3]`` that
    minimise ``sum_l w_l |R (moving_l - mu_m) + mu_f - fixed_l|^2``. ``moving, fixed [*, A, 3]``,
    ``weights [*, A]`` (0 for atoms left out). Computed in at least fp32, also under autocast
    (which would run the covariance einsum in bf16, for which there is no SVD).

    ``method``: ``"svd"``, ``"quaternion"`` (no host sync: CUDA-graph capturable), or ``"auto"``
    (the quaternion path while the current CUDA stream is capturing, the SVD otherwise). Where the
    optimum is not unique (collinear points, one atom, all weights 0) any optimal proper rotation
    may come back; the two paths may then differ, with the same residual."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if method == "auto":
        capturing = moving.is_cuda and torch.cuda.is_current_stream_capturing()
        method = "quaternion" if capturing else "svd"
    solve = _rigid_transform_svd if method == "svd" else _rigid_transform_quaternion
    with torch.autocast(moving.device.type, enabled=False):
        return solve(moving, fixed, weights)


def _centroids_and_covariance(
    m: torch.Tensor, f: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mu_m, mu_f [*, 1, 3]`` and ``H = sum_l w_l (m_l - mu_m)(f_l - mu_f)^T [*, 3, 3]`` from
    ``m, f [*, A, 3]``, ``w [*, A]``, all in one dtype."""
    w = w[..., None]  # [*, A, 1]
    total = w.sum(-2, keepdim=True).clamp_min(1e-8)  # [*, 1, 1]; all-zero weights: centroid 0
    mu_m = (w * m).sum(-2, keepdim=True) / total  # [*, 1, 3]
    mu_f = (w * f).sum(-2, keepdim=True) / total
    h = torch.einsum("...ai,...aj->...ij", w * (m - mu_m), f - mu_f)  # [*, 3, 3]
    return mu_m, mu_f, h


def _rigid_transform_svd(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(moving.dtype, torch.float32)
    mu_m, mu_f, h = _centroids_and_covariance(moving.to(dtype), fixed.to(dtype), weights.to(dtype))
    # A diverged model's non-finite coordinates must reach the loss as NaN (the trainer's
    # non-finite guard then skips the step), not stop it with a LinAlgError from the solver.
    finite = torch.isfinite(h).all(-1).all(-1)[..., None, None]  # [*, 1, 1]; no host sync
    h = torch.where(finite, h, torch.zeros_like(h))
    u, _, vh = torch.linalg.svd(h)
    v = vh.transpose(-1, -2)
    # Reflection fix: flip the axis of the smallest singular value when det(V U^T) < 0.
    d = torch.sign(torch.linalg.det(v @ u.transpose(-1, -2)))
    d = torch.where(d == 0, torch.ones_like(d), d)
    flip = torch.ones(*d.shape, 3, dtype=dtype, device=d.device)
    flip[..., 2] = d
    rot = (v * flip[..., None, :]) @ u.transpose(-1, -2)  # V diag(1, 1, d) U^T
    rot = torch.where(finite, rot, torch.full_like(rot, float("nan")))
    return rot, mu_m, mu_f


def _rigid_transform_quaternion(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(moving.dtype, torch.float32)
    f64 = torch.float64  # the 4x4 eigenproblem is tiny: fp64 costs nothing and keeps fp64 inputs
    mu_m, mu_f, h = _centroids_and_covariance(moving.to(f64), fixed.to(f64), weights.to(f64))
    lam, vec = _jacobi_eigh4(_horn_matrix(h))  # [*, 4], [*, 4, 4]
    # The column of the largest eigenvalue (ties: the first; any unit vector of its eigenspace is
    # optimal). Every unit quaternion is a proper rotation, so degenerate inputs still give one;
    # H == 0 leaves K == 0 and V == I, hence q = (1, 0, 0, 0): the identity.
    top = lam.argmax(-1)[..., None, None].expand(*lam.shape[:-1], 4, 1)
    q = torch.gather(vec, -1, top).squeeze(-1)  # [*, 4]
    q = q * (q * q).sum(-1, keepdim=True).rsqrt()  # V is orthogonal: only rounding to remove
    return _quaternion_to_rotation(q).to(dtype), mu_m.to(dtype), mu_f.to(dtype)


def _horn_matrix(h: torch.Tensor) -> torch.Tensor:
    """Horn's symmetric ``K [*, 4, 4]`` from ``H [*, 3, 3]`` (``H_ij = sum_l w_l m_li f_lj``): for
    a unit quaternion ``q``, ``q^T K q = tr(R(q) H) = sum_l w_l f_l . R(q) m_l``, so the top
    eigenvector of K is the best rotation of ``moving`` onto ``fixed``:
    ``K = [[tr H, a^T], [a, H + H^T - tr(H) I]]``, ``a = (H_yz - H_zy, H_zx - H_xz, H_xy - H_yx)``.
    """
    hs = h + h.transpose(-1, -2)
    ha = h - h.transpose(-1, -2)
    tr = h.diagonal(dim1=-2, dim2=-1).sum(-1)  # [*]
    dd = hs.diagonal(dim1=-2, dim2=-1) - tr[..., None]  # [*, 3]: diagonal of H + H^T - tr I
    ax, ay, az = ha[..., 1, 2], ha[..., 2, 0], ha[..., 0, 1]
    entries = (
        tr, ax, ay, az,
        ax, dd[..., 0], hs[..., 0, 1], hs[..., 0, 2],
        ay, hs[..., 0, 1], dd[..., 1], hs[..., 1, 2],
        az, hs[..., 0, 2], hs[..., 1, 2], dd[..., 2],
    )  # fmt: skip
    return torch.stack(entries, -1).unflatten(-1, (4, 4))


def _jacobi_eigh4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues ``[*, 4]`` (unsorted) and eigenvectors ``V [*, 4, 4]`` (columns) of the
    symmetric ``k [*, 4, 4]`` by ``_SWEEPS`` cyclic Jacobi sweeps, batched over ``*``: each
    rotation ``J`` zeroes ``k_pq`` in ``J^T k J``; ``V`` accumulates the ``J``s."""
    zero = torch.zeros_like(k[..., 0, 0])  # [*]
    vec = torch.eye(4, dtype=k.dtype, device=k.device).expand(k.shape)
    for _ in range(_SWEEPS):
        for (p1, q1), (p2, q2) in _ROUNDS:
            e = torch.stack(
                (k[..., p1, p1], k[..., p2, p2], k[..., q1, q1], k[..., q2, q2],
                 k[..., p1, q1], k[..., p2, q2]), -1,
            )  # fmt: skip
            a_pp, a_qq, a_pq = e[..., 0:2], e[..., 2:4], e[..., 4:6]  # [*, 2]: the two pairs
            # t = tan(theta), the smaller root of t^2 + 2 t (a_qq - a_pp) / (2 a_pq) - 1 = 0 (the
            # rotation of angle <= pi/4 that converges), written without dividing by a_pq:
            # t = 2 a_pq / (d + sign(d) hypot(d, 2 a_pq)), d = a_qq - a_pp. a_pq == d == 0 (already
            # diagonal, e.g. H == 0) would be 0/0: the clamp makes it t = 0, no rotation.
            d = a_qq - a_pp
            two_apq = 2.0 * a_pq
            r = torch.hypot(d, two_apq).clamp_min(torch.finfo(k.dtype).tiny)
            t = two_apq / (d + torch.copysign(r, d))
            c = (1.0 + t * t).rsqrt()
            s = t * c
            ns = -s
            cols = [[zero] * 4 for _ in range(4)]
            for i, (p, q) in enumerate(((p1, q1), (p2, q2))):
                cols[p][p], cols[q][q] = c[..., i], c[..., i]
                cols[p][q], cols[q][p] = s[..., i], ns[..., i]
            j = torch.stack([x for row in cols for x in row], -1).unflatten(-1, (4, 4))
            k = j.transpose(-1, -2) @ (k @ j)
            vec = vec @ j
    return k.diagonal(dim1=-2, dim2=-1), vec


def _quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """``R [*, 3, 3]`` of the unit quaternion ``q = (w, x, y, z) [*, 4]``:
    ``R = (w^2 - |v|^2) I + 2 v v^T + 2 w [v]_x`` with ``v = (x, y, z)``."""
    w, v = q[..., 0], q[..., 1:]
    wv = w[..., None] * v  # [*, 3]
    x, y, z = wv.unbind(-1)
    zero = torch.zeros_like(w)
    cross = torch.stack((zero, -z, y, z, zero, -x, -y, x, zero), -1).unflatten(-1, (3, 3))
    scale = (w * w - (v * v).sum(-1))[..., None, None]  # [*, 1, 1]
    eye = torch.eye(3, dtype=q.dtype, device=q.device)
    return scale * eye + 2.0 * (v[..., :, None] * v[..., None, :] + cross)


def weighted_rigid_align(
    moving: torch.Tensor, fixed: torch.Tensor, weights: torch.Tensor, *, method: str = "auto"
) -> torch.Tensor:
    """``moving [*, A, 3]`` superposed onto ``fixed`` with per-atom ``weights [*, A]``; detached
    (Alg. 28 ends in stop_gradient), in ``moving``'s dtype. ``method`` as in
    ``weighted_rigid_transform``."""
    with torch.no_grad(), torch.autocast(moving.device.type, enabled=False):
        rot, mu_m, mu_f = weighted_rigid_transform(moving, fixed, weights, method=method)
        out = torch.einsum("...ij,...aj->...ai", rot, moving.to(rot.dtype) - mu_m) + mu_f
    return out.to(moving.dtype)
