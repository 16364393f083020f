"""The diffusion's pair conditioning (Alg. 21 lines 1-3) in row blocks (``--chunk-size``,
inference) equals the whole pair, and the relative position features of a row block are those
rows of the whole: odd token counts with padding and a masked token, blocks that do not divide
them, several chains and entities. float64 on both sides: every step is per pair, so the blocks
change only which rows one GEMM sees (1e-12)."""

from __future__ import annotations

import pytest
import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3 import AlphaFold3, config
from fold_model.af3.embedders import relative_position_features


def _f64(f):
    return {k: v.double() if v.is_floating_point() else v for k, v in f.items()}


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 50])
def test_pair_conditioning_in_row_blocks_equals_whole(chunk):
    torch.manual_seed(0)
    model = randomize_(AlphaFold3(config("tiny")), scale=0.5).double().eval()
    f = _f64(random_features(n_token=10, batch=2, seed=7, n_pad_token=1))
    f["token_mask"][0, 3] = 0  # a hole among the real tokens
    n = f["token_mask"].shape[-1]
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(2, n, n, model.config.c_z, generator=gen, dtype=torch.float64)
    cond = model.diffusion.conditioning
    with torch.no_grad():
        whole = cond.pair(f, z)
        model.set_chunk_size(chunk)
        assert cond.chunk_size == chunk
        blocks = cond.pair(f, z)
        model.set_chunk_size(None)
    assert blocks.shape == whole.shape == (2, n, n, model.config.c_z)
    assert rel_err(blocks, whole) < 1e-12


def test_relative_position_rows_are_rows_of_the_whole():
    f = random_features(n_token=9, batch=1, seed=3)
    whole = relative_position_features(f, 32, 2)
    for rows in (slice(0, 4), slice(4, 7), slice(7, None)):
        assert torch.equal(relative_position_features(f, 32, 2, rows), whole[:, rows])
