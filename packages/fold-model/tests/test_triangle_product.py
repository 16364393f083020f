"""Triangle multiplication's product with gradients in the operands' own layouts.

``triangle_product`` against the plain product under autograd, in float64 with odd sizes and
batch dims: the same values and gradients, and each gradient laid out as its operand (J-fast,
what the projections' backward reads as rows), where autograd's backward of ``a @ b.mT`` gives
d(b) I-fast."""

from __future__ import annotations

import pytest
import torch
from fold_model.layers.triangle_multiplication import triangle_product


def _operands(outgoing: bool):
    """a, b as non-leaf tensors (as the gate's outputs are) and the gradients they receive."""
    g = torch.Generator().manual_seed(3)
    a0 = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    b0 = torch.randn(2, 3, 6 if outgoing else 5, 7 if outgoing else 6, generator=g,
                     dtype=torch.float64, requires_grad=True)
    seen = {}
    a, b = a0 * 1, b0 * 1
    a.register_hook(lambda d: seen.__setitem__("a", d))
    b.register_hook(lambda d: seen.__setitem__("b", d))
    return a, b, seen


@pytest.mark.parametrize("outgoing", [True, False])
def test_values_gradients_and_layouts(outgoing):
    a, b, seen = _operands(outgoing)
    ref_a, ref_b, ref_seen = _operands(outgoing)
    x = triangle_product(a, b, outgoing)
    ref_x = ref_a @ ref_b.mT if outgoing else ref_a.mT @ ref_b
    assert torch.equal(x, ref_x)
    dx = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x.backward(dx)
    ref_x.backward(dx)
    torch.testing.assert_close(seen["a"], ref_seen["a"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(seen["b"], ref_seen["b"], rtol=1e-12, atol=1e-12)
    assert seen["a"].is_contiguous() and seen["b"].is_contiguous()
    # the layout this avoids: autograd gives d(b) (outgoing) or d(a) (incoming) transposed
    assert not ref_seen["b" if outgoing else "a"].is_contiguous()


def test_one_operand_without_gradient_and_no_grad_mode():
    a = torch.randn(1, 2, 4, 3, requires_grad=True)
    b = torch.randn(1, 2, 5, 3)
    triangle_product(a, b, True).sum().backward()
    assert a.grad.shape == a.shape and b.grad is None
    with torch.no_grad():
        assert torch.equal(triangle_product(a, b, True), a @ b.mT)
