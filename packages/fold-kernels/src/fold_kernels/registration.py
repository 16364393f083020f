"""Registers the Triton ops into fold-model's op registry (entry point ``fold_model.ops``).

fold-model calls :func:`register` with its module ``fold_model.ops.registry``; fold-kernels never
imports fold-model. The ops and their signatures are the contract of :mod:`fold_ops.contract`
(shared with fold-model); :data:`SUPPORTS` names a kernel for ops of it. Each is registered
as backend ``"triton"`` with priority 10 and a ``supports`` predicate that accepts a call only
when the Triton kernel can run it: CUDA/ROCm tensors of a supported dtype and shape, not while
torch.fx traces (AutoChunk) or torch.compile captures the model (there the PyTorch path is
traced and fused by the compiler), and not for fp32 inputs under autocast (the PyTorch path
then computes in bf16/fp16, as the caller asked), except for the LayerNorms, which compute in
fp32 as autocast's LayerNorm does (the forks return y in the autocast dtype, as the contract
says). The ops the contract lowers (``linear``, ``linear_channel_first``, ``swiglu``,
``triangle_projection``) never see fp32 under autocast: fold-model's dispatcher casts their
inputs first (:mod:`fold_ops.autocast`).

Each op is registered with its shape-only fake (:data:`fold_kernels.fakes.FAKES`): on
FakeTensors (memory estimates) ``supports`` decides as for real tensors of the same shapes,
dtypes and devices, and the registry runs the fake, never a kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import torch
from fold_ops.autocast import autocast_dtype
from fold_ops.contract import OPS
from fold_ops.env import EnvVar
from fold_ops.tracing import compiling, fx_tracing

import fold_kernels as kernels
from fold_kernels import nograd, triangle_gate, triangle_gemm
from fold_kernels.adaptive_layer_norm import broadcast_layout
from fold_kernels.broadcast import broadcast_shape
from fold_kernels.fakes import FAKES
from fold_kernels.index32 import grid_fits, pair_bias_fits, rows_fit
from fold_kernels.layer_norm import MAX_HIDDEN
from fold_kernels.triangle_multiplication import parameter_shapes

__all__ = ["register", "SUPPORTS"]

PRIORITY = 10
# ``FOLD_EVO_CROSS=0``: queries and keys of different lengths (inference) are left to PyTorch, as
# before the forward kernel for them (for comparisons)
_CROSS = EnvVar("FOLD_EVO_CROSS", lambda v: (v if v is not None else "1") != "0")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _tracing() -> bool:
    """torch.fx traces or torch.compile captures: the PyTorch path is wanted there."""
    return fx_tracing() or compiling()


def _on_gpu(*tensors) -> bool:
    """Every given tensor (None skipped) is a real CUDA/ROCm tensor."""
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            return False
    return True


def _autocast_fp32(x: torch.Tensor) -> bool:
    """fp32 under autocast on x's device type (CPU tensors: the interpreter's tests)."""
    return x.dtype == torch.float32 and autocast_dtype(x) is not None


def _dtype_served(t: torch.Tensor, x: torch.Tensor) -> bool:
    """``t`` (a projection's weight, AdaLN's conditioning) in x's dtype, or any dtype under
    autocast, where the kernel takes it in the autocast dtype beside an fp32 x."""
    return t.dtype == x.dtype or autocast_dtype(x) is not None


def _common(x, *others, fp32_under_autocast: bool = False) -> bool:
    """Not tracing, every tensor on the GPU, x in a served dtype and, unless
    ``fp32_under_autocast`` (the LayerNorms: fp32 math either way), not fp32 under autocast."""
    return (not _tracing() and _on_gpu(x, *others) and x.dtype in _DTYPES
            and (fp32_under_autocast or not _autocast_fp32(x)))


def _indexable_attention(batch: tuple[int, ...], r: int, h: int, n: int, has_bias: bool) -> bool:
    """EvoAttention's grid (R rows in y, B*H in z) and 32-bit N x N bias offsets fit."""
    return (grid_fits(r) and grid_fits(math.prod(batch) * h)
            and (not has_bias or pair_bias_fits(n)))


def supports_attention(q, k, v, bias=None, mask=None, scale=None, gate=None) -> bool:
    if not _common(q, k, v, bias, mask, gate) or q.dim() < 4:
        return False
    if k.shape != q.shape:  # another key length: the forward-only kernel, for inference
        if (k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]
                or nograd.records(q, k, v, bias, gate) or not _CROSS.get()):
            return False
    if v.shape != k.shape or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if gate is not None and gate.shape != q.shape:
        return False
    *batch, r, h, n, d = q.shape
    n_k = k.shape[-2]
    if d > 128 or not _indexable_attention(tuple(batch), r, h, max(n, n_k), bias is not None):
        return False
    if bias is not None and (bias.dim() < 3 or tuple(bias.shape[-3:]) != (h, n, n_k)
                             or bias.dtype not in _DTYPES):
        return False
    if bias is not None and bias.dim() > 3:
        batch = tuple(q.shape[:-4])
        if broadcast_shape(tuple(bias.shape[:-3]), batch) != batch:
            return False
    if mask is not None:
        if broadcast_shape(tuple(mask.shape), tuple(q.shape[:-3]) + (n_k,)) is None:
            return False
        if mask.shape[-1] != n_k:
            return False
    return True


def supports_attention_packed(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None,
                              gated=True) -> bool:
    if not _common(proj, bias, mask, gate_bias) or proj.dim() < 3:
        return False
    parts = 4 if gated else 3
    if no_heads < 1 or proj.shape[-1] % (parts * no_heads):
        return False
    d = proj.shape[-1] // (parts * no_heads)
    if d > 128 or (gate_bias is not None and (not gated or gate_bias.shape != (no_heads * d,))):
        return False
    n = proj.shape[-2]
    if not _indexable_attention(tuple(proj.shape[:-3]), proj.shape[-3], no_heads, n,
                                bias is not None):
        return False
    if bias is not None and (bias.dim() < 3 or tuple(bias.shape[-3:]) != (no_heads, n, n)
                             or bias.dtype not in _DTYPES):
        return False
    batch = tuple(proj.shape[:-3])
    if bias is not None and bias.dim() > 3:
        if broadcast_shape(tuple(bias.shape[:-3]), batch) != batch:
            return False
    if mask is not None:
        if mask.shape[-1] != n or broadcast_shape(tuple(mask.shape),
                                                  tuple(proj.shape[:-2]) + (n,)) is None:
            return False
    return True


def supports_linear(x, weight, bias=None) -> bool:
    """Only with a bias of the weight's dtype: the kernel's gain is the bias gradient."""
    if bias is None or not _common(x, weight, bias):
        return False
    return (weight.dim() == 2 and weight.shape[1] == x.shape[-1] and x.dim() >= 2
            and weight.dtype == x.dtype and bias.dtype == x.dtype
            and bias.shape == (weight.shape[0],) and rows_fit(x.shape))  # column_sum's rows


def supports_layer_norm(x, weight, bias, eps=1e-5) -> bool:
    """A weight, and a bias or none (gain only)."""
    if not _common(x, weight, bias, fp32_under_autocast=True) or weight is None:
        return False
    c = x.shape[-1]
    return (weight.shape == (c,) and (bias is None or bias.shape == (c,)) and c <= 8192
            and rows_fit(x.shape))


def supports_layer_norm_fork(x, weight, bias, eps=1e-5, branches=1) -> bool:
    return (isinstance(branches, int) and branches >= 1 and bias is not None
            and supports_layer_norm(x, weight, bias))


def supports_layer_norm_pair_bias(x, weight, bias, bias_weight, eps=1e-5, branches=1) -> bool:
    # heads: one FMA an element each in LayerNorm's backward, unrolled (AF3's 16 at most)
    return (isinstance(branches, int) and branches >= 0 and bias is not None and x.dim() >= 3
            and supports_layer_norm(x, weight, bias) and _on_gpu(bias_weight)
            and bias_weight.dim() == 2 and bias_weight.shape[1] == x.shape[-1]
            and 1 <= bias_weight.shape[0] <= 32
            and _dtype_served(bias_weight, x))


def supports_layer_norm_linear(x, ln_weight, ln_bias, weight, bias=None, eps=1e-5) -> bool:
    """Under autocast the kernel casts the projection's weight and bias, as autocast does."""
    if (ln_bias is None or not supports_layer_norm(x, ln_weight, ln_bias)
            or not _on_gpu(weight, bias)):
        return False
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        return False
    if not _dtype_served(weight, x):
        return False
    return bias is None or bias.shape == (weight.shape[0],)


def supports_adaptive_layer_norm(a, cond, gate_bias=None, eps=1e-5) -> bool:
    """a ``[*, C]`` and cond ``[*, 2C]`` with a's batch dims (the diffusion transformer's
    AdaLN) or 1 over one run of them (the atom transformers': ``[B, 1, A, 2C]`` shared by the
    samples), in a's dtype."""
    if not _common(a, cond, gate_bias, fp32_under_autocast=True) or a.dim() == 0:
        return False
    c = a.shape[-1]
    # under autocast: a fp32 stream with its conditioning's projection in the autocast dtype
    return (broadcast_layout(tuple(a.shape), tuple(cond.shape)) is not None
            and _dtype_served(cond, a)
            and (gate_bias is None or (gate_bias.shape == (c,) and gate_bias.dtype in _DTYPES))
            and 0 < c <= MAX_HIDDEN and rows_fit((*a.shape[:-1], 2 * c)))


def supports_swiglu(x, weight, bias=None) -> bool:
    if not _common(x, weight, bias):
        return False
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % 2:
        return False
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return False
    return (bias is None or bias.shape == (weight.shape[0],)) and rows_fit(x.shape)


def _broadcasts(*tensors) -> bool:
    """The operands broadcast, to a shape whose rows (all dims but the last) fit in int32."""
    shape = broadcast_shape(*(tuple(t.shape) for t in tensors if t is not None))
    return shape is not None and rows_fit(shape)


def supports_bias_sigmoid_gate(x, gate, bias=None, x_bias=None) -> bool:
    return (_common(x, gate, bias, x_bias) and _broadcasts(x, gate, bias)
            and (x_bias is None or x_bias.shape == x.shape[-1:]))


def supports_triangle_projection_gate(proj, bias, mask) -> bool:
    if not _common(proj, bias, mask) or proj.dim() < 3 or proj.shape[-3] % 4:
        return False
    return (bias.shape == (proj.shape[-3],) and tuple(mask.shape[-2:]) == tuple(proj.shape[-2:])
            and mask.dim() <= proj.dim() - 1
            and all(map(grid_fits, triangle_gate.grid_sizes(proj.shape).values())))


def supports_triangle_projection(z, weight, bias, mask) -> bool:
    if not _common(z, weight, bias, mask) or z.dim() < 3:
        return False
    return (weight.dim() == 2 and weight.shape[0] % 4 == 0 and weight.shape[1] == z.shape[-1]
            and weight.dtype == z.dtype and bias.shape == (weight.shape[0],)
            and tuple(mask.shape[-2:]) == tuple(z.shape[-3:-1]) and mask.dim() <= z.dim() - 1
            and rows_fit(z.shape)
            and all(map(grid_fits, triangle_gemm.grid_sizes(z.shape).values())))


# ``FOLD_KERNELS_TRI_MUL_NODE=0``: fold-model composes triangle multiplication from its ops
# again (a dozen autograd nodes instead of one; for comparisons)
_TRI_MUL_NODE = EnvVar("FOLD_KERNELS_TRI_MUL_NODE", lambda v: (v if v is not None else "1") != "0")


def supports_triangle_multiplication(z, mask, ln_in_weight, ln_in_bias, proj_weight, proj_bias,
                                     gate_weight, gate_bias, ln_out_weight, ln_out_bias,
                                     out_weight, out_bias, outgoing, eps=1e-5) -> bool:
    """The composed layer's kernels serve each step: its LayerNorms, the projection and its
    gate (the c channels and the batch in the gate's grid), the output gate."""
    params = (ln_in_weight, ln_in_bias, proj_weight, proj_bias, gate_weight, gate_bias,
              ln_out_weight, ln_out_bias, out_weight, out_bias)
    if (not _TRI_MUL_NODE.get() or not _common(z, mask, *params, fp32_under_autocast=True)
            or z.dim() < 3 or proj_weight.dim() != 2 or proj_weight.shape[0] % 4):
        return False
    n_c, c = z.shape[-1], proj_weight.shape[0] // 4
    if any(tuple(t.shape) != shape
           for t, shape in zip(params, parameter_shapes(n_c, c), strict=True)):
        return False
    weights = (proj_weight, gate_weight, out_weight)
    return (max(n_c, c) <= MAX_HIDDEN and all(_dtype_served(w, z) for w in weights)
            and tuple(mask.shape[-2:]) == tuple(z.shape[-3:-1]) and mask.dim() <= z.dim() - 1
            and rows_fit(z.shape) and rows_fit((*z.shape[:-1], 4 * c))
            and all(map(grid_fits, triangle_gate.grid_sizes(
                (*z.shape[:-3], 4 * c, *z.shape[-3:-1])).values())))


def supports_linear_channel_first(x, weight) -> bool:
    if not _common(x, weight) or x.dim() < 3:
        return False
    return weight.dim() == 2 and weight.shape[1] == x.shape[-1] and weight.dtype == x.dtype


def supports_bias_dropout_residual(x, residual, bias=None, dropout_mask=None,
                                   dropout_scale=1.0) -> bool:
    return _common(x, residual, bias, dropout_mask) and _broadcasts(x, residual, bias,
                                                                     dropout_mask)


def supports_softmax_mask_bias(logits, mask=None, bias=None) -> bool:
    return (_common(logits, mask, bias) and _broadcasts(logits, mask, bias)
            and logits.shape[-1] <= 16384)


# op name -> (implementation, supports)
SUPPORTS: dict[str, tuple[Callable, Callable[..., bool]]] = {
    "linear": (kernels.linear, supports_linear),
    "attention": (kernels.evo_attention, supports_attention),
    "attention_packed": (kernels.evo_attention_packed, supports_attention_packed),
    # triangle attention is packed self-attention: EvoAttention serves it until a kernel of
    # its own is registered here
    "triangle_attention": (kernels.evo_attention_packed, supports_attention_packed),
    "layer_norm": (kernels.layer_norm, supports_layer_norm),
    "layer_norm_fork": (kernels.layer_norm_fork, supports_layer_norm_fork),
    "layer_norm_pair_bias": (kernels.layer_norm_pair_bias, supports_layer_norm_pair_bias),
    "layer_norm_linear": (kernels.layer_norm_linear,
                          supports_layer_norm_linear),
    "adaptive_layer_norm": (kernels.adaptive_layer_norm, supports_adaptive_layer_norm),
    "softmax_mask_bias": (kernels.softmax_mask_bias,
                          supports_softmax_mask_bias),
    "swiglu": (kernels.swiglu, supports_swiglu),
    "bias_sigmoid_gate": (kernels.bias_sigmoid_gate,
                          supports_bias_sigmoid_gate),
    "bias_dropout_residual": (kernels.bias_dropout_residual,
                              supports_bias_dropout_residual),
    "triangle_projection_gate": (kernels.triangle_projection_gate,
                                 supports_triangle_projection_gate),
    "triangle_projection": (kernels.triangle_projection, supports_triangle_projection),
    "linear_channel_first": (kernels.linear_channel_first,
                             supports_linear_channel_first),
    "triangle_multiplication": (kernels.triangle_multiplication,
                                supports_triangle_multiplication),
}


assert set(SUPPORTS) <= set(OPS), set(SUPPORTS) - set(OPS)  # kernels only for contract ops
assert set(FAKES) == set(SUPPORTS), set(FAKES) ^ set(SUPPORTS)  # a fake for every kernel


def register(registry: ModuleType) -> None:
    """Register every Triton op with ``registry.register(op, "triton", fn, supports=...,
    fake=...)`` (a registry without ``fake`` support gets none)."""
    import inspect

    known = getattr(registry, "OPS", tuple(SUPPORTS))
    takes_fake = "fake" in inspect.signature(registry.register).parameters
    for op, (fn, supports) in SUPPORTS.items():
        if op in known:
            extra = {"fake": FAKES[op]} if takes_fake else {}
            registry.register(op, "triton", fn, supports=supports, priority=PRIORITY, **extra)
