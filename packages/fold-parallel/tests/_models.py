"""Tiny Evoformer / extra MSA / template pair stacks with random parameters, inputs with odd
sizes and masks with holes, and the single-process float64 reference run (outputs, gradients of
every parameter and input) that the distributed runs are compared against."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from fold_model.af2 import config
from fold_model.af2.evoformer import EvoformerStack, ExtraMsaStack
from fold_model.af2.template import TemplatePairStack
from torch import nn

B, N_SEQ, N_RES, N_TEMPL = 2, 5, 7, 2  # odd: N_res and N_seq get padded to a multiple of 2
KINDS = ("evoformer", "extra_msa", "template")


def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Re-draw every parameter (AF2's zero 'final' inits would make outputs trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                p.copy_(r / p.shape[-1] ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(0.2 * r)
    return module


def holes(shape: tuple[int, ...], seed: int, p_hole: float = 0.3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(shape, generator=gen) > p_hole).double()
    mask[..., 0] = 1.0
    return mask


def build(kind: str, order: str = "af2", n_blocks: int | None = None) -> nn.Module:
    """A float64 stack of ``kind`` with random parameters (same on every rank)."""
    cfg = config("tiny")
    torch.manual_seed(0)
    if kind == "evoformer":
        c = cfg.evoformer
        if n_blocks is not None:
            c.no_blocks = n_blocks
        stack: nn.Module = EvoformerStack(c, order=order)
    elif kind == "extra_msa":
        c = cfg.extra_msa
        c.no_blocks = 2 if n_blocks is None else n_blocks
        stack = ExtraMsaStack(c, cfg.evoformer.c_z, order=order)
    elif kind == "template":
        c = cfg.template
        c.no_blocks = 2 if n_blocks is None else n_blocks
        stack = TemplatePairStack(c)
    else:
        raise ValueError(kind)
    return randomize_(stack).double().eval()


def inputs(kind: str, stack: nn.Module, seed: int = 1) -> list[torch.Tensor]:
    """Positional float64 inputs of ``stack``; the activations require grad."""
    g = torch.Generator().manual_seed(seed)
    seq = holes((B, N_RES), seed + 10)
    pair_mask = seq[:, :, None] * seq[:, None, :]
    if kind == "template":
        c_t = stack.layer_norm.dim
        t = torch.randn(B, N_TEMPL, N_RES, N_RES, c_t, generator=g, dtype=torch.float64)
        return [t.requires_grad_(True), pair_mask]
    c_m = stack.blocks[0].msa_att_row.layer_norm_m.dim
    c_z = stack.blocks[0].msa_att_row.layer_norm_z.dim
    m = torch.randn(B, N_SEQ, N_RES, c_m, generator=g, dtype=torch.float64)
    z = torch.randn(B, N_RES, N_RES, c_z, generator=g, dtype=torch.float64)
    msa_mask = holes((B, N_SEQ, N_RES), seed + 11) * seq[:, None, :]
    return [m.requires_grad_(True), z.requires_grad_(True), msa_mask, pair_mask]


def output_masks(kind: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """Where each output is defined: fully masked positions are not (the attention of a query
    with every key masked averages all values, so they depend on how much padding there is).
    Every unmasked element counts."""
    if kind == "template":
        return [args[1][:, None, :, :, None]]  # t: [B, T, N, N, C]
    msa_mask, pair_mask = args[2], args[3]
    masks = [msa_mask[..., None], pair_mask[..., None]]
    if kind == "evoformer":
        masks.append(msa_mask[:, 0, :, None])  # s = Linear(m[first row])
        return masks
    return masks[1:]  # extra MSA stack: z only


def loss_of(outputs, masks: list[torch.Tensor], seed: int = 5) -> torch.Tensor:
    """``sum_k sum(out_k * mask_k * W_k)`` with fixed random W."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for o, mask in zip(outs, masks):
        w = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
        total = total + (o * mask.to(o.dtype) * w).sum()
    return total


@dataclass
class Run:
    outputs: list[torch.Tensor]
    input_grads: list[torch.Tensor]
    param_grads: dict[str, torch.Tensor]


def run(stack: nn.Module, args: list[torch.Tensor], kind: str) -> Run:
    """Forward, backward of :func:`loss_of`; returns the outputs where defined (masked) and the
    gradients."""
    out = stack(*args)
    masks = output_masks(kind, args)
    loss_of(out, masks).backward()
    outs = list(out) if isinstance(out, tuple) else [out]
    return Run(
        [o.detach() * mask.to(o.dtype) for o, mask in zip(outs, masks)],
        # A rank may not use an input at all (the pair rank of BP never reads the MSA): zeros.
        [
            a.grad.detach().clone() if a.grad is not None else torch.zeros_like(a)
            for a in args
            if a.requires_grad
        ],
        {
            n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in stack.named_parameters()
        },
    )


def fresh(stack: nn.Module, args: list[torch.Tensor], dtype: torch.dtype):
    """A copy of ``stack`` and its inputs in ``dtype`` (leaf activations require grad)."""
    s = copy.deepcopy(stack).to(dtype)
    a = [x.detach().to(dtype).requires_grad_(x.requires_grad) for x in args]
    return s, a


def compare(got: Run, ref: Run) -> dict[str, float]:
    """Relative errors (max per category) of the outputs, input grads and parameter grads.

    A parameter grad is measured against ``max(|ref_p|, 1e-3 |ref_all|)``: some grads are zero
    in exact arithmetic (e.g. the bias of the LayerNorm before a pair bias: softmax is invariant
    to a shift shared by all keys) and are pure rounding noise in both runs."""
    from _dist import rel_err

    total = torch.cat([g.reshape(-1) for g in ref.param_grads.values()]).norm()
    param_errs = []
    for n, r in ref.param_grads.items():
        g = got.param_grads[n]
        if g is None or not torch.isfinite(g).all():
            param_errs.append(float("inf"))
            continue
        denom = torch.maximum(r.double().norm(), 1e-3 * total)
        param_errs.append(((g.double() - r.double()).norm() / denom).item())
    return {
        "outputs": max(rel_err(a, b) for a, b in zip(got.outputs, ref.outputs)),
        "input_grads": max(rel_err(a, b) for a, b in zip(got.input_grads, ref.input_grads)),
        "param_grads": max(param_errs),
        "n_params": float(len(param_errs)),
    }
