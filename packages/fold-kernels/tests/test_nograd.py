"""The ops' inference path (``fold_kernels.nograd.apply``): without a gradient to take, each op
runs its autograd function's forward directly. The result must be the same bits as through
autograd, with no graph attached; with a gradient, autograd records the op as before."""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_kernels import nograd

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _t(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


def _mask(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) > 0.3).to(DEVICE)


CALLS = {
    "layer_norm": lambda: (fk.layer_norm, (_t(3, 5, 24), _t(24, seed=1), _t(24, seed=2))),
    "adaptive_layer_norm": lambda: (fk.adaptive_layer_norm,
                                    (_t(2, 7, 24), _t(2, 7, 48, seed=1), _t(24, seed=2))),
    "bias_sigmoid_gate": lambda: (fk.bias_sigmoid_gate, (_t(3, 5, 24), _t(3, 5, 24, seed=1),
                                                         _t(24, seed=2))),
    "bias_dropout_residual": lambda: (fk.bias_dropout_residual,
                                      (_t(3, 5, 24), _t(3, 5, 24, seed=1), _t(24, seed=2),
                                       _mask(1, 5, 24, seed=3).float() * 1.25)),
    "softmax_mask_bias": lambda: (fk.softmax_mask_bias, (_t(2, 3, 5, 7), _mask(2, 1, 1, 7),
                                                         _t(3, 5, 7, seed=1))),
    "linear": lambda: (fk.linear, (_t(4, 5, 16), _t(8, 16, seed=1), _t(8, seed=2))),
    "evo_attention": lambda: (fk.evo_attention,
                              (_t(1, 3, 2, 9, 16), _t(1, 3, 2, 9, 16, seed=1),
                               _t(1, 3, 2, 9, 16, seed=2), _t(1, 2, 9, 9, seed=3),
                               _mask(1, 3, 9, seed=4), None, _t(1, 3, 2, 9, 16, seed=5))),
    "triangle_projection_gate": lambda: (fk.triangle_projection_gate,
                                         (_t(1, 12, 5, 6), _t(12, seed=1),
                                          _mask(1, 5, 6, seed=2))),
    "triangle_projection": lambda: (fk.triangle_projection,
                                    (_t(1, 5, 6, 16), _t(12, 16, seed=1), _t(12, seed=2),
                                     _mask(1, 5, 6, seed=3))),
    "linear_channel_first": lambda: (fk.linear_channel_first, (_t(1, 5, 6, 16),
                                                               _t(8, 16, seed=1))),
}


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_inference_path_is_the_autograd_path(name):
    fn, args = CALLS[name]()
    with torch.no_grad():
        fast = _flat(fn(*args))
    assert all(o.grad_fn is None for o in fast)
    first = args[0].clone().requires_grad_()
    recorded = _flat(fn(first, *args[1:]))
    assert all(o.grad_fn is not None for o in recorded), name
    for f, r in zip(fast, recorded):
        assert torch.equal(f, r.detach()), name


def test_apply_records_only_when_a_gradient_is_wanted():
    calls = []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.save_for_backward(x)
            ctx.k = k
            calls.append("forward")
            return x * k

        @staticmethod
        def backward(ctx, dy):
            return dy * ctx.k, None

    x = torch.ones(3)
    assert nograd.apply(Double, x, 2.0).grad_fn is None  # no input requires a gradient
    xg = x.clone().requires_grad_()
    with torch.no_grad():
        assert nograd.apply(Double, xg, 2.0).grad_fn is None  # grad mode off
    y = nograd.apply(Double, xg, 3.0)
    y.sum().backward()
    assert y.grad_fn is not None and torch.equal(xg.grad, torch.full((3,), 3.0))
    assert calls == ["forward"] * 3
