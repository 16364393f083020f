"""The confidence head's pair logits reduced in the head (``reduce_pair``, inference): by sample
group and row block they are the logits of the plain head, row for row, for both PDE
symmetrisations (AF3's code and Protenix's), odd token counts, row blocks that do not divide
them, and masks with holes. float64 on both sides: the blocks change only which rows one GEMM
sees, so the two agree to float64 rounding (1e-12)."""

from __future__ import annotations

import pytest
import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3 import AlphaFold3, config


def _f64(f):
    return {k: v.double() if v.is_floating_point() else v for k, v in f.items()}


def _identity(logits, rows):
    """Keeps the logits (``[B, G, R, N, bins]``) and the rows they came from."""
    start = torch.full(logits["pae"].shape[:3], rows.start, dtype=torch.long)
    return {"pae_rows": logits["pae"], "pde_rows": logits["pde"], "row_start": start}


@pytest.mark.parametrize("variant", ["af3", "protenix"])
@pytest.mark.parametrize("chunk,group", [(None, None), (3, None), (4, 2), (1, 1)])
def test_reduced_rows_equal_the_plain_logits(variant, chunk, group):
    torch.manual_seed(0)
    model = randomize_(AlphaFold3(config("tiny", confidence__variant=variant)), scale=0.5)
    model = model.double().eval()
    f = _f64(random_features(n_token=10, batch=1, seed=5, n_pad_token=1))
    f["token_mask"][0, 4] = 0  # a hole among the real tokens
    head = model.confidence_head
    gen = torch.Generator().manual_seed(2)
    x = 4.0 * torch.randn(1, 3, f["atom_mask"].shape[-1], 3, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        s_inputs, s, z = model.trunk(f, 1)
        plain = head(f, s_inputs, s, z, x)
        model.set_chunk_size(chunk)
        model.set_sample_group_size(group)
        got = head(f, s_inputs, s, z, x, reduce_pair=_identity)
    n = f["token_mask"].shape[-1]
    assert got["pae_rows"].shape == plain["pae"].shape == (1, 3, n, n, 64)
    step = chunk or n
    assert (got["row_start"][0, 0] == torch.arange(n) // step * step).all()
    assert rel_err(got["pae_rows"], plain["pae"]) < 1e-12
    assert rel_err(got["pde_rows"], plain["pde"]) < 1e-12
    assert torch.allclose(got["pde_rows"], got["pde_rows"].transpose(-2, -3))  # symmetric
    for k in ("plddt", "resolved"):
        assert rel_err(got[k], plain[k]) < 1e-12
    assert "pae" not in got and "pde" not in got  # the logits themselves are not returned


@pytest.mark.parametrize("variant", ["af3", "protenix"])
def test_one_sample_pair_embedding_equals_the_broadcast_one(variant):
    """A sample scored alone (``S = 1``: groups of one, long inputs) builds its pair input in
    place; with another sample beside it the head broadcasts into a new ``[B, S, N, N, C_z]``.
    Sample 0's logits and the gradients of every weight of the head agree (its inputs are
    detached: the trunk gets no gradient from it). float64 on both sides, the same sums in the
    same order: 1e-12; odd token count, a masked hole."""
    torch.manual_seed(0)
    model = randomize_(AlphaFold3(config("tiny", confidence__variant=variant)), scale=0.5)
    model = model.double().eval()  # no dropout: both runs see the same network
    f = _f64(random_features(n_token=11, batch=1, seed=7, n_pad_token=2))
    f["token_mask"][0, 3] = 0
    head = model.confidence_head
    gen = torch.Generator().manual_seed(4)
    x = 4.0 * torch.randn(1, 2, f["atom_mask"].shape[-1], 3, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        s_inputs, s, z = model.trunk(f, 1)
    weights = {}  # the same random weighting of sample 0's logits in both runs

    def run(x_pred):
        head.zero_grad()
        out = head(f, s_inputs, s, z, x_pred)
        loss = 0.0
        for k in ("plddt", "pae", "pde", "resolved"):
            first = out[k][:, :1]
            if k not in weights:
                weights[k] = torch.randn(first.shape, generator=gen, dtype=torch.float64)
            loss = loss + (first * weights[k]).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
        return {k: v[:, :1].detach() for k, v in out.items()}, grads

    alone, g_alone = run(x[:, :1])
    pair, g_pair = run(x)
    assert head.linear_d.weight.grad is not None
    for k in alone:
        assert torch.isfinite(alone[k]).all(), k
        assert rel_err(alone[k], pair[k]) < 1e-12, k
    assert g_alone.keys() == g_pair.keys() and len(g_alone) > 10
    for name in g_alone:
        if g_pair[name].norm() < 1e-12:
            # zero by symmetry (the bias of a LayerNorm before a bias-free pair-bias projection
            # shifts every logit of a row alike): rounding noise whose bits depend on how a
            # multi-threaded BLAS splits the two runs' different GEMM shapes
            assert g_alone[name].norm() < 1e-12, name
            continue
        assert rel_err(g_alone[name], g_pair[name]) < 1e-12, name
