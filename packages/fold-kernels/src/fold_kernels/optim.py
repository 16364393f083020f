"""Fused Adam(W) + EMA/SWA over flat buffers, and the global gradient norm (HelixFold tensor
fusion, ScaleFold 3.3.1).

With the parameters, gradients and optimizer state each packed into one flat buffer (HelixFold's
tensor fusion), a whole optimizer step is one launch: each element is read once (param, grad,
exp_avg, exp_avg_sq, ema) and written once, instead of one small kernel per tensor and per
arithmetic step. The gradient-clipping factor is passed as a device tensor so that clipping
needs no host synchronization (ScaleFold hides it behind communication).

The global norm is a two-stage reduction: each program writes the sum of squares of its chunk
to a partial buffer, and the partials are summed in a fixed order (deterministic, no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import pdl, tuning
from fold_kernels.ints import cdiv
from fold_kernels.launch import fast

__all__ = ["fused_adam_ema_", "global_grad_norm", "clip_coefficient", "swa_decay"]


@fast
@triton.jit
def _adam_ema(P, G, M, V, E, Scale, n, lr, beta1, beta2, eps, weight_decay,
              bias_corr1, bias_corr2, ema_decay,
              HAS_SCALE: tl.constexpr, HAS_EMA: tl.constexpr, BLOCK: tl.constexpr,
              PDL: tl.constexpr = False):
    pdl.enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    g = tl.load(G + offs, mask=valid, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = g * tl.load(Scale).to(tl.float32)
    p = tl.load(P + offs, mask=valid, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=valid, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=valid, other=0.0).to(tl.float32)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p * (1.0 - lr * weight_decay)  # decoupled weight decay (AdamW); 0 gives Adam
    p = p - (lr / bias_corr1) * m / (tl.sqrt(v / bias_corr2) + eps)
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=valid)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=valid)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=valid)
    if HAS_EMA:
        e = tl.load(E + offs, mask=valid, other=0.0).to(tl.float32)
        e = ema_decay * e + (1.0 - ema_decay) * p
        tl.store(E + offs, e.to(E.dtype.element_ty), mask=valid)


@fast
@triton.jit
def _sumsq(G, Partial, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        offs = (pid.to(tl.int64) * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        g = tl.load(G + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += g * g
    tl.store(Partial + pid, tl.sum(acc, 0))


def _block() -> int:
    return 256 if tuning.interpreting() else 2048


def _check_flat(name: str, ref: torch.Tensor, **bufs: torch.Tensor | None) -> None:
    for key, t in bufs.items():
        if t is None:
            continue
        if t.shape != ref.shape or not t.is_contiguous() or t.device != ref.device:
            raise ValueError(f"{name}: {key} must be a contiguous buffer like param "
                             f"{tuple(ref.shape)} on {ref.device}, got {tuple(t.shape)} "
                             f"on {t.device}")
    tuning.require_device(name, ref)


@torch.no_grad()
def fused_adam_ema_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                    exp_avg_sq: torch.Tensor, ema: torch.Tensor | None = None, *, step: int,
                    lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                    weight_decay: float = 0.0, ema_decay: float | None = None,
                    grad_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One Adam(W) step and EMA/SWA update in place over flat buffers, in one launch.

    Args:
        param, grad, exp_avg, exp_avg_sq, ema: flat contiguous buffers of one length (param
            and state usually fp32; grad may be bf16).
        step: the step number, from 1 (bias correction ``1 - beta^step``).
        weight_decay: decoupled (AdamW); 0 gives plain Adam.
        ema_decay: ``ema = decay * ema + (1 - decay) * param``; for SWA pass
            :func:`swa_decay` ``(n_averaged)``. None (or ema None) skips the average.
        grad_scale: a 1-element device tensor multiplying the gradient (clipping factor from
            :func:`clip_coefficient`, loss-scale inverse), read on the device: no host sync.

    Returns:
        param.
    """
    _check_flat("fused_adam_ema_", param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
                ema=ema)
    if step < 1:
        raise ValueError(f"fused_adam_ema_: step counts from 1, got {step}")
    n = param.numel()
    block = _block()
    has_ema = ema is not None and ema_decay is not None
    _adam_ema[(cdiv(n, block),)](
        param, grad, exp_avg, exp_avg_sq, ema if has_ema else param,
        grad_scale if grad_scale is not None else param, n, float(lr), float(beta1),
        float(beta2), float(eps), float(weight_decay), 1.0 - beta1**step, 1.0 - beta2**step,
        float(ema_decay) if has_ema else 0.0,
        HAS_SCALE=grad_scale is not None, HAS_EMA=has_ema, BLOCK=block,
        num_warps=1 if tuning.interpreting() else 8)
    return param


@torch.no_grad()
def global_grad_norm(grads: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """L2 norm over flat gradient buffers, a 0-dim fp32 device tensor (no host sync)."""
    if isinstance(grads, torch.Tensor):
        grads = [grads]
    partials = []
    block = _block()
    iters = 1 if tuning.interpreting() else 8
    for g in grads:
        tuning.require_device("global_grad_norm", g)
        g = g.reshape(-1)
        if not g.is_contiguous():
            g = g.contiguous()
        n_prog = max(1, cdiv(g.numel(), block * iters))
        part = torch.empty(n_prog, device=g.device, dtype=torch.float32)
        _sumsq[(n_prog,)](g, part, g.numel(), BLOCK=block, ITERS=iters,
                          num_warps=1 if tuning.interpreting() else 8)
        partials.append(part)
    return torch.cat(partials).sum().sqrt()


def clip_coefficient(norm: torch.Tensor, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """``min(1, max_norm / (norm + eps))`` as a device tensor, to pass as ``grad_scale``."""
    return (max_norm / (norm + eps)).clamp(max=1.0).reshape(1).float()


def swa_decay(n_averaged: int) -> float:
    """The EMA decay that turns the update into an equal-weight running mean (SWA)."""
    return n_averaged / (n_averaged + 1)
