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
