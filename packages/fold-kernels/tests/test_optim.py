"""Fused Adam(W)+EMA/SWA and the global gradient norm vs PyTorch references in float64.

fp32 state updated elementwise: the only differences are fp32 roundings of a few operations
per element, so 1e-6 relative after several steps.
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("weight_decay,grad_dtype", [(0.0, torch.float32), (0.05, torch.bfloat16)])
def test_fused_adam_ema_matches_reference(weight_decay, grad_dtype):
    n = 1000  # not a multiple of the block
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(n, generator=gen)
    state = [p.clone(), torch.zeros(n), torch.zeros(n), p.clone()]  # param, m, v, ema
    ours = [t.to(DEVICE) for t in state]
    theirs = [t.double() for t in state]
    for step in range(1, 5):
        g = torch.randn(n, generator=gen).to(grad_dtype)
        scale = torch.tensor([0.5 + 0.1 * step])
        kw = dict(step=step, lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
                  weight_decay=weight_decay, ema_decay=0.9)
        fk.fused_adam_ema_(ours[0], g.to(DEVICE), ours[1], ours[2], ours[3], **kw,
                           grad_scale=scale.to(DEVICE))
        ref.adam_ema_step(theirs[0], g.double(), theirs[1], theirs[2], theirs[3], **kw,
                          grad_scale=scale.double())
    for a, b in zip(ours, theirs):
        assert rel_err(a, b) < 1e-6


def test_swa_decay_gives_running_mean():
    n = 300
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(n, generator=gen).to(DEVICE)
    m, v, avg = torch.zeros_like(p), torch.zeros_like(p), p.clone()
    seen = [p.clone()]
    for step in range(1, 4):
        fk.fused_adam_ema_(p, torch.randn(n, generator=gen).to(DEVICE), m, v, avg, step=step,
                           lr=0.1, ema_decay=fk.swa_decay(step))
        seen.append(p.clone())
    assert rel_err(avg, torch.stack(seen).double().mean(0)) < 1e-6


def test_global_grad_norm_and_clip_coefficient():
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(n, generator=gen).to(DEVICE) for n in (1, 517, 3000)]
    grads.append(torch.randn(333, generator=gen).to(torch.bfloat16).to(DEVICE))
    norm = fk.global_grad_norm(grads)
    assert norm.dim() == 0 and norm.dtype == torch.float32
    assert rel_err(norm, ref.global_grad_norm([g.double() for g in grads])) < 1e-6
    coef = fk.clip_coefficient(norm, 1.0)
    assert rel_err(coef, 1.0 / (norm.double() + 1e-6)) < 1e-6
    assert fk.clip_coefficient(norm, 1e6).item() == 1.0


def test_bad_buffers_are_rejected():
    p = torch.zeros(10, device=DEVICE)
    with pytest.raises(ValueError, match="exp_avg must be"):
        fk.fused_adam_ema_(p, p.clone(), torch.zeros(9, device=DEVICE), p.clone(), step=1,
                           lr=1e-3)
    with pytest.raises(ValueError, match="step counts from 1"):
        fk.fused_adam_ema_(p, p.clone(), p.clone(), p.clone(), step=0, lr=1e-3)
