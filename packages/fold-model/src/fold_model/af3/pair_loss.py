"""AF3 losses over sparse atom-pair lists: smooth lDDT (supplement Alg. 27), lDDT and the bond
loss (Eq. 5) without any ``[B, S, A, A]`` tensor.

lDDT scores the ordered pairs ``(l, m)``, ``l != m``, both real, whose ground-truth distance is
under 15 A (30 A when ``m`` is a nucleotide atom). Distances are symmetric, so a pair list holds
each unordered pair ``l < m`` once with ``weight`` = how many of its two orders are scored (1 or
2). Ground-truth distances do not change under the rigid augmentation of the ``S`` copies: the
list is built once from one copy, blockwise (an ``[A, A]`` byte mask, never a float ``[A, A]``).

The predicted distances are gathered per pair (``[P_c, S]`` per chunk of pairs) inside a custom
autograd function that keeps only its inputs (``O(B S A 3 + P)``) and recomputes the chunks in
backward. Distances are computed in fp32 (fp64 for fp64 inputs), also under autocast.

Shapes: ``B`` batch, ``S`` samples, ``A`` atoms, ``N`` tokens, ``P`` pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = [
    "LDDT_THRESHOLDS",
    "PairList",
    "pair_capacity",
    "lddt_pair_list",
    "bond_pair_list",
    "smooth_lddt_sum",
    "lddt_sum",
    "pair_distances",
]

LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)
_CHUNK_ELEMENTS = 1 << 22  # pair x sample elements per chunk: [P_c, S, 3] fp32 is 48 MiB


class PairList(NamedTuple):
    """Atom pairs of a padded batch: ``batch, l, m [P]`` (int64 indices), ``weight [P]`` (the
    number of ordered pairs each entry stands for) and ``count [B]`` (the weights summed per batch
    element: the denominator of a mean over pairs)."""

    batch: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the supplement's atom index names)
    m: torch.Tensor
    weight: torch.Tensor
    count: torch.Tensor

    @property
    def n_pairs(self) -> int:
        return self.batch.shape[0]

    def padded(self, capacity: int) -> PairList:
        """The same list with ``capacity`` entries: the pairs, then entries of weight 0 for
        ``(batch 0, atom 0, atom 0)``, which add nothing to any sum (and no gradient: their
        distances are 0). A list of fixed length lets a CUDA graph replay the losses for
        any batch whose list fits. Raises ``ValueError`` when the list is longer."""
        n = self.n_pairs
        if n > capacity:
            raise ValueError(f"pair list has {n} pairs, more than the capacity {capacity}")
        pad = capacity - n

        def ext(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros(pad)])

        return PairList(ext(self.batch), ext(self.l), ext(self.m), ext(self.weight), self.count)


def pair_capacity(n_pairs: int, headroom: float = 1.25, quantum: int = 1 << 14) -> int:
    """A fixed pair-list length for ``n_pairs`` pairs with ``headroom`` for later batches,
    rounded up to a multiple of ``quantum`` (for :meth:`PairList.padded` under CUDA graphs)."""
    return max(quantum, -(-int(n_pairs * headroom) // quantum) * quantum)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.no_grad()
def lddt_pair_list(
    x_gt: torch.Tensor, is_nucleotide: torch.Tensor, mask: torch.Tensor, block_size: int = 256
) -> PairList:
    """The pairs lDDT scores, from one ground-truth copy ``x_gt [B, A, 3]``; ``is_nucleotide,
    mask [B, A]``. Unordered pairs ``l < m`` with weight ``[d < r_m] + [d < r_l]`` (``r`` 30 A
    for nucleotide atoms, else 15 A). Works in row blocks of ``block_size`` atoms: the largest
    temporary is ``[block_size, A, 3]``."""
    if x_gt.dim() != 3 or x_gt.shape[-1] != 3:
        raise ValueError(f"lddt_pair_list: x_gt must be [B, A, 3], got {tuple(x_gt.shape)}")
    B, A = mask.shape
    x = x_gt.detach().to(_compute_dtype(x_gt))
    real = mask > 0
    radius = torch.where(is_nucleotide.bool(), 30.0, 15.0).to(x.dtype)  # [B, A]
    scored = torch.zeros(B, A, A, dtype=torch.uint8, device=x.device)  # weight of (l, m), l < m
    cols = torch.arange(A, device=x.device)
    for b in range(B):
        for start in range(0, A, block_size):
            rows = slice(start, min(start + block_size, A))
            m_cols = slice(start, A)  # only m >= start can have l < m
            d = (x[b, rows, None, :] - x[b, None, m_cols, :]).square().sum(-1).sqrt()  # [Lb, Mb]
            ok = real[b, rows, None] & real[b, None, m_cols]
            ok &= cols[rows, None] < cols[None, m_cols]
            w = (ok & (d < radius[b, None, m_cols])).to(torch.uint8)
            w += (ok & (d < radius[b, rows, None])).to(torch.uint8)
            scored[b, rows, m_cols] = w
    bi, li, mi = scored.nonzero(as_tuple=True)
    weight = scored[bi, li, mi].to(x.dtype)
    count = torch.zeros(B, dtype=x.dtype, device=x.device).index_add_(0, bi, weight)
    return PairList(bi, li, mi, weight, count)


@torch.no_grad()
def bond_pair_list(feats: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> PairList:
    """The bonded atom pairs of the bond loss (Eq. 5): the centre atoms of the token pairs
    ``i < j`` of ``token_bonds [B, N, N]`` whose centre atoms are resolved (bonds with a one-atom
    ligand token, whose centre is the bonded atom itself). ``weight`` is the ``token_bonds``
    entry."""
    center = feats["token_center_atom"].long()  # [B, N]
    ok = feats["atom_resolved"].gather(1, center) * feats["token_mask"]  # [B, N]
    bonds = torch.triu(feats["token_bonds"], 1) * ok[:, :, None] * ok[:, None, :]  # [B, N, N]
    bi, i, j = bonds.nonzero(as_tuple=True)
    weight = bonds[bi, i, j].to(dtype)
    count = bonds.sum((-1, -2)).to(dtype)
    return PairList(bi, center[bi, i], center[bi, j], weight, count)


def _atom_major(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, S, A, 3]`` -> ``[B * A, S, 3]`` (row ``b * A + l``), contiguous (a pair's gather
    reads ``S * 3`` adjacent values), in ``dtype``."""
    B, S, A, _ = x.shape
    return x.detach().to(dtype).transpose(1, 2).reshape(B * A, S, 3).contiguous()


def _chunks(n_pairs: int, n_samples: int, chunk_elements: int | None):
    step = max(1, (chunk_elements or _CHUNK_ELEMENTS) // max(n_samples, 1))
    for start in range(0, n_pairs, step):
        yield slice(start, min(start + step, n_pairs))


def _gathered(xp, xg, fl, fm):
    """Per pair: the predicted difference vector ``[P_c, S, 3]``, its length and the ground-truth
    distance ``[P_c, S]`` (``S`` of the ground truth may be 1: broadcast)."""
    v = xp.index_select(0, fl) - xp.index_select(0, fm)
    d = v.square().sum(-1).sqrt()
    d_gt = (xg.index_select(0, fl) - xg.index_select(0, fm)).square().sum(-1).sqrt()
    return v, d, d_gt


class _SmoothLDDTSum(torch.autograd.Function):
    """``num[b, s] = sum_p weight_p eps_p`` with ``eps = 1/4 sum_t sigmoid(k (t - |d - d_gt|))``
    (Alg. 27 lines 1-4 summed over the pair list); gradient w.r.t. ``x_pred`` only."""

    @staticmethod
    def forward(ctx, x_pred, x_gt, batch, fl, fm, weight, sharpness, chunk_elements):
        B, S = x_pred.shape[:2]
        dtype = _compute_dtype(x_pred)
        with torch.autocast(x_pred.device.type, enabled=False):
            xp, xg = _atom_major(x_pred, dtype), _atom_major(x_gt, dtype)
            weight = weight.to(dtype)
            num = torch.zeros(B, S, dtype=dtype, device=x_pred.device)
            for c in _chunks(fl.shape[0], S, chunk_elements):
                _, d, d_gt = _gathered(xp, xg, fl[c], fm[c])
                err = (d - d_gt).abs()
                eps = sum(torch.sigmoid(sharpness * (t - err)) for t in LDDT_THRESHOLDS) / 4.0
                num.index_add_(0, batch[c], eps * weight[c, None])
        ctx.save_for_backward(xp, xg, batch, fl, fm, weight)
        ctx.sharpness, ctx.chunk_elements = sharpness, chunk_elements
        ctx.x_shape, ctx.x_dtype = x_pred.shape, x_pred.dtype
        return num

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_num):
        xp, xg, batch, fl, fm, weight = ctx.saved_tensors
        k = ctx.sharpness
        B, S, A, _ = ctx.x_shape
        with torch.autocast(xp.device.type, enabled=False):
            g = grad_num.to(xp.dtype)
            grad = torch.zeros_like(xp)  # [B * A, S, 3]
            for c in _chunks(fl.shape[0], S, ctx.chunk_elements):
                v, d, d_gt = _gathered(xp, xg, fl[c], fm[c])
                r = d - d_gt
                e = r.abs()
                slope = sum((lambda s: s * (1 - s))(torch.sigmoid(k * (t - e)))
                            for t in LDDT_THRESHOLDS)  # -d eps / d e * 4 / k
                coef = g.index_select(0, batch[c]) * weight[c, None] * (-k / 4.0) * slope
                coef = coef * torch.sign(r) / torch.where(d > 0, d, torch.ones_like(d))
                gv = coef[..., None] * v  # d num / d x_l; d / d x_m is its negative
                grad.index_add_(0, fl[c], gv)
                grad.index_add_(0, fm[c], -gv)
        grad = grad.view(B, A, S, 3).transpose(1, 2).to(ctx.x_dtype)
        return grad, None, None, None, None, None, None, None


def _check(x_pred: torch.Tensor, x_gt: torch.Tensor, pairs: PairList, name: str) -> None:
    if x_pred.dim() != 4 or x_pred.shape[-1] != 3:
        raise ValueError(f"{name}: x_pred must be [B, S, A, 3], got {tuple(x_pred.shape)}")
    B, S, A, _ = x_pred.shape
    if x_gt.dim() != 4 or x_gt.shape[0] != B or x_gt.shape[1] not in (1, S) or x_gt.shape[2] != A:
        raise ValueError(f"{name}: x_gt must be [B, S or 1, A, 3] = [{B}, {S}, {A}, 3], "
                         f"got {tuple(x_gt.shape)}")
    if pairs.count.shape[0] != B:
        raise ValueError(f"{name}: pair list is for batch {pairs.count.shape[0]}, x_pred for {B}")


def smooth_lddt_sum(
    x_pred: torch.Tensor, x_gt: torch.Tensor, pairs: PairList, sharpness: float = 1.0,
    chunk_elements: int | None = None,
) -> torch.Tensor:
    """``sum_(l, m) eps_lm`` over the pair list, per sample ``[B, S]`` (differentiable w.r.t.
    ``x_pred [B, S, A, 3]``; ``x_gt [B, S or 1, A, 3]`` is a constant). Saves only ``x_pred``,
    ``x_gt`` (as fp32 copies) and the pair list for backward."""
    _check(x_pred, x_gt, pairs, "smooth_lddt_sum")
    B, _, A, _ = x_pred.shape
    fl, fm = pairs.batch * A + pairs.l, pairs.batch * A + pairs.m
    return _SmoothLDDTSum.apply(x_pred, x_gt, pairs.batch, fl, fm, pairs.weight,
                                float(sharpness), chunk_elements)


@torch.no_grad()
def lddt_sum(
    x_pred: torch.Tensor, x_gt: torch.Tensor, pairs: PairList, chunk_elements: int | None = None
) -> torch.Tensor:
    """``sum_(l, m) 1/4 sum_t [|d - d_gt| < t]`` over the pair list, per sample ``[B, S]``."""
    _check(x_pred, x_gt, pairs, "lddt_sum")
    B, S, A, _ = x_pred.shape
    dtype = _compute_dtype(x_pred)
    fl, fm = pairs.batch * A + pairs.l, pairs.batch * A + pairs.m
    with torch.autocast(x_pred.device.type, enabled=False):
        xp, xg = _atom_major(x_pred, dtype), _atom_major(x_gt, dtype)
        weight = pairs.weight.to(dtype)
        num = torch.zeros(B, S, dtype=dtype, device=x_pred.device)
        for c in _chunks(fl.shape[0], S, chunk_elements):
            _, d, d_gt = _gathered(xp, xg, fl[c], fm[c])
            err = (d - d_gt).abs()
            score = sum((err < t).to(dtype) for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
            num.index_add_(0, pairs.batch[c], score * weight[c, None])
    return num


def pair_distances(x: torch.Tensor, pairs: PairList) -> torch.Tensor:
    """``|x_l - x_m|`` per pair and sample, ``x [B, S, A, 3]`` -> ``[P, S]`` in fp32 (fp64 for
    fp64 input), differentiable (saves ``[P, S, 3]``: for short lists such as bonds)."""
    dtype = _compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        v = x[pairs.batch, :, pairs.l].to(dtype) - x[pairs.batch, :, pairs.m].to(dtype)
        return torch.linalg.vector_norm(v, dim=-1)
