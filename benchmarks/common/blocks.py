"""The blocks the model benchmarks and tools time or inspect, built one way for all of them: an
AF3 Pairformer or diffusion transformer block with its inputs at a given size, its forward +
backward step (from the fp32 loss ``sum_o mean(o^2)`` or from fixed random output gradients), and
tiny AF2 Evoformer / AF3 Pairformer training steps for the CPU tools; and a triangle
multiplication layer with random weights."""

from __future__ import annotations

import torch
from fold_model.af3.config import config
from fold_model.af3.diffusion import DiffusionTransformerBlock
from fold_model.af3.pairformer import PairformerBlock

# Token masks of the block inputs (``token_mask``): "holes", ~5% random holes (the benchmarks'
# default); "padded", an input padded to its bucket (the last tenth of the tokens are padding, so
# every row of a pair mask keeps a prefix of its keys); "none", every token real.
MASKS = ("holes", "padded", "none")


def token_mask(n: int, gen: torch.Generator, device: torch.device,
               pattern: str = "holes") -> torch.Tensor:
    """A ``[1, n]`` float token mask of ``pattern`` (:func:`pattern_mask`; the first token
    always present)."""
    m = pattern_mask((1, n), gen, pattern).float()
    m[:, 0] = 1
    return m.to(device)


def pattern_mask(shape: tuple[int, ...], gen: torch.Generator, pattern: str,
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """A bool mask ``shape`` (rows, keys last) of ``pattern`` (:data:`MASKS`): "holes" ~5%
    random holes; "padded" the last tenth of the rows and of the keys masked (a padded row masks
    every key: each row keeps a prefix of its keys); "none" all kept. The same random draws for
    every pattern (``gen`` on ``device``)."""
    if pattern not in MASKS:
        raise SystemExit(f"mask pattern {pattern!r}: expected one of {', '.join(MASKS)}")
    holes = torch.rand(shape, generator=gen, device=device) > 0.05
    if pattern == "holes":
        return holes
    keep = torch.ones(shape, dtype=torch.bool, device=device)
    if pattern == "padded":
        rows, keys = shape[-2], shape[-1]
        keep[..., rows - rows // 10:, :] = False
        keep[..., keys - keys // 10:] = False
    return keep


def build(kind: str, n: int, samples: int, tiny: bool, device: torch.device,
          dtype: torch.dtype, mask: str = "holes") -> tuple[torch.nn.Module, tuple]:
    """The block and its inputs (activations require grad); ``mask``: the token mask's pattern
    (:data:`MASKS`)."""
    cfg = config("tiny" if tiny else "af3")
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mask = token_mask(n, gen, device, mask)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(True)

    if kind == "pairformer":
        p = cfg.pairformer
        block = PairformerBlock(cfg.c_s, cfg.c_z, p.c_hidden_mul, p.c_hidden_tri_att,
                                p.no_heads_tri_att, p.no_heads_single, p.transition_n, p.dropout)
        args = (rnd(1, n, cfg.c_s), rnd(1, n, n, cfg.c_z), mask, mask[:, :, None] * mask[:, None])
    else:
        d = cfg.diffusion
        block = DiffusionTransformerBlock(d.c_token, cfg.c_s, cfg.c_z, d.no_heads, d.transition_n)
        args = (rnd(1, samples, n, d.c_token), rnd(1, samples, n, cfg.c_s), rnd(1, n, n, cfg.c_z),
                mask)
    return block.to(device, dtype).train(), args


def upstream_grads(block: torch.nn.Module, args: tuple) -> tuple[torch.Tensor, ...]:
    """Fixed random gradients for the block's outputs (``--upstream random``)."""
    with torch.no_grad():
        out = block(*args)
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(o.shape, generator=gen).to(o.device, o.dtype)
                 for o in (out if isinstance(out, tuple) else (out,)))


def backward(block: torch.nn.Module, args: tuple, grads: tuple | None,
             tensors: list[torch.Tensor] | None = None):
    """Forward + backward: of the loss ``sum_o mean(o^2)`` (fp32) when ``grads`` is None, else
    of the outputs with ``grads`` as their gradients (the block alone, no loss kernels). With
    ``tensors``, returns their gradients instead of accumulating ``.grad``."""
    if grads is None:
        outs, seeds = (loss(block, args),), None
    else:
        out = block(*args)
        outs, seeds = (out if isinstance(out, tuple) else (out,)), grads
    if tensors is not None:
        return torch.autograd.grad(outs, tensors, seeds, allow_unused=True)
    torch.autograd.backward(outs, seeds)
    return None


def step(block: torch.nn.Module, args: tuple, grads: tuple | None = None) -> None:
    """One eager forward + backward (see :func:`backward`), gradients cleared afterwards."""
    backward(block, args, grads)
    for a in args:
        if isinstance(a, torch.Tensor) and a.grad is not None:
            a.grad = None
    block.zero_grad(set_to_none=True)


def loss(block: torch.nn.Module, args: tuple) -> torch.Tensor:
    """The fp32 loss ``sum_o mean(o^2)`` over the block's outputs."""
    out = block(*args)
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.float().square().mean() for o in outs)


def evoformer_step(device, dtype, n_seq: int = 6, n_res: int = 10, forward_only: bool = False):
    """One training step of a tiny AF2 Evoformer block (masks with ~10% holes); with
    ``forward_only`` its forward in eval mode (inference: the caller sets ``no_grad``)."""
    from fold_model.af2 import config as af2_config
    from fold_model.af2.evoformer import make_block

    cfg = af2_config("tiny").evoformer
    torch.manual_seed(0)
    block = make_block(cfg, cfg.c_m, cfg.c_z, "af2").to(device=device, dtype=dtype).train()
    m = torch.randn(1, n_seq, n_res, cfg.c_m, device=device, dtype=dtype, requires_grad=True)
    z = torch.randn(1, n_res, n_res, cfg.c_z, device=device, dtype=dtype, requires_grad=True)
    msa_mask = (torch.rand(1, n_seq, n_res, device=device) > 0.1).to(dtype)
    pair_mask = (torch.rand(1, n_res, n_res, device=device) > 0.1).to(dtype)

    if forward_only:
        block.eval()
        return lambda: block(m, z, msa_mask, pair_mask)

    def run():
        m_out, z_out = block(m, z, msa_mask, pair_mask)
        (m_out.float().sum() + z_out.float().sum()).backward()
        block.zero_grad(set_to_none=True)
        m.grad = z.grad = None
    return run


def _tiny_af3_step(kind: str, n: int, samples: int, device, dtype, forward_only: bool):
    """A tiny AF3 block's training step, or (``forward_only``) its forward in eval mode
    (inference: the caller sets ``no_grad``)."""
    block, args = build(kind, n, samples, True, device, dtype)
    if forward_only:
        block.eval()
        return lambda: block(*args)
    return lambda: step(block, args)


def diffusion_step(device, dtype, n: int = 10, samples: int = 3, forward_only: bool = False):
    """One training step of a tiny AF3 diffusion transformer block (``samples`` rows share the
    pair bias); with ``forward_only`` its forward in eval mode (the caller sets ``no_grad``)."""
    return _tiny_af3_step("diffusion_transformer", n, samples, device, dtype, forward_only)


def pairformer_step(device, dtype, n: int = 10, forward_only: bool = False):
    """One training step of a tiny AF3 Pairformer block; with ``forward_only`` its forward in
    eval mode (inference: the caller sets ``no_grad``)."""
    return _tiny_af3_step("pairformer", n, 1, device, dtype, forward_only)


def triangle_multiplication_layer(n_c: int, outgoing: bool, device, seed: int = 0):
    """fold's triangle multiplication layer, ``C_z = c = n_c``, with random (not init-zero)
    weights, so every gradient is non-trivial."""
    from fold_model.layers.triangle_multiplication import TriangleMultiplication

    torch.manual_seed(seed)
    layer = TriangleMultiplication(n_c, n_c, outgoing=outgoing)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5))
    return layer.to(device)
