"""AF3 smooth lDDT, lDDT and bond loss over sparse pair lists (fold_model.af3.pair_loss) against
the dense ``[B, S, A, A]`` formulas (``*_dense`` in fold_model.af3.loss): values and gradients
w.r.t. the predicted coordinates in fp64 (B = 2 with different padding, S = 3, odd atom counts,
masks with holes, nucleotide atoms, rigidly moved ground-truth copies), fp32 and bf16-autocast
inputs against the fp64 reference, and the tensors autograd saves (nothing of size ``S A A``)."""

from __future__ import annotations

import copy

import pytest
import torch
from _af3_helpers import random_features, rel_err
from fold_model.af3.config import config
from fold_model.af3.diffusion import noisy_training_samples, random_rotation
from fold_model.af3.loss import (
    LossPairs,
    atom_of_tokens,
    bond_loss,
    bond_loss_dense,
    diffusion_atom_weights,
    diffusion_loss,
    lddt,
    lddt_dense,
    loss_pair_lists,
    smooth_lddt_loss,
    smooth_lddt_loss_dense,
    weighted_mse_loss,
)
from fold_model.af3.pair_loss import bond_pair_list, lddt_pair_list
from torch.utils._python_dispatch import TorchDispatchMode

G = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
B, S, A = 2, 3, 61
REAL = (61, 44)  # real atoms of each batch element (the rest padding)


def _case(seed: int = 0, dtype=torch.float64):
    """Ground truth ``[B, S, A, 3]`` (rigidly moved copies of one chain-like structure: pairs
    within 15 A, between 15 and 30 A, beyond 30 A), predictions with per-sample noise 0.2-3 A,
    nucleotide flags and a mask with holes and different padding per batch element."""
    base = torch.cumsum(torch.randn(B, A, 3, generator=G(seed), dtype=torch.float64) * 2.6, 1)
    rot = random_rotation((B, S), G(seed + 1), torch.float64)
    shift = torch.randn(B, S, 1, 3, generator=G(seed + 2), dtype=torch.float64) * 10
    x_gt = torch.einsum("bsij,baj->bsai", rot, base) + shift
    mask = (torch.rand(B, A, generator=G(seed + 3)) > 0.15).double()
    for b, n in enumerate(REAL):
        mask[b, n:] = 0.0
        x_gt[b, :, n:] = 1e3 * torch.randn(S, A - n, 3, generator=G(seed + 4), dtype=torch.float64)
    nuc = torch.zeros(B, A, dtype=torch.bool)
    nuc[0, 20:31] = True
    nuc[1, 3:12] = True
    scale = torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)[None, :, None, None]
    x_pred = x_gt + scale * torch.randn(B, S, A, 3, generator=G(seed + 5), dtype=torch.float64)
    x_pred[0, 1, 7] = x_pred[0, 1, 8]  # two predicted atoms on top of each other (d = 0)
    return x_pred.to(dtype), x_gt.to(dtype), nuc, mask.to(dtype)


def _value_and_grad(fn, x_pred, *args, **kw):
    x = x_pred.detach().clone().requires_grad_(True)
    out = fn(x, *args, **kw)
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).view(out.shape)  # per-sample
    (out * w).sum().backward()
    return out.detach(), x.grad


def test_pair_list_matches_dense_pair_mask():
    _, x_gt, nuc, mask = _case()
    pairs = lddt_pair_list(x_gt[:, 0], nuc, mask, block_size=16)  # several row blocks
    dense = torch.zeros(B, A, A, dtype=torch.float64)
    dense.index_put_((pairs.batch, pairs.l, pairs.m), pairs.weight, accumulate=True)
    assert (pairs.l < pairs.m).all()
    d = torch.cdist(x_gt[:, 0], x_gt[:, 0], compute_mode="donot_use_mm_for_euclid_dist")
    radius = torch.where(nuc, 30.0, 15.0).double()
    c = (d < radius[:, None, :]).double() * mask[:, :, None] * mask[:, None, :]
    c = c * (1 - torch.eye(A, dtype=torch.float64))
    assert torch.equal(dense + dense.transpose(1, 2), c + c.transpose(1, 2))
    assert torch.equal(pairs.count, c.sum((1, 2)))
    # The 30 A nucleotide radius and the padding both matter in this case.
    assert ((d > 15) & (d < 30) & (c > 0)).any()
    assert (pairs.m[pairs.batch == 1] < REAL[1]).all()
    assert (pairs.m[pairs.batch == 0] >= REAL[1]).any()


@pytest.mark.parametrize("sharpness", [1.0, 3.0])
def test_smooth_lddt_sparse_equals_dense_fp64(sharpness):
    x_pred, x_gt, nuc, mask = _case(seed=1)
    ref, g_ref = _value_and_grad(smooth_lddt_loss_dense, x_pred, x_gt, nuc, mask, sharpness)
    for chunk in (None, 7):  # one chunk, and many chunks of pairs
        out, g = _value_and_grad(smooth_lddt_loss, x_pred, x_gt, nuc, mask, sharpness,
                                 chunk_elements=chunk)
        assert out.shape == (B, S) and out.dtype == torch.float64
        assert rel_err(out, ref) < 1e-12
        assert rel_err(g, g_ref) < 1e-10
    assert g_ref.abs().sum() > 0 and torch.isfinite(g).all()
    # Padding and masked atoms get no gradient; the loss differs between samples.
    off = (mask == 0)[:, None].expand(-1, S, -1)
    assert (g[off].abs().amax() == 0) and (g_ref[off].abs().amax() == 0)
    assert (out[:, 0] < out[:, 1]).all() and (out[:, 1] < out[:, 2]).all()


def test_smooth_lddt_ground_truth_copy_broadcast():
    """A single ground-truth copy ``[B, 1, A, 3]`` gives the same loss as the rigid copies."""
    x_pred, x_gt, nuc, mask = _case(seed=2)
    ref = smooth_lddt_loss_dense(x_pred, x_gt, nuc, mask)
    assert rel_err(smooth_lddt_loss(x_pred, x_gt[:, :1], nuc, mask), ref) < 1e-12


def test_lddt_sparse_equals_dense():
    x_pred, x_gt, nuc, mask = _case(seed=3)
    ref = lddt_dense(x_pred, x_gt, nuc, mask)
    out = lddt(x_pred, x_gt, nuc, mask)
    assert rel_err(out, ref) < 1e-12 and (ref < 1).all() and (ref > 0.1).all()
    assert torch.equal(lddt(x_gt, x_gt, nuc, mask), torch.ones(B, S, dtype=torch.float64))


def test_fp32_and_bf16_autocast_close_to_fp64_reference():
    x_pred, x_gt, nuc, mask = _case(seed=4)
    ref, g_ref = _value_and_grad(smooth_lddt_loss_dense, x_pred, x_gt, nuc, mask)
    out, g = _value_and_grad(smooth_lddt_loss, x_pred.float(), x_gt.float(), nuc, mask.float())
    assert out.dtype == torch.float32 and g.dtype == torch.float32
    # fp32 distances of ~50 A coordinates: ~1e-6 A rounding, sums over ~1e3 pairs
    assert (out.double() - ref).abs().max() < 1e-5
    assert rel_err(g, g_ref) < 1e-5
    # Under bf16 autocast the inputs are bf16 but the distances are computed in fp32: equal to
    # fp32 on the same (bf16-rounded) coordinates. (One ground-truth copy: bf16 copies rotated
    # differently round to distances ~0.1 A apart, so per-copy pair sets would differ.)
    xp16, xg16 = x_pred.bfloat16(), x_gt[:, :1].expand(-1, S, -1, -1).bfloat16()
    ref16 = smooth_lddt_loss_dense(xp16.double(), xg16.double(), nuc, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out16, g16 = _value_and_grad(smooth_lddt_loss, xp16, xg16, nuc, mask.float())
    assert out16.dtype == torch.float32 and g16.dtype == torch.bfloat16
    assert (out16.double() - ref16).abs().max() < 1e-5


def _bond_features(seed: int = 0):
    N = 13
    n_real = (13, 9)
    g = G(seed)
    center = torch.stack([torch.randperm(A, generator=g)[:N] for _ in range(B)])
    token_mask = torch.zeros(B, N, dtype=torch.float64)
    for b, n in enumerate(n_real):
        token_mask[b, :n] = 1
    resolved = (torch.rand(B, A, generator=g) > 0.1).double()
    bonds = (torch.rand(B, N, N, generator=g) > 0.6).double()
    bonds = torch.maximum(bonds, bonds.transpose(1, 2)) * (1 - torch.eye(N, dtype=torch.float64))
    return {"token_center_atom": center.int(), "token_mask": token_mask,
            "atom_resolved": resolved, "token_bonds": bonds}


def test_bond_loss_sparse_equals_dense():
    x_pred, x_gt, _, _ = _case(seed=5)
    f = _bond_features()
    ref, g_ref = _value_and_grad(bond_loss_dense, x_pred, x_gt, f)
    out, g = _value_and_grad(bond_loss, x_pred, x_gt, f)
    assert rel_err(out, ref) < 1e-12 and rel_err(g, g_ref) < 1e-10 and g_ref.abs().sum() > 0
    pairs = bond_pair_list(f)
    assert pairs.count[0] > pairs.count[1] > 0 and int(pairs.count.sum()) == pairs.l.numel()
    # fp32 under bf16 autocast: fp32 distances of the bf16 coordinates.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out16 = bond_loss(x_pred.bfloat16(), x_gt.bfloat16(), f)
    ref16 = bond_loss_dense(x_pred.bfloat16().double(), x_gt.bfloat16().double(), f)
    assert out16.dtype == torch.float32 and rel_err(out16, ref16) < 1e-5


def _saved(fn) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_saved_activations_are_linear_in_atoms_and_pairs():
    """The sparse loss saves its inputs (fp32 copies) and the pair list, nothing of ``S A A``
    size; the dense one saves several ``[B, S, A, A]`` tensors (the check can fail)."""
    x_pred, x_gt, nuc, mask = _case(seed=6, dtype=torch.float32)
    x = x_pred.requires_grad_(True)
    pairs = lddt_pair_list(x_gt[:, 0], nuc, mask)
    sparse = _saved(lambda: smooth_lddt_loss(x, x_gt, nuc, mask, pairs=pairs).sum())
    dense = _saved(lambda: smooth_lddt_loss_dense(x, x_gt, nuc, mask).sum())
    big = B * S * A * A
    assert sum(t.numel() >= big for t in dense) >= 4
    assert max(t.numel() for t in sparse) < S * A * A
    n_pairs = pairs.l.numel()
    bound = 2 * x.numel() * 4 + 4 * n_pairs * 8  # x_pred, x_gt copies; batch, l, m, weight
    assert sum(t.numel() * t.element_size() for t in sparse) <= bound


def test_diffusion_loss_equals_dense_terms_on_augmented_copies():
    """``diffusion_loss`` (sparse terms, ground-truth distances from the un-augmented positions)
    == Eq. 6 with the dense formulas on the augmented copies: value and gradient, fp64."""
    f = {k: v.double() if v.is_floating_point() else v
         for k, v in random_features(n_token=9, batch=2, seed=7).items()}
    f["token_mask"][1, 5:] = 0.0  # batch element 1: fewer real tokens and atoms
    f["atom_mask"][1] *= (f["atom_to_token"][1] < 5).double()
    f["is_dna"][0, 2:4] = 1  # nucleotide atoms (30 A radius)
    bonds = (torch.rand(2, 10, 10, generator=G(8)) > 0.7).double()
    f["token_bonds"] = torch.maximum(f["token_bonds"], torch.maximum(bonds, bonds.transpose(1, 2)))
    cfg = copy.deepcopy(config("tiny").loss)
    cfg.bond_weight = 1.0
    diff_cfg = config("tiny").diffusion
    gt_aug, _, sigma = noisy_training_samples(f["atom_positions"], f["atom_mask"], 3, diff_cfg,
                                              G(9))
    x = gt_aug + 0.7 * torch.randn(gt_aug.shape, generator=G(10), dtype=torch.float64)
    out, g = _value_and_grad(lambda y: diffusion_loss(y, gt_aug, sigma, f, cfg, 16.0)[
        "diffusion"].reshape(1), x)

    def dense(y):
        mask = f["atom_mask"] * f["atom_resolved"]
        tok = f["atom_to_token"]
        nuc = (atom_of_tokens(f["is_dna"], tok) + atom_of_tokens(f["is_rna"], tok)) > 0
        mse = weighted_mse_loss(y, gt_aug, diffusion_atom_weights(f, cfg).double(), mask)
        edm = (sigma.square() + 16.0**2) / (sigma * 16.0).square()
        structural = mse + cfg.bond_weight * bond_loss_dense(y, gt_aug, f)
        smooth = smooth_lddt_loss_dense(y, gt_aug, nuc, mask)
        return ((edm * structural).mean() + cfg.smooth_lddt_weight * smooth.mean()).reshape(1)

    ref, g_ref = _value_and_grad(dense, x)
    assert rel_err(out, ref) < 1e-12 and rel_err(g, g_ref) < 1e-10
    parts = diffusion_loss(x, gt_aug, sigma, f, cfg, 16.0)
    assert parts["bond"] > 0 and parts["smooth_lddt"] > 0
    # Pair lists built beforehand and padded to fixed lengths (CUDA graphs): same value and
    # gradient, and no data-dependent op (nonzero) inside the loss.
    pairs = loss_pair_lists(f, cfg, torch.float64)
    assert pairs.bond is not None and pairs.bond.n_pairs > 0
    lddt_cap, bond_cap = pairs.capacities()
    assert lddt_cap >= 1.25 * pairs.lddt.n_pairs and lddt_cap % (1 << 14) == 0
    padded = LossPairs.from_tensors(pairs.padded(lddt_cap + 3, bond_cap + 5).tensors())
    assert padded.lddt.n_pairs == lddt_cap + 3 and padded.bond.n_pairs == bond_cap + 5
    ops_called = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops_called.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops():
        out_p, g_p = _value_and_grad(lambda y: diffusion_loss(
            y, gt_aug, sigma, f, cfg, 16.0, pairs=padded)["diffusion"].reshape(1), x)
    assert "nonzero" not in ops_called and "index_add" in ops_called
    assert rel_err(out_p, out) < 1e-12 and rel_err(g_p, g) < 1e-12


def test_padded_pair_list_refuses_to_truncate():
    _, x_gt, nuc, mask = _case()
    pairs = lddt_pair_list(x_gt[:, 0], nuc, mask)
    with pytest.raises(ValueError, match=f"{pairs.n_pairs} pairs, more than the capacity"):
        pairs.padded(pairs.n_pairs - 1)
    with pytest.raises(KeyError, match="pairs/lddt"):
        LossPairs.from_tensors({})
