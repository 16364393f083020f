"""Output heads: shapes at odd sizes, pLDDT range, PAE / pTM against hand-computed values."""

from __future__ import annotations

import math

import torch
from fold_model.af2.heads import (
    AuxiliaryHeads,
    DistogramHead,
    HeadsConfig,
    compute_plddt,
    compute_predicted_aligned_error,
    compute_tm,
)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def _outputs(n: int = 7, n_clust: int = 5, c_m: int = 6, c_z: int = 4, c_s: int = 9):
    gen = torch.Generator().manual_seed(0)
    return {
        "msa": torch.randn(2, n_clust, n, c_m, generator=gen),
        "pair": torch.randn(2, n, n, c_z, generator=gen),
        "single": torch.randn(2, n, c_s, generator=gen),
        "sm": {"single": torch.randn(2, n, c_s, generator=gen)},
    }


def test_auxiliary_heads_shapes_and_plddt_range() -> None:
    heads = AuxiliaryHeads(HeadsConfig(tm_enabled=True), c_m=6, c_z=4, c_s=9)
    _randomize(heads, 1)
    out = heads(_outputs())
    expected = {
        "distogram_logits": (2, 7, 7, 64), "masked_msa_logits": (2, 5, 7, 23),
        "lddt_logits": (2, 7, 50), "plddt": (2, 7), "experimentally_resolved_logits": (2, 7, 37),
        "tm_logits": (2, 7, 7, 64), "predicted_aligned_error": (2, 7, 7), "ptm": (2,),
        "aligned_confidence_probs": (2, 7, 7, 64),
    }
    for key, shape in expected.items():
        assert out[key].shape == shape, key
        assert torch.isfinite(out[key]).all(), key
    assert out["plddt"].min() >= 0 and out["plddt"].max() <= 100
    assert out["plddt"].std() > 0  # random weights: not a constant
    assert torch.all((out["ptm"] > 0) & (out["ptm"] <= 1))
    sum(v.sum() for k, v in out.items() if v.requires_grad).backward()
    assert all(torch.isfinite(p.grad).all() for p in heads.parameters())


def test_heads_read_the_right_single_representation() -> None:
    heads = AuxiliaryHeads(HeadsConfig(), c_m=6, c_z=4, c_s=9)
    _randomize(heads, 2)
    outputs = _outputs()
    out = heads(outputs)
    torch.testing.assert_close(out["lddt_logits"], heads.plddt(outputs["sm"]["single"]))
    torch.testing.assert_close(out["experimentally_resolved_logits"],
                               heads.experimentally_resolved(outputs["single"]))
    assert "tm_logits" not in out


def test_distogram_logits_symmetric() -> None:
    head = DistogramHead(4, 64)
    _randomize(head, 3)
    logits = head(torch.randn(1, 5, 5, 4))
    torch.testing.assert_close(logits, logits.transpose(1, 2))


def test_compute_plddt_bin_centres() -> None:
    logits = torch.full((1, 3, 50), -1e4)
    logits[0, 0, 0] = 0.0  # all mass in the first bin -> 1
    logits[0, 1, 49] = 0.0  # last bin -> 99
    logits[0, 2] = 0.0  # uniform -> 50
    torch.testing.assert_close(compute_plddt(logits), torch.tensor([[1.0, 99.0, 50.0]]))


def test_pae_and_ptm_hand_computed() -> None:
    no_bins, max_bin = 64, 31.0
    step = max_bin / (no_bins - 2)
    logits = torch.full((4, 4, no_bins), -1e4, dtype=torch.float64)
    logits[..., 2] = 0.0  # every pair certain in bin 2: error = 2.5 steps
    pae = compute_predicted_aligned_error(logits, max_bin, no_bins)
    torch.testing.assert_close(pae["predicted_aligned_error"],
                               torch.full((4, 4), 2.5 * step, dtype=torch.float64))
    torch.testing.assert_close(pae["max_predicted_aligned_error"],
                               torch.tensor(max_bin + 1.5 * step, dtype=torch.float64))
    # pTM for N = 4 (clipped to 19): d0 = 1.24 * 4^(1/3) - 1.8
    d0 = 1.24 * 4 ** (1 / 3) - 1.8
    expected = 1.0 / (1.0 + (2.5 * step / d0) ** 2)
    got = compute_tm(logits, max_bin=max_bin, no_bins=no_bins)
    assert math.isclose(float(got), expected, rel_tol=1e-7)
    # masked residues do not count: a residue with terrible errors, weighted 0, is ignored
    logits2 = logits.clone()
    logits2[:, 3] = -1e4
    logits2[:, 3, -1] = 0.0
    weights = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert math.isclose(float(compute_tm(logits2, weights)), expected, rel_tol=1e-7)
    assert float(compute_tm(logits2)) < 0.8 * expected
