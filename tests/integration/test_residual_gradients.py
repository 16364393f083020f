"""The residual streams' gradients meet in LayerNorm's backward (``ops.layer_norm_fork``).

Where a LayerNorm's input is also read by the residual sum (or by the next sub-layer) and its
output by two layers, autograd adds the gradients of each pair of readers in a separate pass of
three over the tensor: ten pair-sized passes per Pairformer block. On fold-kernels' backend the
fork's backward adds them while it computes LayerNorm's dx. This counts the ``add`` ops of a
block's backward on pair- or MSA-sized tensors (the Triton kernels themselves are not aten ops):
none in the Pairformer and the AF3 MSA module's block, and in the AF2 Evoformer block only the
two transitions' residuals (their LayerNorm is fused with the first linear, which has no fork).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("fold_kernels")
from _triton_backend import DEVICE, register_triton  # noqa: E402
from fold_model import ops  # noqa: E402

N, S = 7, 3


class _Adds(TorchDispatchMode):
    """The shapes of the ``add`` results of the given sizes."""

    def __init__(self, sizes: set[int]) -> None:
        super().__init__()
        self.sizes, self.shapes = sizes, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.add, torch.ops.aten.add_) and \
                out.numel() in self.sizes:
            self.shapes.append(tuple(out.shape))
        return out


def _backward_adds(block: torch.nn.Module, inputs: list, grad_inputs: list[int],
                   sizes: set[int]) -> list:
    """The shapes of the pair- or MSA-sized (``sizes``) adds in ``block``'s backward."""
    block = block.to(DEVICE).train()
    ins = [x.to(DEVICE).requires_grad_(i in grad_inputs) for i, x in enumerate(inputs)]
    outs = block(*ins)
    grads = [torch.randn_like(o) for o in outs]
    adds = _Adds(sizes)
    with adds:
        torch.autograd.backward(outs, grads)
    for i in grad_inputs:
        assert ins[i].grad is not None and torch.isfinite(ins[i].grad).all()
    return adds.shapes


def _check(block: torch.nn.Module, inputs: list, sizes: set[int], expected: list) -> None:
    """``expected`` adds on fold-kernels' backend; more on the torch path, where autograd adds
    the gradients (so the count sees them)."""
    adds = _backward_adds(block, inputs, [0, 1], sizes)
    assert sorted(adds) == sorted(expected), adds
    with ops.use_backend("torch"):
        assert len(_backward_adds(block, inputs, [0, 1], sizes)) > len(expected) + 4


def _masks(*shape: int) -> torch.Tensor:
    m = torch.ones(shape)
    m[..., -2] = 0  # a hole
    return m


def test_pairformer_block_backward_adds_no_pair(monkeypatch):
    register_triton(monkeypatch)
    from fold_model.af3.config import config
    from fold_model.af3.pairformer import PairformerBlock

    cfg = config("tiny")
    p = cfg.pairformer
    block = PairformerBlock(cfg.c_s, cfg.c_z, p.c_hidden_mul, p.c_hidden_tri_att,
                            p.no_heads_tri_att, p.no_heads_single, p.transition_n, p.dropout)
    tokens = _masks(1, N)
    inputs = [torch.randn(1, N, cfg.c_s), torch.randn(1, N, N, cfg.c_z), tokens,
              tokens[:, :, None] * tokens[:, None]]
    _check(block, inputs, {N * N * cfg.c_z, N * cfg.c_s}, [])


def test_af3_msa_module_block_backward_adds_no_pair_or_msa(monkeypatch):
    register_triton(monkeypatch)
    from fold_model.af3.config import config
    from fold_model.af3.msa_module import MSAModuleBlock

    cfg = config("tiny")
    block = MSAModuleBlock(cfg.msa, cfg.c_z, last=False)
    tokens = _masks(1, N)
    inputs = [torch.randn(1, S, N, cfg.msa.c_m), torch.randn(1, N, N, cfg.c_z),
              _masks(1, S, N), tokens[:, :, None] * tokens[:, None], tokens]
    _check(block, inputs, {N * N * cfg.c_z, S * N * cfg.msa.c_m}, [])


def test_evoformer_block_backward_adds_only_the_transitions(monkeypatch):
    register_triton(monkeypatch)
    from fold_model.af2 import config
    from fold_model.af2.evoformer import make_block

    cfg = config("tiny").evoformer
    block = make_block(cfg, cfg.c_m, cfg.c_z, "af2")
    inputs = [torch.randn(1, S, N, cfg.c_m), torch.randn(1, N, N, cfg.c_z), _masks(1, S, N),
              _masks(1, N, N)]
    # the MSA transition's residual (column layout) and the pair transition's
    _check(block, inputs, {N * N * cfg.c_z, S * N * cfg.c_m},
           [(1, S, N, cfg.c_m), (1, N, N, cfg.c_z)])
