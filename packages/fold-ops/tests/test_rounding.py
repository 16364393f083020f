"""fold_ops.rounding.round_to against PyTorch's own cast of a Python float, on the edges that
matter: ties, subnormals, overflow to inf, signed zero."""

from __future__ import annotations

import math
import random

import pytest
import torch
from fold_ops.rounding import round_to

EDGES = [1 / 0.75, 1 / 0.9, 1 / 0.85, 4.0, 1e-3, 65504.0, 65519.9, 65520.0, 70000.0,
         3.4e38, 3.5e38, -1e39, 1e-40, 1e-45, 6e-8, 0.0, -0.0, math.inf, -math.inf,
         1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_to_matches_torch_cast(dtype):
    rng = random.Random(0)
    values = EDGES + [rng.uniform(-10, 10) * 10.0 ** rng.randint(-8, 8) for _ in range(3000)]
    for v in values:
        want = torch.tensor(v, dtype=dtype).item()
        got = round_to(v, dtype)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (v, got, want)


def test_round_to_leaves_float64_and_nan():
    assert round_to(1 / 3, torch.float64) == 1 / 3
    assert math.isnan(round_to(math.nan, torch.bfloat16))
