"""pTM, ipTM, chain-pair ipTM, chain-pair minimum PAE, contact probabilities and the ranking
score (fold_train.confidence; AF2's pTM of fold_train.predict) against float64 references
written here from the formulas (AF2 supplement 1.9.7 eq. 40; AF3 supplement 5.9.1-5.9.3 as
AF3's released code computes them), on hand-built PAE logits: odd sizes, three chains of
different lengths, and frames missing (an ion, holes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fold_train.confidence import (
    chain_iptm,
    chain_pair_iptm,
    chain_pair_pae_min,
    contact_probs,
    interface_token_counts,
    predicted_tm,
    ranking_score,
    tm_adjusted_pae,
)

# float32 softmax and a sum over 64 bins: relative error ~64 ulp (~1e-5) at worst
F32_TOL = 1e-5
# float64: exact but for AF3's 1e-8 in the normaliser of the mean over tokens (sum_j w / (1e-8 +
# sum_j w)), a relative 1e-8 / N below 1e-9
F64_TOL = 1e-9


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _d0(n: float) -> float:
    return 1.24 * (max(n, 19) - 15) ** (1 / 3) - 1.8


def ref_tm_pair(logits: np.ndarray, centres: np.ndarray, i: int, j: int, n: float) -> float:
    """E_b[1 / (1 + (e_b / d0(n))^2)] of pair (i, j), float64."""
    p = _softmax(logits[i, j].astype(np.float64))
    return float(sum(p[b] / (1 + (centres[b] / _d0(n)) ** 2) for b in range(len(centres))))


def ref_ptm(logits, centres, frame, asym, tokens, interface: bool) -> float:
    """max over aligned frames i (valid) of the mean over the scored tokens j; ``tokens``: the
    tokens of the (sub)complex; d0 from their count."""
    n = len(tokens)
    best = -math.inf
    for i in tokens:
        if not frame[i]:
            continue
        js = [j for j in tokens if not interface or asym[j] != asym[i]]
        if js:
            best = max(best, sum(ref_tm_pair(logits, centres, i, j, n) for j in js) / len(js))
    return best if best > -math.inf else math.nan


@pytest.fixture(scope="module")
def complex_logits():
    """23 tokens: chain 0 (12 tokens, two without a frame), chain 1 (10), chain 2 (an ion:
    one token, no frame); PAE logits with structure (low error within chain 0)."""
    rng = np.random.default_rng(7)
    asym = np.array([0] * 12 + [1] * 10 + [2])
    n = len(asym)
    logits = rng.normal(0, 2, (n, n, 64))
    logits[:12, :12, :8] += 4.0  # confident within chain 0
    frame = np.ones(n, bool)
    frame[[3, 7, 22]] = False
    centres = (np.arange(64) + 0.5) * 0.5  # fold's AF3 head: 0.5 A bins from 0
    return logits, centres, frame, asym


def _tm(logits, centres, n_tokens, dtype=torch.float32) -> np.ndarray:
    return tm_adjusted_pae(torch.tensor(logits, dtype=dtype), torch.tensor(centres),
                           n_tokens).double().numpy()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, F32_TOL), (torch.float64, F64_TOL)])
def test_ptm_iptm_against_float64_reference(complex_logits, dtype, tol):
    logits, centres, frame, asym = complex_logits
    n = len(asym)
    tm = _tm(logits, centres, torch.tensor(float(n)), dtype)
    for i, j in [(0, 0), (3, 20), (22, 5), (11, 12)]:
        assert tm[i, j] == pytest.approx(ref_tm_pair(logits, centres, i, j, n), abs=tol)
    tokens = list(range(n))
    assert predicted_tm(tm, frame) == pytest.approx(
        ref_ptm(logits, centres, frame, asym, tokens, False), abs=tol)
    assert predicted_tm(tm, frame, asym, interface=True) == pytest.approx(
        ref_ptm(logits, centres, frame, asym, tokens, True), abs=tol)


def test_chain_pair_iptm_against_float64_reference(complex_logits):
    logits, centres, frame, asym = complex_logits
    counts = interface_token_counts(torch.tensor(asym))
    tm_int = _tm(logits, centres, counts, torch.float64)
    pair = chain_pair_iptm(tm_int, frame, asym)
    assert pair.shape == (3, 3) and np.allclose(pair, pair.T, equal_nan=True)
    for a in range(3):
        for b in range(3):
            tokens = [t for t in range(len(asym)) if asym[t] in (a, b)]
            ref = ref_ptm(logits, centres, frame, asym, tokens, interface=a != b)
            if math.isnan(ref):
                assert math.isnan(pair[a, b])
            else:
                assert pair[a, b] == pytest.approx(ref, abs=F64_TOL)
    assert math.isnan(pair[2, 2])  # the ion has no frame: its chain pTM is undefined (null)
    # each chain's ipTM: the mean of its off-diagonal row and column means, NaN ignored
    per_chain = chain_iptm(pair)
    for a in range(3):
        others = [pair[a, b] for b in range(3) if b != a and not math.isnan(pair[a, b])]
        assert per_chain[a] == pytest.approx(np.mean(others), abs=1e-12)


def test_interface_token_counts_and_chain_pair_pae_min(complex_logits):
    logits, centres, frame, asym = complex_logits
    counts = interface_token_counts(torch.tensor(asym)).numpy()
    sizes = {0: 12, 1: 10, 2: 1}
    for i in (0, 13, 22):
        for j in (1, 15, 22):
            a, b = asym[i], asym[j]
            assert counts[i, j] == (sizes[a] if a == b else sizes[a] + sizes[b])
    pae = (_softmax(logits) * centres).sum(-1)
    got = chain_pair_pae_min(pae, frame, asym)
    for a in range(3):
        for b in range(3):
            vals = [pae[i, j] for i in range(len(asym)) for j in range(len(asym))
                    if asym[i] == a and frame[i] and asym[j] == b]
            if vals:
                assert got[a, b] == pytest.approx(min(vals), abs=1e-12)
            else:
                assert math.isnan(got[a, b])  # an ion aligns nothing


def test_known_values_and_single_chain():
    """All PAE mass in the first bin: tm = 1 / (1 + (0.25 / d0)^2) everywhere; one chain has
    no ipTM (NaN, AF3's null), and its ranking score is its pTM."""
    n = 31
    logits = np.full((n, n, 64), -1e4)
    logits[..., 0] = 0.0
    centres = (np.arange(64) + 0.5) * 0.5
    tm = _tm(logits, centres, torch.tensor(float(n)), torch.float64)
    expected = 1 / (1 + (0.25 / _d0(n)) ** 2)
    assert predicted_tm(tm, np.ones(n, bool)) == pytest.approx(expected, abs=F64_TOL)
    asym = np.zeros(n, int)
    iptm = predicted_tm(tm, np.ones(n, bool), asym, interface=True)
    assert math.isnan(iptm)
    assert math.isnan(predicted_tm(tm, np.zeros(n, bool)))  # no frame at all
    assert ranking_score(0.7, iptm, 0.0, False) == pytest.approx(0.7)
    assert ranking_score(0.5, 0.9, 0.2, False) == pytest.approx(0.8 * 0.9 + 0.2 * 0.5 + 0.1)
    assert ranking_score(0.5, 0.9, 0.0, True) == pytest.approx(0.82 - 100)
    assert np.isnan(chain_iptm(np.array([[0.4]]))).all()


def test_contact_probs_threshold():
    """Mass in the bin whose top edge is the last one at or below 8 A counts; the next bin
    (top edge above 8 A) does not."""
    first, last, bins = 2.0, 22.0, 64  # fold's AF3 distogram
    breaks = np.linspace(first, last, bins - 1)
    inside = int(np.flatnonzero(breaks <= 8.0)[-1])  # bin `inside` ends at breaks[inside]
    logits = torch.full((2, 2, bins), -1e4, dtype=torch.float64)
    logits[0, :, inside] = 0.0
    logits[1, :, inside + 1] = 0.0
    got = contact_probs(logits, first, last)
    assert got[0].tolist() == pytest.approx([1.0, 1.0]) and got[1].tolist() == pytest.approx(
        [0.0, 0.0], abs=1e-6)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 5, bins))
    ref = (_softmax(x)[..., : inside + 1]).sum(-1)
    assert np.allclose(contact_probs(torch.tensor(x), first, last).numpy(), ref, atol=F32_TOL)


def test_af2_ptm_and_pae_against_float64_reference():
    """AF2's pTM head (1.9.7): fold_train.predict's PAE and pTM from hand-built logits ``[N, N,
    64]`` against the reference with AF2's bins (63 breaks 0..31 A, a catch-all last bin)."""
    from fold_model.af2.heads import HeadsConfig
    from fold_train.predict import _aligned_error

    rng = np.random.default_rng(3)
    n = 37
    logits = rng.normal(0, 1.5, (n, n, 64))
    logits[:20, :20, :10] += 3.0
    breaks = np.linspace(0.0, 31.0, 63)
    step = breaks[1] - breaks[0]
    centres = np.append(breaks + step / 2, breaks[-1] + 1.5 * step)
    got = _aligned_error(torch.tensor(logits, dtype=torch.float32), HeadsConfig(tm_enabled=True))
    ref = ref_ptm(logits, centres, np.ones(n, bool), np.zeros(n, int), list(range(n)), False)
    assert got["ptm"] == pytest.approx(ref, abs=F32_TOL)
    assert np.allclose(got["pae"], (_softmax(logits) * centres).sum(-1), atol=1e-4)
    assert got["max_pae"] == pytest.approx(centres[-1])
    # fold's AF3-style pTM on the same logits with AF2's bins is the same number
    tm = _tm(logits, centres, torch.tensor(float(n)), torch.float64)
    assert predicted_tm(tm, np.ones(n, bool)) == pytest.approx(ref, abs=F64_TOL)
