"""AF3's pair confidences reduced in the confidence head (``fold_train.predict_graphs``):

* :func:`pair_reducer` on row blocks and :func:`_pair_confidences` (the plain path) give AF3's
  formulas pair by pair, against a float64 numpy loop over the pairs: expected PAE / PDE, the
  TM-adjusted PAE with the complex's normaliser and with each chain pair's token count (three
  chains, padded tokens);
* a prediction of a real complex (FKBP51 + FK506, cropped) with the logits reduced in the head
  (per sample group and ``--chunk-size`` row block) equals the plain path, which makes every
  sample's ``[S, N, N, 64]`` logits and reduces them afterwards.

Tolerances: the reduction is the same elementwise formula on the same fp32 logits; the row
blocks change only how many rows one GEMM of the PAE / PDE heads sees (a different summation
order at most), so fp32 outputs agree to 1e-5 of their scale (as test_af3_chunked_predict.py's
chunked == unchunked, 2 trunk passes and 3 sampler steps in front of the head). The formula
test feeds float64 logits to float32 reductions (``expected_value`` sums in float32; the bin
centres are float32): a few float32 ulps of a sum of 64 bins, 2e-6 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _af3_helpers import fkbp_crop_batch, noisy_tiny_af3
from fold_model.af3 import config
from fold_train.buckets import BucketPolicy
from fold_train.parallelize import Techniques, parallelize
from fold_train.predict_graphs import (
    PAIR_REDUCED,
    AF3Predictor,
    _pair_confidences,
    pair_reducer,
)

RTOL = 1e-5
RUN = dict(no_cycles=2, no_samples=3, no_steps=3)


def _numpy_reference(pae, pde, asym, pae_max, pde_max):
    """AF3's pair confidences of one sample, pair by pair: logits ``[N, N, bins]``."""
    n, bins = len(asym), pae.shape[-1]
    centres_pae = (np.arange(bins) + 0.5) * pae_max / bins
    centres_pde = (np.arange(pde.shape[-1]) + 0.5) * pde_max / pde.shape[-1]

    def d0(k):
        return 1.24 * (max(k, 19) - 15) ** (1 / 3) - 1.8

    out = {k: np.zeros((n, n)) for k in PAIR_REDUCED}
    for i in range(n):
        for j in range(n):
            p = np.exp(pae[i, j] - pae[i, j].max())
            p /= p.sum()
            q = np.exp(pde[i, j] - pde[i, j].max())
            q /= q.sum()
            ci, cj = (asym == asym[i]).sum(), (asym == asym[j]).sum()
            pair_n = ci if asym[i] == asym[j] else ci + cj
            out["pae"][i, j] = (p * centres_pae).sum()
            out["pde"][i, j] = (q * centres_pde).sum()
            out["tm_global"][i, j] = (p / (1 + (centres_pae / d0(n)) ** 2)).sum()
            out["tm_interface"][i, j] = (p / (1 + (centres_pae / d0(pair_n)) ** 2)).sum()
    return out


def test_reductions_follow_af3_pair_by_pair():
    cfg = config("tiny")
    c = cfg.confidence
    asym = torch.tensor([[0] * 12 + [1] * 9 + [2] * 2])  # [B=1, n=23]: three chains
    n, n_pad, S = asym.shape[-1], 26, 2
    gen = torch.Generator().manual_seed(0)
    logits = {k: 3 * torch.randn(1, S, n_pad, n_pad, 64, generator=gen, dtype=torch.float64)
              for k in ("pae", "pde")}
    reduce = pair_reducer(asym, cfg)
    blocks = [reduce({k: v[:, :, i: i + 5] for k, v in logits.items()}, slice(i, i + 5))
              for i in range(0, n_pad, 5)]  # 26 rows: a short last block
    chunked = {k: torch.cat([b[k] for b in blocks], 2)[:, :, :n, :n] for k in PAIR_REDUCED}
    plain = _pair_confidences(logits, asym, torch.zeros(1, n, n, 64), cfg)
    for s in range(S):
        ref = _numpy_reference(logits["pae"][0, s, :n, :n].numpy(),
                               logits["pde"][0, s, :n, :n].numpy(), asym[0].numpy(),
                               c.pae_max, c.pde_max)
        for k in PAIR_REDUCED:
            rtol = 2e-6
            np.testing.assert_allclose(chunked[k][0, s].double().numpy(), ref[k], rtol=rtol,
                                       err_msg=k)
            np.testing.assert_allclose(plain[k][0, s].double().numpy(), ref[k], rtol=rtol,
                                       err_msg=k)


def _model(seed: int = 0):
    return noisy_tiny_af3(seed)


@pytest.fixture(scope="module")
def batch():
    return fkbp_crop_batch()


def _predict(batch, techniques: Techniques | None, in_head: bool, policy=None):
    family, model = _model()
    if techniques is not None:
        parallelize(model, family, techniques)
    predictor = AF3Predictor(model, "cpu", cuda_graphs=False, pad=policy is not None,
                             policy=policy)
    predictor.reduce_in_head = in_head
    return predictor(batch, generator=torch.Generator().manual_seed(3), **RUN)


@pytest.fixture(scope="module")
def plain(batch):
    return _predict(batch, None, in_head=False)


@pytest.mark.slow
@pytest.mark.parametrize("techniques,policy", [
    (None, None),
    (Techniques(chunk_size=5), None),  # 67 rows: a short last block
    (Techniques(chunk_size=7, sample_group_size=2), None),  # 3 samples: groups of 2 and 1
    # padded to the CUDA graphs' bucket (67 -> 96 tokens): the head sees padded pairs, the
    # reduction's chain-pair counts are padded and the padded pairs cut off
    (Techniques(chunk_size=16), BucketPolicy(residue_step=32, atom_step=64)),
], ids=["whole", "chunk5", "chunk7-group2", "padded-chunk16"])
def test_reduced_in_the_head_equals_the_plain_path(batch, plain, techniques, policy):
    out = _predict(batch, techniques, in_head=True, policy=policy)
    assert set(out) == set(plain)
    n = int(batch["token_mask"].sum())
    for k in (*PAIR_REDUCED, "contact_probs", "x", "plddt"):
        assert torch.isfinite(out[k]).all(), k
        if k in PAIR_REDUCED:
            assert out[k].shape == (1, 3, n, n), k
        scale = float(plain[k].abs().max())
        torch.testing.assert_close(out[k], plain[k], rtol=RTOL, atol=RTOL * scale, msg=k)
    # the chain-pair normaliser differs from the complex's: protein and FK506 are two chains
    assert not torch.allclose(out["tm_interface"], out["tm_global"])
