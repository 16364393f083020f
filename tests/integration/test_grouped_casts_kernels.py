"""The blocks' weights cast once per forward (fold_ops.weight_casts.grouped) on fold-kernels'
ops: a bf16-autocast training step equals the per-call casts' bit for bit, with fewer casts.
(On the torch references: packages/fold-model/tests/test_grouped_casts.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "fold-model" / "tests"))
import test_grouped_casts as blocks  # noqa: E402  (fold-model's test: the blocks and the step)
from _triton_backend import DEVICE, register_triton  # noqa: E402


@pytest.mark.parametrize("name, fewer", [("diffusion", 24), ("pairformer", 40)])
def test_grouped_casts_on_the_kernels(name, fewer, monkeypatch):
    """Diffusion transformer block: 39 casts per call become 15; Pairformer block: 58 become 14
    (each weight's cast forward and its gradient's back, against one of each for all)."""
    register_triton(monkeypatch)
    casts0, casts1 = blocks.compare(getattr(blocks, name), monkeypatch, "triton", DEVICE)
    assert casts0 - casts1 >= fewer, (casts0, casts1)
