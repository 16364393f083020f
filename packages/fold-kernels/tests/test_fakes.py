"""The shape-only fakes of the Triton ops (memory estimates on FakeTensors): on FakeTensors of a
CUDA device (no GPU needed) ``supports`` accepts the call, and the fake returns what the
reference returns (shapes, dtypes, device) while allocating only the outputs and small
statistics, never the attention logits; no kernel is launched."""

from __future__ import annotations

import pytest
import torch
from fold_kernels import registration
from fold_kernels.fakes import FAKES
from fold_ops import reference
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

R, H, N, D, C, O = 3, 2, 7, 4, 6, 10


def _args(op: str):
    """A call of ``op`` at odd sizes (tensors on the CPU, converted to fake CUDA below)."""
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    mask = (torch.rand(R, N, generator=g) > 0.3)
    return {
        "linear": (t(R, N, C), t(O, C), t(O)),
        "attention": (t(R, H, N, D), t(R, H, N, D), t(R, H, N, D), t(H, N, N), mask, None,
                      t(R, H, N, D)),
        "attention_packed": (t(R, N, 4 * H * D), H, t(H, N, N), mask, None, t(H * D)),
        "triangle_attention": (t(R, N, 3 * H * D), H, t(H, N, N), mask, None, None, False),
        "layer_norm": (t(R, N, C), t(C), t(C)),
        "layer_norm_fork": (t(R, N, C), t(C), t(C), 1e-5, 2),
        "layer_norm_pair_bias": (t(2, N, N, C), t(C), t(C), t(O, C), 1e-5, 1),
        "layer_norm_linear": (t(R, N, C), t(C), t(C), t(O, C), t(O)),
        "adaptive_layer_norm": (t(R, N, C), t(R, N, 2 * C), t(C)),
        "softmax_mask_bias": (t(R, H, N, N), mask[:, None, None, :], t(H, N, N)),
        "swiglu": (t(R, N, C), t(2 * O, C), t(2 * O)),
        "bias_sigmoid_gate": (t(R, N, C), t(R, N, C), t(C)),
        "bias_dropout_residual": (t(R, N, C), t(R, N, C), t(C), t(1, N, C)),
        "triangle_projection_gate": (t(2, 4 * C, N, N), t(4 * C),
                                     mask[:2, :, None] & mask[:2, None, :]),
        "triangle_projection": (t(2, N, N, C), t(4 * O, C), t(4 * O),
                                mask[:2, :, None] & mask[:2, None, :]),
        "linear_channel_first": (t(2, N, N, C), t(O, C)),
        "triangle_multiplication": (t(2, N, N, C), mask[:2, :, None] & mask[:2, None, :],
                                    t(C), t(C), t(4 * R, C), t(4 * R), t(C, C), t(C), t(R),
                                    t(R), t(C, R), t(C), False),
    }[op]


def _ref(op: str):
    return reference.attention_packed if op == "triangle_attention" else getattr(reference, op)


@pytest.mark.parametrize("op", sorted(FAKES))
def test_fake_matches_the_reference_and_the_kernel_would_serve_it(op):
    args = _args(op)
    expected = _ref(op)(*args)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake_args = tree_map(lambda x: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                                           device="cuda")
                             if isinstance(x, torch.Tensor) else x, args)
        assert registration.SUPPORTS[op][1](*fake_args), op
        out = FAKES[op](*fake_args)
    outs, refs = tree_flatten(out)[0], tree_flatten(expected)[0]
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype and o.device.type == "cuda", (op, o, r)


class _Allocations(TorchDispatchMode):
    """Bytes of every tensor an aten op makes (no view: a new storage each)."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.sizes += [t.numel() * t.element_size() for t in tree_flatten(out)[0]
                           if isinstance(t, torch.Tensor)]
        return out


def test_attention_fake_allocates_no_logits():
    """The output, the pre-gate output and the fp32 statistics, nothing of the reference's
    [R, H, N, N] logits."""
    r, h, n, d = 8, 4, 256, 16
    mode = FakeTensorMode()
    with mode:
        proj = torch.empty(r, n, 4 * h * d, device="cuda")
        bias = torch.empty(h, n, n, device="cuda")
    allocations = _Allocations()
    with mode, allocations:
        out = FAKES["attention_packed"](proj, h, bias)
    assert out.shape == (r, n, h * d)
    assert sorted(allocations.sizes) == sorted([out.numel() * 4, out.numel() * 4,
                                                r * h * 2 * n * 4])
