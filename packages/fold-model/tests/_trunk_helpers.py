"""Test helpers for the AF2 trunk tests: random re-initialisation and inputs with holes.

AF2's 'final' and 'gating' inits make many outputs trivially zero or constant; tests re-draw every
parameter so that a wrong path can be told from a right one.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Re-draw every parameter: weights ~ N(0, 1/fan_in), vectors ~ 1 + 0.2 N or 0.2 N."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                p.copy_(r / p.shape[-1] ** 0.5)
            elif name.endswith("weight"):  # LayerNorm gains
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(0.2 * r)
    return module


def holes(shape: tuple[int, ...], p_hole: float = 0.3, seed: int = 0) -> torch.Tensor:
    """A float 0/1 mask with random holes (position 0 of the last dim kept real)."""
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(shape, generator=gen) > p_hole).float()
    mask[..., 0] = 1.0
    return mask


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative norm error ``|a - b| / |b|`` in float64; NaN anywhere gives inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return float("inf")
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameter gradients by name (zeros where a parameter got none)."""
    return {
        n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }
