"""The blocks' weights cast once per forward under bf16 autocast (fold_ops.weight_casts.grouped):
a training step gives the same outputs and gradients as with each weight cast where it is read,
with fewer cast launches. Here on the torch references (the ops fold-model dispatches to on a
CPU); tests/integration/test_grouped_casts_kernels.py runs them on fold-kernels' ops."""

from __future__ import annotations

import pytest
import torch
from fold_model import ops
from fold_model.af2 import config as af2_config
from fold_model.af2.evoformer import make_block
from fold_model.af3 import config as af3_config
from fold_model.af3.diffusion import DiffusionTransformerBlock
from fold_model.af3.pairformer import PairformerBlock
from torch.utils._python_dispatch import TorchDispatchMode


class _Casts(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))


def _noised(block: torch.nn.Module) -> torch.nn.Module:
    """Every parameter noised (the zero-initialised output layers would hide gradients)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return block.train()


def _mask(*shape: int, g: torch.Generator) -> torch.Tensor:
    m = (torch.rand(*shape, generator=g) > 0.2).float()
    m[..., -1] = 0.0  # a padded position, and random holes
    return m


def evoformer():
    cfg = af2_config("tiny").evoformer
    g = torch.Generator().manual_seed(0)
    block = make_block(cfg, cfg.c_m, cfg.c_z, "af2")
    return block, (torch.randn(1, 5, 7, cfg.c_m, generator=g),
                   torch.randn(1, 7, 7, cfg.c_z, generator=g),
                   _mask(1, 5, 7, g=g), _mask(1, 7, 7, g=g))


def pairformer():
    cfg = af3_config("tiny")
    p = cfg.pairformer
    g = torch.Generator().manual_seed(0)
    block = PairformerBlock(cfg.c_s, cfg.c_z, p.c_hidden_mul, p.c_hidden_tri_att,
                            p.no_heads_tri_att, p.no_heads_single, p.transition_n, p.dropout)
    mask = _mask(1, 7, g=g)
    return block, (torch.randn(1, 7, cfg.c_s, generator=g),
                   torch.randn(1, 7, 7, cfg.c_z, generator=g), mask,
                   mask[:, :, None] * mask[:, None])


def diffusion():
    cfg = af3_config("tiny")
    d = cfg.diffusion
    g = torch.Generator().manual_seed(0)
    block = DiffusionTransformerBlock(d.c_token, cfg.c_s, cfg.c_z, d.no_heads, d.transition_n)
    return block, (torch.randn(1, 3, 5, d.c_token, generator=g),
                   torch.randn(1, 3, 5, cfg.c_s, generator=g),
                   torch.randn(1, 5, 5, cfg.c_z, generator=g), _mask(1, 5, g=g))


def _step(block, args):
    """``(outputs, input and parameter gradients, casts dispatched)`` of one training step in
    bf16 autocast (fp32 weights and streams, as fold-train trains); dropout seeded."""
    device = next(block.parameters()).device
    inputs = [a.to(device, copy=True).requires_grad_(a.is_floating_point() and a.dim() > 3)
              if i < 2 else a.to(device) for i, a in enumerate(args)]
    torch.manual_seed(11)
    with _Casts() as casts:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = block(*inputs)
        out = out if isinstance(out, tuple) else (out,)
        sum(o.float().square().mean() for o in out).backward()
    grads = [a.grad for a in inputs[:2]] + [p.grad for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    return [o.detach() for o in out], grads, casts.n


def compare(make, monkeypatch, backend: str, device: str = "cpu"):
    """``(casts per call, casts grouped)`` of a training step of ``make()``'s block on
    ``backend`` and ``device``, after asserting the two steps' outputs and gradients equal bit
    for bit."""
    block, args = make()
    block = _noised(block).to(device)
    with ops.use_backend(backend):
        _step(block, args)  # the plan: which weights the forward asks for
        monkeypatch.setenv("FOLD_GROUPED_CASTS", "0")
        out0, grads0, casts0 = _step(block, args)
        monkeypatch.setenv("FOLD_GROUPED_CASTS", "1")
        out1, grads1, casts1 = _step(block, args)
    assert_same_step((out0, grads0), (out1, grads1))
    return casts0, casts1


def assert_same_step(first, second) -> None:
    """Two steps' ``(outputs, gradients)`` (:func:`_step`'s first two) equal bit for bit, and
    finite."""
    for a, b in zip(first[0], second[0], strict=True):
        assert torch.equal(a, b)
    for i, (a, b) in enumerate(zip(first[1], second[1], strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert torch.isfinite(b).all() and torch.equal(a, b), i


@pytest.mark.parametrize("make", [evoformer, pairformer, diffusion],
                         ids=["evoformer", "pairformer", "diffusion"])
def test_grouped_casts_same_step_fewer_casts_torch(make, monkeypatch):
    casts0, casts1 = compare(make, monkeypatch, "torch")
    assert casts1 < casts0
