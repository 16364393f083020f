"""The FlexAttention contender of the EvoAttention benchmarks (``common/attention_inputs.py``)
computes the attention of every row that keeps a key, for each key-mask pattern as a
FlexAttention user would pass it (the additive term, none, a BlockMask), on CPU against the
float64 reference."""

from __future__ import annotations

import pytest
import torch
from fold_ops import reference as ref

from benchmarks.common.attention_inputs import make_flex, make_inputs


@pytest.mark.parametrize("pattern", ["holes", "none", "padded"])
def test_flex_contender_matches_reference(pattern):
    q, k, v, bias, mask, _ = make_inputs(3, 40, 2, 16, device="cpu", dtype=torch.float32,
                                         mask=pattern)
    if pattern == "none":
        assert mask.all()
    o = make_flex(pattern)(q, k, v, bias, mask)
    want = ref.attention(q.double(), k.double(), v.double(), bias.double(), mask)
    rows = mask[0].any(-1)  # FlexAttention's BlockMask gives rows with nothing kept 0
    assert rows.sum() >= 2
    err = (o.double() - want)[0][rows].norm() / want[0][rows].norm()
    assert err < 1e-5
