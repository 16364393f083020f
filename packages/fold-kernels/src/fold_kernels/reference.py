"""Plain PyTorch reference of the fold-kernels functions that are not registry ops: the fused
Adam+EMA step and the global gradient norm (the ground truth of their tests).

The references of the ops (attention, LayerNorm, SwiGLU, the gates, softmax, ...) are the op
contract's, :mod:`fold_ops.reference`, shared with fold-model.
"""

from __future__ import annotations

import torch

__all__ = ["adam_ema_step", "global_grad_norm"]


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
