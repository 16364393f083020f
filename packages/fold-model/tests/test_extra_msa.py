"""Extra MSA stack (Alg. 18) with global column attention (Alg. 19)."""

from __future__ import annotations

import pytest
import torch
from _trunk_helpers import holes, randomize_, rel_err
from fold_model.af2 import config
from fold_model.af2.evoformer import (
    ExtraMsaBlock,
    ExtraMsaStack,
    make_block,
)
from fold_model.layers import MSAColumnGlobalAttention


def _inputs(seed=0, n_extra=9, n=7, c_e=8):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, n_extra, n, c_e, generator=g)
    z = torch.randn(2, n, n, 12, generator=g)
    seq = holes((2, n), seed=seed)
    extra_mask = holes((2, n_extra, n), seed=seed + 1) * seq[:, None]
    return a, z, extra_mask, seq[:, :, None] * seq[:, None]


def test_extra_block_uses_global_column_attention():
    block = make_block(config("tiny").extra_msa, 8, 12, "af2", extra_msa=True)
    assert isinstance(block, ExtraMsaBlock)
    assert isinstance(block.msa_att_col, MSAColumnGlobalAttention)


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
def test_extra_block_fp32_matches_fp64_and_shapes(order):
    cfg = config("tiny").extra_msa
    block = randomize_(make_block(cfg, 8, 12, order, extra_msa=True)).eval()
    block64 = randomize_(make_block(cfg, 8, 12, order, extra_msa=True)).double().eval()
    a, z, mm, pm = _inputs()
    out = block(a, z, mm, pm)
    ref = block64(a.double(), z.double(), mm.double(), pm.double())
    assert out[0].shape == a.shape and out[1].shape == z.shape
    assert rel_err(out[0], ref[0]) < 1e-5 and rel_err(out[1], ref[1]) < 1e-5


def test_masked_extra_rows_do_not_change_the_pair():
    stack = randomize_(ExtraMsaStack(config("tiny", extra_msa__no_blocks=2).extra_msa, 12)).eval()
    a, z, mm, pm = _inputs(1)
    mm[:, -3:] = 0.0  # three padded extra sequences
    a2 = a.clone()
    a2[:, -3:] = torch.randn_like(a2[:, -3:]) * 10
    z1, z2 = stack(a, z, mm, pm), stack(a2, z, mm, pm)
    assert z1.shape == z.shape
    assert rel_err(z2[pm.bool()], z1[pm.bool()]) < 1e-6


def test_extra_stack_gradients_finite():
    stack = randomize_(ExtraMsaStack(config("tiny").extra_msa, 12)).train()
    a, z, mm, pm = _inputs(2)
    stack(a, z, mm, pm).square().mean().backward()
    for n, p in stack.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
