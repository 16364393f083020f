"""Plain PyTorch reference of every fold-kernels op: the ground truth of the tests.

Each function computes in the dtype it is given (tests call them on float64 copies) and is
differentiable by autograd. Semantics match the Triton ops exactly, including the masking
convention: a masked logit is *replaced* by a large negative constant, so a query (or softmax
row) whose entries are all masked gets uniform weights, and no gradient reaches a masked logit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "MASK_VALUE",
    "evo_attention",
    "evo_attention_packed",
    "layer_norm",
    "layer_norm_linear",
    "swiglu",
    "bias_sigmoid_gate",
    "bias_dropout_residual",
    "softmax_mask_bias",
    "linear_channel_first",
    "adam_ema_step",
    "global_grad_norm",
]

MASK_VALUE = -1.0e30  # replaced logit of a masked entry (any value far below real logits)


def _keep(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def evo_attention(q, k, v, bias=None, mask=None, scale=None, gate=None):
    """``softmax(scale q k^T + bias, masked) v`` (then ``* sigmoid(gate)``); shapes as the op.

    q, k, v, gate ``[*, R, H, N, D]``; bias ``[*, H, N, N]``; mask ``[*, R, N]``.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    logits = scale * (q @ k.transpose(-1, -2))  # [*, R, H, N_q, N_k]
    if bias is not None:
        logits = logits + bias.unsqueeze(-4)  # shared by the R rows
    if mask is not None:
        keep = _keep(mask)[..., :, None, None, :]  # [*, R, 1, 1, N_k]
        logits = logits.masked_fill(~keep, MASK_VALUE)
    o = torch.softmax(logits, dim=-1) @ v
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return o


def evo_attention_packed(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None,
                         gated=True):
    """:func:`evo_attention` of the q, k, v (and gate) packed in ``proj [*, R, N, P*H*D]``
    (P = 4 with the gate, else 3); returns ``[*, R, N, H*D]``."""
    # [*, R, N, P, H, D]; parts picked by index (a fixed count: torch.fx traces it)
    x = proj.unflatten(-1, (4 if gated else 3, no_heads, -1))
    q, k, v = (x[..., i, :, :].transpose(-2, -3) for i in range(3))  # [*, R, H, N, D]
    gate = None
    if gated:
        gate = x[..., 3, :, :]  # [*, R, N, H, D]
        if gate_bias is not None:
            gate = gate + gate_bias.view(no_heads, -1)
        gate = gate.transpose(-2, -3)
    o = evo_attention(q, k, v, bias, mask, scale, gate)  # [*, R, H, N, D]
    return o.transpose(-2, -3).flatten(-2)


def layer_norm(x, weight, bias, eps=1e-5):
    """``F.layer_norm`` over the last dim."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm_linear(x, ln_weight, ln_bias, weight, bias=None, eps=1e-5):
    """``F.linear(F.layer_norm(x), weight, bias)``."""
    return F.linear(layer_norm(x, ln_weight, ln_bias, eps), weight, bias)


def swiglu(x, weight, bias=None):
    """``a, b = F.linear(x, weight, bias).chunk(2, -1); silu(a) * b`` (AF3 transition)."""
    a, b = F.linear(x, weight, bias).chunk(2, dim=-1)
    return F.silu(a) * b


def bias_sigmoid_gate(x, gate, bias=None):
    """``x * sigmoid(gate + bias)``."""
    return x * torch.sigmoid(gate if bias is None else gate + bias)


def triangle_projection_gate(proj, bias, mask):
    """``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) * mask`` and likewise b, from channel-first
    ``proj [*, 4c, I, J]`` = rows ``(p_a, g_a, p_b, g_b)``, ``bias [4c]``, ``mask [*, I, J]``."""
    p_a, g_a, p_b, g_b = (proj + bias.to(proj.dtype)[:, None, None]).chunk(4, dim=-3)
    keep = mask.unsqueeze(-3).to(proj.dtype)
    return p_a * torch.sigmoid(g_a) * keep, p_b * torch.sigmoid(g_b) * keep


def linear_channel_first(x, weight):
    """``y[..., o, i, j] = sum_c weight[o, c] x[..., i, j, c]``: ``x [*, I, J, C]``, ``weight
    [O, C]`` -> ``[*, O, I, J]``."""
    return torch.einsum("oc,...ijc->...oij", weight, x)


def bias_dropout_residual(x, residual, bias=None, dropout_mask=None):
    """``residual + (x + bias) * dropout_mask`` (mask pre-scaled by 1/(1-p), broadcast)."""
    y = x if bias is None else x + bias
    if dropout_mask is not None:
        y = y * dropout_mask
    return residual + y


def softmax_mask_bias(logits, mask=None, bias=None):
    """Softmax over the last dim of ``logits + bias`` with masked entries removed.

    A row whose entries are all masked gets uniform weights.
    """
    z = logits if bias is None else logits + bias
    if mask is not None:
        z = z.masked_fill(~_keep(mask), MASK_VALUE)
    return torch.softmax(z, dim=-1)


def adam_ema_step(param, grad, exp_avg, exp_avg_sq, ema, *, step, lr, beta1=0.9, beta2=0.999,
                  eps=1e-8, weight_decay=0.0, ema_decay=None, grad_scale=None):
    """One Adam(W) step followed by an EMA/SWA update, in place, on flat buffers.

    ``g = grad * grad_scale``; decoupled weight decay ``p -= lr * wd * p``;
    ``ema = decay * ema + (1 - decay) * p_new`` (SWA: ``decay = n / (n + 1)``).
    """
    g = grad if grad_scale is None else grad * grad_scale
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    denom = (exp_avg_sq / bc2).sqrt_().add_(eps)
    if weight_decay:
        param.mul_(1 - lr * weight_decay)
    param.addcdiv_(exp_avg, denom, value=-lr / bc1)
    if ema is not None and ema_decay is not None:
        ema.mul_(ema_decay).add_(param, alpha=1 - ema_decay)
    return param


def global_grad_norm(grads):
    """L2 norm over a list of (flat) gradient buffers, as a 0-dim fp32 tensor."""
    return torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
