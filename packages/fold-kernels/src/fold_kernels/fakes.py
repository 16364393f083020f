"""Shape-only stand-ins of the Triton ops for memory estimates on FakeTensors.

fold-model's registry runs a backend's ``fake`` instead of the backend when a call's arguments
are FakeTensors (AutoChunk's planning run, the ``predict --dry-run`` estimate): no kernel is
launched, and what the memory accounting sees allocated is what the kernel's forward allocates:
its outputs (the shapes, dtypes and devices the kernel returns) and its small transients (the
attention's fp32 log-sum-exp rows and pre-gate output, LayerNorm's mean and rstd, the copies a
kernel makes of non-contiguous inputs), released on return as at inference. Never the
reference's ``[*, R, H, N, N]`` logits: the kernels keep them in registers. What the forward
saves for a backward is not modelled (AutoChunk and the dry run are inference).

Each function has its op's signature (:mod:`fold_ops.contract`).
"""

from __future__ import annotations

import torch
from fold_ops.autocast import projection_dtype

from fold_kernels.broadcast import broadcast_shape

__all__ = ["FAKES"]


def _shape(*tensors) -> tuple[int, ...]:
    shape = broadcast_shape(*(tuple(t.shape) for t in tensors if t is not None))
    if shape is None:
        raise ValueError(f"shapes {[tuple(t.shape) for t in tensors if t is not None]} do not "
                         "broadcast")
    return shape


def _stats(like: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.empty(shape, device=like.device, dtype=torch.float32)


def linear(x, weight, bias=None):
    """cuBLAS's ``F.linear``: the output only."""
    return torch.empty((*x.shape[:-1], weight.shape[0]), device=x.device, dtype=x.dtype)


def attention(q, k, v, bias=None, mask=None, scale=None, gate=None):
    """o ``[*, R, H, N, D]``; transients: the pre-gate output (gated) and the fp32
    log-sum-exp rows ``[*, R, H, 2, N]``."""
    *lead, n, _ = q.shape
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    stats = _stats(q, *lead[:-1], 2, n)  # [*, R, H, 2, N]
    pre = torch.empty_like(q) if gate is not None else None
    del stats, pre
    return o


def attention_packed(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None,
                     gated=True):
    """o ``[*, R, N, H*D]`` from ``proj [*, R, N, P*H*D]``; transients as :func:`attention`."""
    *lead, n, c = proj.shape
    hd = c // (4 if gated else 3)
    o = proj.new_empty((*lead, n, hd))
    stats = _stats(proj, *lead, no_heads, 2, n)  # [*, R, H, 2, N]
    pre = proj.new_empty((*lead, n, hd)) if gated else None
    del stats, pre
    return o


def layer_norm(x, weight, bias, eps=1e-5, out_dtype=None):
    """y like x (in ``out_dtype`` if given); transients: fp32 mean and rstd per row."""
    rows = x.numel() // x.shape[-1]
    y = torch.empty(x.shape, device=x.device, dtype=out_dtype or x.dtype)
    mean, rstd = _stats(x, rows), _stats(x, rows)
    del mean, rstd
    return y


def layer_norm_fork(x, weight, bias, eps=1e-5, branches=1):
    """x and ``branches`` aliases of one y (:func:`layer_norm`'s, in the projection dtype)."""
    y = layer_norm(x, weight, bias, eps, projection_dtype(x))
    return (x,) + (y,) * branches


def layer_norm_pair_bias(x, weight, bias, bias_weight, eps=1e-5, branches=1):
    """:func:`layer_norm_fork`'s outputs and the heads-first bias (:func:`linear_channel_first`
    of y)."""
    y = layer_norm(x, weight, bias, eps, projection_dtype(x))
    return (x,) + (y,) * branches + (linear_channel_first(y, bias_weight),)


def layer_norm_linear(x, ln_weight, ln_bias, weight, bias=None, eps=1e-5):
    """y ``[*, O]``; transients: fp32 mean and rstd per row (x read through its strides)."""
    rows = x.numel() // x.shape[-1]
    y = torch.empty((*x.shape[:-1], weight.shape[0]), device=x.device,
                    dtype=projection_dtype(x))
    mean, rstd = _stats(x, rows), _stats(x, rows)
    del mean, rstd
    return y


def adaptive_layer_norm(a, cond, gate_bias=None, eps=1e-5):
    """y like a (in the projection dtype); transients: fp32 mean and rstd per row."""
    return layer_norm(a, None, None, eps, projection_dtype(a))


def swiglu(x, weight, bias=None):
    """y ``[*, O/2]``; the kernel copies a non-contiguous x to ``[M, K]`` rows first."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty((*x.shape[:-1], weight.shape[0] // 2), device=x.device, dtype=x.dtype)
    del x2
    return y


def bias_sigmoid_gate(x, gate, bias=None, x_bias=None):
    return torch.empty(_shape(x, gate, bias), device=x.device, dtype=x.dtype)


def bias_dropout_residual(x, residual, bias=None, dropout_mask=None, dropout_scale=1.0):
    return torch.empty(_shape(x, residual, bias, dropout_mask), device=x.device,
                       dtype=residual.dtype)


def softmax_mask_bias(logits, mask=None, bias=None):
    return torch.empty(_shape(logits, mask, bias), device=logits.device, dtype=logits.dtype)


def triangle_projection_gate(proj, bias, mask):
    """(a, b), each ``[*, c, I, J]`` over proj's batch dims."""
    *lead, c4, n_i, n_j = proj.shape
    a = torch.empty((*lead, c4 // 4, n_i, n_j), device=proj.device, dtype=proj.dtype)
    return a, torch.empty_like(a)


def triangle_projection(z, weight, bias, mask):
    """(a, b), each ``[*, c, I, J]`` over z's batch dims (z copied first when it is not
    contiguous)."""
    z = z if z.is_contiguous() else z.contiguous()
    *lead, n_i, n_j, _ = z.shape
    a = torch.empty((*lead, weight.shape[0] // 4, n_i, n_j), device=z.device, dtype=z.dtype)
    return a, torch.empty_like(a)


def linear_channel_first(x, weight):
    """``[*, O, I, J]``: a view of the GEMM's ``[O, *, I, J]`` output (x copied first when it
    is not contiguous)."""
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty((weight.shape[0], *x.shape[:-1]), device=x.device, dtype=x.dtype)
    return y.movedim(0, -3)


def triangle_multiplication(z, mask, ln_in_weight, ln_in_bias, proj_weight, proj_bias,
                            gate_weight, gate_bias, ln_out_weight, ln_out_bias, out_weight,
                            out_bias, outgoing, eps=1e-5):
    """(update, z): the update ``[*, I, J, C]`` in the projections' dtype, z passed on. Held
    until the op returns: the normalized pair, the projections ``[*, 4c, I, J]``, a and b, the
    product and its LayerNorm, the two output projections (and each LayerNorm's statistics)."""
    *lead, n_i, n_j, n_c = z.shape
    dtype = projection_dtype(z)
    c = proj_weight.shape[0] // 4
    held = [torch.empty((*lead, n_i, n_j, 3 * n_c), device=z.device,
                        dtype=dtype),  # z_ln, x W_out, g
            torch.empty((*lead, 8 * c, n_i, n_j), device=z.device,
                        dtype=dtype),  # proj, a, b, x, LN(x)
            _stats(z, 4 * z.numel() // max(n_c, 1))]  # mean, rstd of both LayerNorms
    del held
    return torch.empty((*lead, n_i, n_j, n_c), device=z.device, dtype=dtype), z


FAKES = {
    "linear": linear,
    "attention": attention,
    "attention_packed": attention_packed,
    "triangle_attention": attention_packed,
    "layer_norm": layer_norm,
    "layer_norm_fork": layer_norm_fork,
    "layer_norm_pair_bias": layer_norm_pair_bias,
    "layer_norm_linear": layer_norm_linear,
    "adaptive_layer_norm": adaptive_layer_norm,
    "softmax_mask_bias": softmax_mask_bias,
    "swiglu": swiglu,
    "bias_sigmoid_gate": bias_sigmoid_gate,
    "bias_dropout_residual": bias_dropout_residual,
    "triangle_projection_gate": triangle_projection_gate,
    "triangle_projection": triangle_projection,
    "linear_channel_first": linear_channel_first,
    "triangle_multiplication": triangle_multiplication,
}
