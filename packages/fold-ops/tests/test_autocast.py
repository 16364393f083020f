"""What the ops do under autocast: the lowered ops' input casts and the LayerNorm forks'
output dtype (fold_ops.autocast), on the CPU's autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fold_ops import OPS, reference
from fold_ops.autocast import LOWERED, autocast_dtype, lower, projection_dtype


def test_the_contract_marks_the_lowered_ops():
    assert {name for name, op in OPS.items() if op.lowered} == LOWERED
    assert LOWERED == {"linear", "linear_channel_first", "swiglu", "triangle_projection"}


def test_lower_casts_floating_tensors_under_autocast_only():
    x, w = torch.randn(3, 4), torch.randn(5, 4, dtype=torch.float64)
    mask, n = torch.ones(3, dtype=torch.bool), torch.arange(3)
    args, kwargs = lower((x, w, mask, 2.0), {"bias": torch.randn(5), "index": n})
    assert args[0] is x and kwargs["index"] is n  # autocast off: nothing changes
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype(x) == torch.bfloat16
        (x2, w2, mask2, s), kw = lower((x, w, mask, 2.0), {"bias": torch.randn(5), "index": n})
    assert x2.dtype == torch.bfloat16 and torch.equal(x2, x.to(torch.bfloat16))
    assert w2 is w and mask2 is mask and s == 2.0  # fp64 (the tests' truth), bools, numbers
    assert kw["bias"].dtype == torch.bfloat16 and kw["index"] is n
    assert autocast_dtype(x) is None


def test_projection_dtype():
    x = torch.randn(2, 3)
    assert projection_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert projection_dtype(x) == torch.bfloat16
        assert projection_dtype(x.double()) == torch.float64


def test_layer_norm_forks_give_their_projections_the_autocast_dtype():
    """y is LayerNorm(x) in fp32 rounded once to bf16: what autocast's projection would have
    read; x passes on in fp32; the pair bias is a bf16 product of that y."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, 8, generator=g) * 2 + 1
    w, b, wh = torch.randn(8, generator=g), torch.randn(8, generator=g), torch.randn(3, 8,
                                                                                    generator=g)
    y32 = F.layer_norm(x, (8,), w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xs, y1, y2 = reference.layer_norm_fork(x, w, b, 1e-5, 2)
        xp, yp, bias = reference.layer_norm_pair_bias(x, w, b, wh, 1e-5, 1)
    assert xs is x and xp is x
    for y in (y1, y2, yp):
        assert y.dtype == torch.bfloat16 and torch.equal(y, y32.to(torch.bfloat16))
    expected = torch.einsum("oc,...ijc->...oij", wh.to(torch.bfloat16), y32.to(torch.bfloat16))
    assert bias.dtype == torch.bfloat16
    torch.testing.assert_close(bias, expected, rtol=1e-2, atol=1e-2)
    assert reference.layer_norm_fork(x, w, b)[1].dtype == torch.float32  # outside autocast
