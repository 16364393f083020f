"""Registration into fold-model's op registry, and the `supports` predicates."""

from __future__ import annotations

import types

import pytest
import torch
from fold_kernels import registration

OPS = ("linear", "attention", "attention_packed", "layer_norm", "layer_norm_linear",
       "softmax_mask_bias", "swiglu", "bias_sigmoid_gate", "bias_dropout_residual",
       "triangle_projection_gate", "triangle_projection", "linear_channel_first")


def _fake_registry():
    calls = []
    mod = types.SimpleNamespace(OPS=OPS)
    mod.register = lambda op, backend, fn, *, supports=None, priority=0, fake=None: calls.append(
        (op, backend, fn, supports, priority, fake))
    return mod, calls


def test_registers_every_op_as_triton_priority_10():
    mod, calls = _fake_registry()
    registration.register(mod)
    assert sorted(c[0] for c in calls) == sorted(OPS)
    assert all(c[1] == "triton" and c[4] == 10 and callable(c[2]) and callable(c[3])
               and callable(c[5]) for c in calls)


def test_a_registry_without_fakes_gets_none():
    calls = []
    mod = types.SimpleNamespace(OPS=OPS)
    mod.register = lambda op, backend, fn, *, supports=None, priority=0: calls.append(op)
    registration.register(mod)
    assert sorted(calls) == sorted(OPS)


def test_cpu_tensors_are_not_supported():
    q = torch.randn(1, 2, 2, 8, 16)
    assert not registration.supports_attention(q, q, q)
    x = torch.randn(4, 8)
    assert not registration.supports_layer_norm(x, torch.ones(8), torch.zeros(8))
    assert not registration.supports_softmax_mask_bias(x)
    assert not registration.supports_linear_channel_first(torch.randn(2, 3, 8), torch.randn(5, 8))
    assert not registration.supports_attention_packed(torch.randn(1, 2, 5, 64), 2)


def test_not_supported_while_fx_traces():
    seen = []

    class M(torch.nn.Module):
        def forward(self, x):
            seen.append(registration._tracing())
            return x + 1

    torch.fx.symbolic_trace(M())
    assert seen == [True]
    assert not registration._tracing()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_shapes_and_dtypes():
    dev = "cuda"
    q = torch.randn(1, 2, 2, 8, 16, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(1, 2, 8, 8, device=dev)
    mask = torch.ones(1, 2, 8, device=dev, dtype=torch.bool)
    assert registration.supports_attention(q, q, q, bias, mask, gate=q)
    assert not registration.supports_attention(q, q, q, torch.randn(2, 8, 7, device=dev))
    assert not registration.supports_attention(q.double(), q.double(), q.double())
    x = torch.randn(4, 8, device=dev)
    assert registration.supports_layer_norm(x, torch.ones(8, device=dev),
                                            torch.zeros(8, device=dev))
    assert not registration.supports_layer_norm(x, None, None)
    gain = torch.ones(8, device=dev)
    assert registration.supports_layer_norm(x, gain, None)  # gain only (AdaLN's LN(s))
    assert not registration.supports_layer_norm_fork(x, gain, None)  # these need a bias
    assert not registration.supports_layer_norm_linear(x, gain, None, torch.ones(4, 8,
                                                                                 device=dev))
    cond = torch.randn(4, 16, device=dev)
    assert registration.supports_adaptive_layer_norm(x, cond, gain)
    assert registration.supports_adaptive_layer_norm(x.bfloat16(), cond.bfloat16(), gain)
    assert registration.supports_adaptive_layer_norm(x, cond)  # no gate bias
    # the atom transformers' conditioning, shared by the samples: [B, 1, A, 2C]
    assert registration.supports_adaptive_layer_norm(x, cond[:1], gain)
    xs = torch.randn(2, 3, 5, 8, device=dev)
    assert registration.supports_adaptive_layer_norm(xs, torch.randn(2, 1, 5, 16, device=dev))
    # two runs of broadcast dims, or fewer dims: PyTorch's broadcasting serves them
    assert not registration.supports_adaptive_layer_norm(xs, torch.randn(1, 3, 1, 16, device=dev))
    assert not registration.supports_adaptive_layer_norm(xs, torch.randn(5, 16, device=dev))
    assert not registration.supports_adaptive_layer_norm(x, x, gain)  # not [*, 2C]
    assert not registration.supports_adaptive_layer_norm(x, cond.bfloat16(), gain)
    assert not registration.supports_adaptive_layer_norm(x, cond, gain[:7])
    pair, w = torch.randn(2, 3, 8, device=dev), torch.randn(5, 8, device=dev)
    assert registration.supports_linear_channel_first(pair, w)
    assert not registration.supports_linear_channel_first(x, w)  # [I, J, C] at least
    assert not registration.supports_linear_channel_first(pair, w[:, :7])
    assert not registration.supports_linear_channel_first(pair, w.bfloat16())
    proj = torch.randn(1, 2, 8, 4 * 2 * 16, device=dev)
    assert registration.supports_attention_packed(proj, 2, torch.randn(1, 2, 8, 8, device=dev),
                                                  mask, gate_bias=torch.zeros(32, device=dev))
    assert not registration.supports_attention_packed(proj, 3)  # 128 is not 4 x 3 x D
    assert not registration.supports_attention_packed(proj, 2, torch.randn(1, 2, 7, 8,
                                                                           device=dev))
    assert not registration.supports_attention_packed(proj, 2, gate_bias=torch.zeros(31,
                                                                                     device=dev))


def test_fold_model_registry_sees_triton_and_falls_back_on_cpu():
    registry = pytest.importorskip("fold_model.ops.registry")
    from importlib.metadata import entry_points

    if not any(ep.name == "triton" for ep in entry_points(group=registry.ENTRY_POINT_GROUP)):
        pytest.skip("fold-kernels is not pip-installed here (its entry point is absent)")
    assert "triton" in registry.backends("attention")
    q = torch.randn(1, 2, 2, 8, 16)
    fn = registry.resolve("attention", q, q, q)
    assert fn is not registration.SUPPORTS["attention"][0]  # CPU -> the torch reference


def test_linear_is_supported_only_with_a_bias_of_one_dtype():
    x, w, b = torch.randn(3, 4, 8), torch.randn(5, 8), torch.randn(5)
    assert not registration.supports_linear(x, w, b)  # CPU tensors
    assert not registration.supports_linear(x, w)  # no bias: nothing to gain


def test_shapes_past_the_kernels_32_bit_indices_fall_back():
    """Rows past 2**31, more than 65535 programs in grid y/z and N past 46340 with a bias are
    not supported (``auto`` takes the PyTorch path) rather than raising in the kernel's checks
    (fold_kernels.index32). Fake CUDA tensors: shapes without memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        def t(*shape):
            return torch.empty(shape, device="cuda", dtype=torch.bfloat16)

        w = t(1)
        assert registration.supports_layer_norm(t(2**31 - 1, 1), w, w)
        assert not registration.supports_layer_norm(t(2**31, 1), w, w)
        assert not registration.supports_softmax_mask_bias(t(2**31, 1))
        assert not registration.supports_bias_sigmoid_gate(t(2**31, 1), t(1))
        assert not registration.supports_linear(t(2**31, 1), t(4, 1), t(4))
        proj, bias = t(65535, 8, 4 * 16), t(1, 8, 8)
        assert registration.supports_attention_packed(proj, 1, bias)
        assert not registration.supports_attention_packed(t(65536, 8, 4 * 16), 1, bias)
        assert not registration.supports_attention_packed(t(1, 46341, 64), 1,
                                                          t(1, 46341, 46341))
        assert registration.supports_attention_packed(t(1, 46341, 64), 1)  # no N x N bias
        q = t(2, 1, 40000, 1, 16)  # B * H = 80000 programs in grid z
        assert not registration.supports_attention(q, q, q)
