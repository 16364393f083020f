"""The EvoAttention benchmarks' shared inputs, the float32 reference and the FlexAttention
contender.

``benchmarks/kernels/attention.py`` (every contender, every shape) and
``benchmarks/kernels/attention_fwd_sweep.py`` (every forward launch candidate against
FlexAttention) use the same inputs and the same compiled FlexAttention, so their numbers compare.
"""

from __future__ import annotations

import torch

from benchmarks.common.blocks import pattern_mask

MASK_NEG = -1e9


def make_inputs(r: int, n: int, h: int, d: int, seed: int = 0, device: str = "cuda",
                dtype: torch.dtype = torch.bfloat16, mask: str = "holes"):
    """q, k, v ``[1, R, H, N, D]``, a pair bias ``[1, H, N, N]`` shared by the R rows, a key
    mask ``[1, R, N]`` (``mask``: about 5% holes, or another pattern of
    ``benchmarks.common.blocks.MASKS``) and a fixed output gradient ``[1, R, H, N, D]``."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(shape, device=device, generator=g, dtype=torch.float32).to(dtype)

    q, k, v = rnd(1, r, h, n, d), rnd(1, r, h, n, d), rnd(1, r, h, n, d)
    bias = rnd(1, h, n, n)
    keep = pattern_mask((1, r, n), g, mask, device)
    do = rnd(1, r, h, n, d)
    return q, k, v, bias, keep, do


def reference(q, k, v, bias, mask, do, max_logits: int = 2**27):
    """Float32 output and gradients of q, k, v and bias (``[1, R, H, N, D]`` x3, ``[1, H, N,
    N]``, mask ``[1, R, N]``, output gradient ``do``), computed in row chunks of at most
    ``max_logits`` logits so that N 1536 fits. The key mask as fold's float64 tests apply it:
    masked logits are constants (``fold_ops.reference.attention``), so a row that keeps no key
    weights every key equally and passes no gradient to q, k or the bias. SDPA's additive -1e9
    is no reference there: its bf16 backward gives such rows gradients of norm ~1e4
    (results/tools/padded_reference_check_h200.txt)."""
    from fold_ops import reference as ref

    leaves = [t.detach().float().requires_grad_() for t in (q, k, v, bias)]
    _, r, h, n, _ = q.shape
    step = max(1, max_logits // (h * n * n))
    outs = []
    for i in range(0, r, step):
        rows = slice(i, min(r, i + step))
        o = ref.attention(leaves[0][:, rows], leaves[1][:, rows], leaves[2][:, rows],
                          leaves[3], mask[:, rows])  # [1, rows, H, N, D]
        torch.autograd.backward(o, do[:, rows].float())  # grads accumulate over the chunks
        outs.append(o.detach())
    return [torch.cat(outs, 1)] + [t.grad for t in leaves]


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attended, -1e9 where masked (the additive form the peers use)."""
    return (1 - mask.to(dtype)) * MASK_NEG


def make_flex(pattern: str = "holes"):
    """FlexAttention as its users run it here: ``torch.compile(flex_attention)`` with a
    ``score_mod`` adding the pair bias ``[H, N, N]``, compiled once per shape
    (``dynamic=False``; reset the compiler between shapes). The key mask as a user of
    FlexAttention would pass one of ``pattern`` (``benchmarks.common.blocks.MASKS``):

    * "holes": the mask's additive bias in the ``score_mod``;
    * "none": no mask term (the mask keeps every key);
    * "padded": a ``BlockMask`` from a ``mask_mod`` reading the key mask, made once per mask
      tensor and reused, so FlexAttention skips the blocks it marks empty and runs the full
      ones without the ``mask_mod``. Rows with no key kept then output 0, where fold and the
      reference give the mean of v: those rows cost FlexAttention nothing."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    cached = {}  # "padded": the BlockMask of the last mask seen, by its storage and shape

    def block_mask(mask, r, n, device):
        key = (mask.data_ptr(), tuple(mask.shape))
        if cached.get("key") != key:
            keep = mask[0].bool()  # [R, N]

            def mask_mod(b, hh, qi, ki):
                return keep[b, ki]

            cached.update(key=key, mask=create_block_mask(mask_mod, r, None, n, n,
                                                          device=device))
        return cached["mask"]

    def flex(q, k, v, bias, mask):
        _, r, h, n, d = q.shape
        b2 = bias[0]  # [H, N, N]
        if pattern == "holes":
            mbias = mask_bias(mask[0], torch.float32)  # [R, N]

            def score_mod(score, b, hh, qi, ki):
                return score + b2[hh, qi, ki] + mbias[b, ki]
        else:
            def score_mod(score, b, hh, qi, ki):
                return score + b2[hh, qi, ki]
        bm = block_mask(mask, r, n, q.device) if pattern == "padded" else None
        o = compiled(q.reshape(r, h, n, d), k.reshape(r, h, n, d), v.reshape(r, h, n, d),
                     score_mod=score_mod, block_mask=bm)
        return o.reshape(1, r, h, n, d)

    return flex
