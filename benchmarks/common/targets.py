"""Training steps of one block or op named by a target string, for the tools that profile or
count them (``tools.profile_block``, ``tools.launch_census``): ``evoformer:N_seq,N_res`` (AF2
Evoformer block, af2_initial sizes), ``pairformer:N_token``, ``diffusion:N_token,samples`` (one
diffusion transformer block), ``attention:R,N,H,D`` (bias with gradient, key mask with holes),
``trimul:N,1`` / ``trimul:N,0`` (fold-model's triangle multiplication layer, outgoing /
incoming, C_z = c = 128 as the issue's rows: its update and z passed on, random weights).
bf16 or any dtype, training mode; :func:`build` returns the eager step or its CUDA-graph replay.

A suffix ``/PATTERN`` picks the masks' pattern (``blocks.MASKS``): ``holes`` (the default, ~5%
random holes), ``padded`` (the last tenth of the tokens, residues or keys padding: each mask row
keeps a prefix, as for an input padded to its bucket) or ``none`` (all kept), e.g.
``fwd pairformer:768/padded``. A suffix ``@mixed`` trains the block as fold-train's
``precision=bf16`` does: fp32 parameters and streams under bf16 autocast (whatever dtype the
caller asks for), e.g. ``evoformer:128,256@mixed``."""

from __future__ import annotations

import torch

from benchmarks.common import blocks
from benchmarks.common.graphs import capture, grad_body


def _evoformer(n_seq: int, n_res: int, device, dtype, mask: str = "holes"):
    from fold_model.af2 import config
    from fold_model.af2.evoformer import make_block

    cfg = config("af2_initial").evoformer
    block = make_block(cfg, cfg.c_m, cfg.c_z, "af2").to(device=device, dtype=dtype).train()
    g = torch.Generator(device="cpu").manual_seed(0)
    m = torch.randn(1, n_seq, n_res, cfg.c_m, generator=g).to(device, dtype).requires_grad_()
    z = torch.randn(1, n_res, n_res, cfg.c_z, generator=g).to(device, dtype).requires_grad_()
    msa_mask = blocks.pattern_mask((1, n_seq, n_res), g, mask).to(device, dtype)
    pair_mask = blocks.pattern_mask((1, n_res, n_res), g, mask).to(device, dtype)

    def loss():
        m_out, z_out = block(m, z, msa_mask, pair_mask)
        return m_out.float().sum() + z_out.float().sum()
    return loss, [m, z, *block.parameters()]


def _af3_block(kind: str, n: int, samples: int, device, dtype, mask: str = "holes"):
    block, args = blocks.build(kind, n, samples, False, device, dtype, mask)
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + list(block.parameters())
    return (lambda: blocks.loss(block, args)), tensors


def _pairformer(n: int, device, dtype, mask: str = "holes"):
    return _af3_block("pairformer", n, 1, device, dtype, mask)


def _diffusion(n: int, samples: int, device, dtype, mask: str = "holes"):
    return _af3_block("diffusion_transformer", n, samples, device, dtype, mask)


def _attention(r: int, n: int, h: int, d: int, device, dtype, mask: str = "holes"):
    from fold_model import ops

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, r, h, n, d, generator=g).to(device, dtype).requires_grad_()
               for _ in range(3))
    bias = torch.randn(1, h, n, n, generator=g).to(device, dtype).requires_grad_()
    keep = blocks.pattern_mask((1, r, n), g, mask).to(device)

    def loss():
        return ops.attention(q, k, v, bias, keep).float().square().mean()
    return loss, [q, k, v, bias]


def _trimul(n: int, outgoing: int, device, dtype, mask: str = "holes"):
    layer = blocks.triangle_multiplication_layer(128, bool(outgoing), device)
    layer = layer.to(dtype).train()  # random weights
    g = torch.Generator(device="cpu").manual_seed(0)
    z = torch.randn(1, n, n, 128, generator=g).to(device, dtype).requires_grad_()
    pair_mask = blocks.pattern_mask((1, n, n), g, mask).to(device, dtype)

    def loss():
        update, z_out = layer.forward_residual(z, pair_mask)
        return update.float().sum() + z_out.float().sum()
    return loss, [z, *layer.parameters()]


def loss_and_tensors(target: str, device, dtype):
    """``(loss, tensors)`` of ``target``: ``loss()`` runs the forward to a scalar, ``tensors``
    are the inputs and parameters whose gradients the step computes."""
    target, _, precision = target.partition("@")
    if precision not in ("", "mixed"):
        raise SystemExit(f"target precision suffixes are '@mixed', got {precision!r}")
    if precision == "mixed":
        loss, tensors = loss_and_tensors(target, device, torch.float32)

        def mixed():
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                return loss()
        return mixed, tensors
    target, _, mask = target.partition("/")
    kind, _, dims = target.partition(":")
    sizes = [int(x) for x in dims.split(",")]
    return {"evoformer": _evoformer, "pairformer": _pairformer, "diffusion": _diffusion,
            "attention": _attention, "trimul": _trimul}[kind](*sizes, device, dtype,
                                                              mask or "holes")


def build(target: str, device, dtype, graphs: bool = False):
    """The step of ``target``: eager forward + ``backward()``, or with ``graphs`` the replay of a
    captured forward + backward (gradients as graph outputs, benchmarks/common/graphs.py). A
    target with the prefix ``fwd `` (``fwd pairformer:N``) is its block's eval-mode forward
    under no_grad (:func:`forward_step`), eager or replayed."""
    if target.startswith("fwd "):
        forward = forward_step(target[4:].strip(), device, dtype)
        return capture(forward, device)[0] if graphs else forward
    loss, tensors = loss_and_tensors(target, device, dtype)
    if graphs:
        return capture(grad_body(loss, tensors), device)[0]

    def step():
        loss().backward()
        for t in tensors:
            t.grad = None
    return step


_FORWARD_KINDS = {"pairformer": "pairformer", "diffusion": "diffusion_transformer"}


def forward_step(target: str, device, dtype=torch.bfloat16):
    """The eval-mode forward of an AF3 block under no_grad, what prediction runs:
    ``pairformer:N`` or ``diffusion:N,samples`` (the tools' ``fwd`` targets), with an optional
    ``/PATTERN`` of the token mask."""
    target, _, mask = target.partition("/")
    kind, _, dims = target.partition(":")
    if kind not in _FORWARD_KINDS or not dims:
        raise SystemExit(f"forward targets are 'fwd pairformer:N' and "
                         f"'fwd diffusion:N,samples', got {target!r}")
    sizes = [int(x) for x in dims.split(",")]
    block, args = blocks.build(_FORWARD_KINDS[kind], sizes[0], sizes[1] if len(sizes) > 1 else 1,
                               False, device, dtype, mask or "holes")
    block.eval()

    def forward():
        with torch.no_grad():
            return block(*args)
    return forward
