"""The AF3 diffusion module (supplement 3.7, Alg. 18-23): diffusion conditioning with the Fourier
noise embedding, the atom attention encoder, the diffusion transformer over tokens, the atom
attention decoder and the EDM preconditioning; the noise schedule, the EDM sampler with its
stochasticity parameters, the centre-random augmentation and the training noise distribution.

Shapes: ``B`` batch, ``S`` diffusion samples (48 per trunk pass in training), ``N`` tokens,
``A`` atoms. The pair ``z [B, N, N, C_z]`` does not depend on the noise, so the pair bias of each
transformer block is computed once and shared by the S samples: the samples are the ``R`` rows of
``ops.attention`` (``[B, S, H, N, D]`` with a bias ``[B, H, N, N]``).

Precision: atom coordinates are carried in at least fp32 (:func:`coordinate_dtype`), also under
bf16 autocast: bf16 keeps 8 significant bits, i.e. steps of 0.125-0.25 A at 20-50 A from the
origin, which would corrupt the MSE target and the sampler's trajectory. The noise, the EDM
preconditioning (``c_in``, ``c_skip``, ``c_out``), the centre-random augmentation, the sampler's
updates and the denoised output run with autocast disabled; only the network (the atom encoder /
decoder and the transformer, whose ``r_update`` is cast back to the coordinate dtype) runs under
the caller's autocast.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from fold_ops.weight_casts import grouped
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model.af3.conditioning import AttentionPairBias, ConditionedTransitionBlock
from fold_model.af3.embedders import (
    AtomAttentionDecoder,
    AtomAttentionEncoder,
    RelativePositionEncoding,
)
from fold_model.layers import LayerNorm, Linear, SwiGLUTransition, stack_as_made

__all__ = [
    "FourierEmbedding",
    "DiffusionConditioning",
    "DiffusionTransformerBlock",
    "DiffusionTransformer",
    "DiffusionModule",
    "coordinate_dtype",
    "noise_schedule",
    "random_rotation",
    "apply_augmentation",
    "centre_random_augmentation",
    "draw_sampler_noise",
    "sample_diffusion",
    "sampler_schedule",
    "sampler_step",
    "sample_training_noise",
    "noisy_training_samples",
]


def coordinate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype coordinates and EDM scalars are computed in: ``dtype`` promoted to at least fp32
    (fp64 stays fp64; bf16 / fp16 become fp32)."""
    return torch.promote_types(dtype, torch.float32)


def _exact(device: torch.device):
    """Autocast off for the few elementwise coordinate ops (their inputs are >= fp32)."""
    return torch.autocast(device.type, enabled=False)


class FourierEmbedding(nn.Module):
    """Alg. 22: ``cos(2 pi (t w + b))`` with ``w, b ~ N(0, 1)`` drawn once and frozen (buffers).
    ``t: [*]`` -> ``[*, C]``."""

    def __init__(self, c: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("w", torch.randn(c, generator=g))
        self.register_buffer("b", torch.randn(c, generator=g))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(2 * math.pi * (t[..., None] * self.w + self.b))


class DiffusionConditioning(nn.Module):
    """Alg. 21. ``forward(t_hat [B, S], feats, s_inputs [B, N, C_si], s_trunk [B, N, C_s],
    z_trunk [B, N, N, C_z]) -> (s [B, S, N, C_s], z [B, N, N, C_z])``."""

    def __init__(self, cfg, c_s: int, c_z: int, c_s_inputs: int, relpos) -> None:
        super().__init__()
        self.sigma_data = cfg.sigma_data
        self.relpos = RelativePositionEncoding(c_z, relpos.r_max, relpos.s_max)
        self.layer_norm_z = LayerNorm(2 * c_z)
        self.linear_z = Linear(2 * c_z, c_z, bias=False)
        self.transitions_z = nn.ModuleList(
            SwiGLUTransition(c_z, cfg.conditioning_transition_n) for _ in range(2)
        )
        self.layer_norm_s = LayerNorm(c_s + c_s_inputs)
        self.linear_s = Linear(c_s + c_s_inputs, c_s, bias=False)
        self.fourier = FourierEmbedding(cfg.c_fourier)
        self.layer_norm_n = LayerNorm(cfg.c_fourier)
        self.linear_n = Linear(cfg.c_fourier, c_s, bias=False)
        self.transitions_s = nn.ModuleList(
            SwiGLUTransition(c_s, cfg.conditioning_transition_n) for _ in range(2)
        )
        self.chunk_size: int | None = None  # inference: the pair conditioning's rows per block

    def pair(self, feats: dict[str, torch.Tensor], z_trunk: torch.Tensor) -> torch.Tensor:
        """Lines 1-3 (independent of the noise level: computed once per trunk pass). Every
        step is per pair, so with ``chunk_size`` (inference) the pair rows are made
        ``chunk_size`` at a time into the output: the concatenation ``[B, R, N, 2 C_z]`` and the
        transitions' hidden ``[B, R, N, 4 C_z]`` of one block live instead of the whole pair's
        (at 4096 tokens in fp32 the whole pair's take 88 GiB, 64-row blocks 17.4 GiB, the input
        and output pairs included: docs/memory.md)."""
        n = z_trunk.shape[-2]
        step = self.chunk_size or n
        if step >= n:
            return self._pair_rows(feats, z_trunk, slice(None))
        out = None
        for i in range(0, n, step):
            block = self._pair_rows(feats, z_trunk, slice(i, i + step))  # [B, R, N, C_z]
            if out is None:  # the block's dtype: autocast decides it
                out = block.new_empty(*block.shape[:-3], n, n, block.shape[-1])
            out[..., i: i + step, :, :] = block
        return out

    def _pair_rows(self, feats, z_trunk, rows: slice) -> torch.Tensor:
        """Lines 1-3 for the pair rows ``rows``: ``[B, R, N, C_z]``."""
        z = torch.cat([z_trunk[..., rows, :, :], self.relpos(feats, rows).to(z_trunk.dtype)],
                      dim=-1)  # [B, R, N, 2C_z]
        z = self.linear_z(self.layer_norm_z(z))
        for t in self.transitions_z:
            z = z + t(z)
        return z

    def single_trunk(self, s_inputs: torch.Tensor, s_trunk: torch.Tensor) -> torch.Tensor:
        """Line 4, the single conditioning's noise-independent part: ``[B, N, C_s]``."""
        return self.linear_s(self.layer_norm_s(torch.cat([s_trunk, s_inputs], dim=-1)))

    def single(
        self, t_hat: torch.Tensor, s_inputs: torch.Tensor, s_trunk: torch.Tensor,
        s_cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Lines 4-9: ``[B, S, N, C_s]`` (``s_cond``: :meth:`single_trunk`, made beforehand)."""
        s = self.single_trunk(s_inputs, s_trunk) if s_cond is None else s_cond  # [B, N, C_s]
        n = self.fourier(0.25 * torch.log(t_hat / self.sigma_data))  # [B, S, C_f]
        s = s.unsqueeze(1) + self.linear_n(self.layer_norm_n(n)).unsqueeze(-2)  # [B, S, N, C_s]
        for t in self.transitions_s:
            s = s + t(s, None, -2)
        return s

    def forward(self, t_hat, feats, s_inputs, s_trunk, z_trunk):
        return self.single(t_hat, s_inputs, s_trunk), self.pair(feats, z_trunk)


class DiffusionTransformerBlock(nn.Module):
    """One block of Alg. 23: ``a += AttentionPairBias(a, s, z)``; ``a += ConditionedTransition(a,
    s)``. ``a: [B, S, N, C_a]``, ``s: [B, S, N, C_s]``, ``z: [B, N, N, C_z]``, ``mask: [B, N]``."""

    def __init__(self, c_a: int, c_s: int, c_z: int, no_heads: int, transition_n: int) -> None:
        super().__init__()
        self.attention = AttentionPairBias(c_a, c_z, no_heads, c_s=c_s)
        self.transition = ConditionedTransitionBlock(c_a, c_s, transition_n)
        self.chunk_size: int | None = None  # inference: pair rows and samples in chunks

    def pair_bias(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, H, N, N]`` from the pair conditioning ``z``; with a chunk size LN(z) is made in
        row chunks."""
        return self.attention.bias_from_pair(z, chunk_size=self.chunk_size)

    @grouped
    def forward(
        self, a: torch.Tensor, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``bias``: :meth:`pair_bias` of ``z`` made beforehand (the sampler's steps share it);
        None: made here. (torch.fx tracing the block on its own sees the bias made from z.)"""
        if bias is None or isinstance(bias, torch.fx.Proxy):  # [B, H, N, N], shared by samples
            bias = self.pair_bias(z)
        key_mask = mask.unsqueeze(1).expand(a.shape[:-1])  # [B, S, N]
        # with a chunk size the samples attend in chunks: logits [B, chunk, H, N, N]
        a = a + self.attention(a, bias, key_mask, s, self.chunk_size)
        return a + self.transition(a, s)


class DiffusionTransformer(nn.Module):
    """Alg. 23 over tokens (24 blocks, 16 heads); each block optionally checkpointed (all but the
    last ``uncheckpointed_blocks``)."""

    def __init__(self, c_a: int, c_s: int, c_z: int, no_blocks: int, no_heads: int,
                 transition_n: int = 2, use_checkpoint: bool = False) -> None:
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.uncheckpointed_blocks = 0  # with use_checkpoint: the last blocks run without
        self.blocks = nn.ModuleList(
            DiffusionTransformerBlock(c_a, c_s, c_z, no_heads, transition_n)
            for _ in range(no_blocks)
        )

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Inference chunking of every block (pair-bias rows, samples in attention)."""
        for block in self.blocks:
            block.chunk_size = chunk_size

    def pair_biases(self, z: torch.Tensor, blocks=None) -> torch.Tensor:
        """Every block's pair bias ``[no_blocks, B, H, N, N]`` (``blocks``: those blocks', in
        order): functions of the pair conditioning alone, so the sampler makes them once per
        prediction (:func:`stack_as_made`: no_blocks + 1 biases live at most)."""
        blocks = self.blocks if blocks is None else blocks
        return stack_as_made([functools.partial(block.pair_bias, z) for block in blocks])

    def forward(self, a, s, z, mask):
        return self._blocks(a, s, z, mask, None)

    def forward_biases(self, a, s, z, mask, biases: torch.Tensor):
        """:meth:`forward` with every block's pair bias made beforehand (:meth:`pair_biases` of
        z)."""
        return self._blocks(a, s, z, mask, biases)

    def _blocks(self, a, s, z, mask, biases: torch.Tensor | None):
        recompute = self.use_checkpoint and self.training and torch.is_grad_enabled()
        first_plain = len(self.blocks) - self.uncheckpointed_blocks
        for i, block in enumerate(self.blocks):
            bias = None if biases is None else biases[i]  # made beforehand, or by the block
            if recompute and i < first_plain:
                a = checkpoint(block, a, s, z, mask, bias, use_reentrant=False)
            else:
                a = block(a, s, z, mask, bias)
        return a


class DiffusionModule(nn.Module):
    """Alg. 20, EDM preconditioning: ``D(x, t) = c_skip x + c_out F(c_in x, c_noise(t))`` with
    ``c_in = 1 / sqrt(t^2 + sigma_data^2)``, ``c_skip = sigma_data^2 / (sigma_data^2 + t^2)``,
    ``c_out = sigma_data t / sqrt(sigma_data^2 + t^2)``.

    ``forward(x_noisy [B, S, A, 3], t_hat [B, S], feats, s_inputs [B, N, C_si],
    s_trunk [B, N, C_s], z_trunk [B, N, N, C_z]) -> x_denoised [B, S, A, 3]`` in
    ``coordinate_dtype(x_noisy.dtype)`` (fp32 under bf16 autocast): the scaling and the skip
    connection run without autocast; ``F`` (the network) runs under the caller's autocast and its
    ``r_update`` is cast to the coordinate dtype.
    """

    def __init__(self, cfg, atom_cfg, relpos_cfg, c_s: int, c_z: int, c_s_inputs: int,
                 use_checkpoint: bool = False) -> None:
        super().__init__()
        self.sigma_data = cfg.sigma_data
        self.conditioning = DiffusionConditioning(cfg, c_s, c_z, c_s_inputs, relpos_cfg)
        self.encoder = AtomAttentionEncoder(atom_cfg, cfg.c_token, c_s, c_z)
        self.layer_norm_s = LayerNorm(c_s)
        self.linear_s = Linear(c_s, cfg.c_token, bias=False)
        self.transformer = DiffusionTransformer(
            cfg.c_token, c_s, c_z, cfg.no_blocks, cfg.no_heads, cfg.transition_n, use_checkpoint
        )
        self.layer_norm_a = LayerNorm(cfg.c_token)
        self.decoder = AtomAttentionDecoder(atom_cfg, cfg.c_token)
        # Inference: the network runs on the samples in groups of this many (None: all at once)
        self.sample_group_size: int | None = None

    def forward(
        self,
        x_noisy: torch.Tensor,
        t_hat: torch.Tensor,
        feats: dict[str, torch.Tensor],
        s_inputs: torch.Tensor,
        s_trunk: torch.Tensor,
        z_trunk: torch.Tensor,
        context: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``context``: :meth:`prepare` of the same features and trunk outputs, made once for
        every step of a sampler (None: made here).

        The samples are independent (the context, computed once, is shared), so with
        ``sample_group_size`` G the network runs on ``[B, G, A, 3]`` at a time and the groups'
        outputs are concatenated: the same numbers, with the activations of G samples (the atom
        transformers' ``[B, G, A, C_atom]``, the transformer's ``[B, G, N, C_token]`` and its
        attention logits ``[B, G, H, N, N]``) instead of all S."""
        G = self.sample_group_size
        if G is None or x_noisy.shape[1] <= G:
            return self._denoise(x_noisy, t_hat, feats, s_inputs, s_trunk, z_trunk, context)
        if context is None:
            context = self.prepare(feats, s_inputs, s_trunk, z_trunk)  # once for every group
        return torch.cat([
            self._denoise(x_noisy[:, i: i + G], t_hat[:, i: i + G], feats, s_inputs, s_trunk,
                          z_trunk, context)
            for i in range(0, x_noisy.shape[1], G)], dim=1)  # [B, S, A, 3]

    def prepare(self, feats: dict[str, torch.Tensor], s_inputs: torch.Tensor,
                s_trunk: torch.Tensor, z_trunk: torch.Tensor) -> dict[str, torch.Tensor]:
        """The network's terms that depend on the features and the trunk, not on the noise:
        one sampler's steps and samples share them, so a prediction makes them once instead of
        once per step (Boltz-2 and Protenix's shared-variable cache do the same).

        * ``z_cond [B, N, N, C_z]``, ``s_cond [B, N, C_s]``: Alg. 21 lines 1-3 and 4;
        * ``atom_c [B, A, C_atom]``, ``atom_p [B, K, n_q, n_k, C_ap]``: the encoder's atom
          conditioning (Alg. 5 but the noisy positions);
        * ``encoder_bias``, ``decoder_bias [no_blocks, B, K, H, n_q, n_k]``: the atom
          transformers' attention biases from ``atom_p``;
        * ``token_bias [no_blocks, B, H, N, N]``: the diffusion transformer's pair biases, left
          out with an inference chunk size or AutoChunk (long inputs: each block makes its own
          per step, in chunks, as without a context; all of them would take ``no_blocks`` x the
          bias's memory).

        Training leaves the context out (one call per trunk pass: nothing to share), so the
        checkpointed blocks keep recomputing their biases instead of holding them."""
        z_cond = self.conditioning.pair(feats, z_trunk)
        atom = self.encoder.condition(feats, s_trunk, z_cond)
        context = {
            "z_cond": z_cond, "s_cond": self.conditioning.single_trunk(s_inputs, s_trunk),
            "atom_c": atom["c"], "atom_p": atom["p"],
            "encoder_bias": self.encoder.transformer.pair_biases(atom["p"]),
            "decoder_bias": self.decoder.transformer.pair_biases(atom["p"]),
        }
        plain = isinstance(self.transformer, DiffusionTransformer)  # (not AutoChunk's wrapper)
        if plain and all(block.chunk_size is None for block in self.transformer.blocks):
            context["token_bias"] = self.transformer.pair_biases(z_cond)
        return context

    def _denoise(self, x_noisy, t_hat, feats, s_inputs, s_trunk, z_trunk, context):
        sd = self.sigma_data
        dtype = coordinate_dtype(x_noisy.dtype)
        with _exact(x_noisy.device):
            x = x_noisy.to(dtype)
            t_hat = t_hat.to(dtype)
            t = t_hat[..., None, None]  # [B, S, 1, 1]
            c_in = torch.rsqrt(t.square() + sd**2)
            r_noisy = (x * c_in).to(self.linear_s.weight.dtype)  # the network's input
        ctx = {} if context is None else context
        s = self.conditioning.single(t_hat, s_inputs, s_trunk, ctx.get("s_cond"))  # [B, S, N, C_s]
        z = ctx["z_cond"] if "z_cond" in ctx else self.conditioning.pair(feats, z_trunk)
        atom = ({"c": ctx["atom_c"], "p": ctx["atom_p"], "biases": ctx["encoder_bias"]}
                if "atom_c" in ctx else None)
        a, q_skip, c_skip, p_skip, win = self.encoder(feats, r_noisy, s_trunk, z, atom)
        a = a + self.linear_s(self.layer_norm_s(s))  # [B, S, N, C_token]
        mask = feats["token_mask"].to(a.dtype)
        if "token_bias" in ctx:
            a = self.transformer.forward_biases(a, s, z, mask, ctx["token_bias"])
        else:  # (also an AutoChunk-wrapped transformer)
            a = self.transformer(a, s, z, mask)
        a = self.layer_norm_a(a)
        r_update = self.decoder(a, q_skip, c_skip, p_skip, win, feats["atom_to_token"],
                                ctx.get("decoder_bias"))
        with _exact(x.device):
            c_skip_t = sd**2 / (sd**2 + t.square())
            c_out = sd * t * c_in
            return c_skip_t * x + c_out * r_update.to(dtype)


def noise_schedule(cfg, sigma_data: float, no_steps: int | None = None,
                   dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Section 3.7.1: ``c_tau = sigma_data (s_max^(1/p) + tau (s_min^(1/p) - s_max^(1/p)))^p`` for
    ``tau = 0, 1/T, ..., 1``; ``[T + 1]``, decreasing from ``sigma_data s_max``."""
    steps = cfg.no_steps if no_steps is None else no_steps
    tau = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64)
    p = cfg.rho
    hi, lo = cfg.s_max ** (1 / p), cfg.s_min ** (1 / p)
    c = sigma_data * (hi + tau * (lo - hi)) ** p
    return c.to(dtype=dtype, device=device)


def random_rotation(shape: tuple[int, ...], generator: torch.Generator | None = None,
                    dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Uniformly random rotation matrices ``[*shape, 3, 3]`` (normalised Gaussian quaternions)."""
    q = torch.randn(*shape, 4, generator=generator, dtype=torch.float64, device=device)
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    rot = torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1)
    return rot.unflatten(-1, (3, 3)).to(dtype)


def centre_random_augmentation(
    x: torch.Tensor, atom_mask: torch.Tensor, s_trans: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Alg. 19: centre ``x [B, S, A, 3]`` on its (masked) mean, then a random rotation and a
    translation ``s_trans N(0, I)`` per sample. In ``coordinate_dtype(x.dtype)``, autocast off
    (the rotation einsum would otherwise run in bf16)."""
    dtype = coordinate_dtype(x.dtype)
    with _exact(x.device):
        rot = random_rotation(x.shape[:2], generator, dtype, x.device)  # [B, S, 3, 3]
        trans = s_trans * torch.randn(*x.shape[:2], 1, 3, generator=generator,
                                      dtype=torch.float64, device=x.device).to(dtype)
    return apply_augmentation(x, atom_mask, rot, trans)


def apply_augmentation(x: torch.Tensor, atom_mask: torch.Tensor, rot: torch.Tensor,
                       trans: torch.Tensor) -> torch.Tensor:
    """Alg. 19 with its random draws given: ``x [B, S, A, 3]`` centred on its masked mean,
    rotated by ``rot [B, S, 3, 3]`` and moved by ``trans [B, S, 1, 3]``."""
    dtype = coordinate_dtype(x.dtype)
    with _exact(x.device):
        x = x.to(dtype)
        w = atom_mask.to(dtype)[:, None, :, None]  # [B, 1, A, 1]
        mean = (x * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True).clamp_min(1.0)
        return torch.einsum("bsij,bsaj->bsai", rot, x - mean) + trans


Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sampler_schedule(cfg, sigma_data: float, no_steps: int | None = None
                     ) -> tuple[float, list[tuple[float, float, float]]]:
    """The host-side numbers of Alg. 18: ``(c_0, [(t_hat, xi_scale, step_coef)] per step)`` with
    ``t_hat = c_{tau-1} (gamma + 1)``, the noise scale ``xi_scale = lambda sqrt(t_hat^2 -
    c_{tau-1}^2)`` and the update scale ``step_coef = eta (c_tau - t_hat)`` (Python floats, so
    a step reads them as scalars or, in a captured graph, as tensors)."""
    # noise_schedule's formula in Python floats (float64): host numbers, no tensor op, so the
    # schedule is the same whether tensors are real or FakeTensors (fold-train's dry run)
    n = cfg.no_steps if no_steps is None else no_steps
    hi, lo = cfg.s_max ** (1 / cfg.rho), cfg.s_min ** (1 / cfg.rho)
    c = [sigma_data * (hi + (i / n) * (lo - hi)) ** cfg.rho for i in range(n + 1)]
    steps = []
    for prev, cur in zip(c[:-1], c[1:]):
        gamma = cfg.gamma_0 if cur > cfg.gamma_min else 0.0
        t_hat = prev * (gamma + 1)
        steps.append((t_hat, cfg.noise_scale * math.sqrt(max(t_hat**2 - prev**2, 0.0)),
                      cfg.step_scale * (cur - t_hat)))
    return c[0], steps


def draw_sampler_noise(shape: tuple[int, int, int], generator: torch.Generator | None,
                       device, s_trans: float = 1.0, augment: bool = True
                       ) -> dict[str, torch.Tensor]:
    """The random draws of one sampler step for ``x [B, S, A, 3]`` (``shape = (B, S, A)``), in the
    order :func:`sample_diffusion` draws them: the augmentation's ``rot [B, S, 3, 3]`` and
    ``trans [B, S, 1, 3]`` (when ``augment``), then ``noise [B, S, A, 3]``; coordinate dtype."""
    dtype = coordinate_dtype(torch.get_default_dtype())
    out = {}
    with _exact(torch.device(device)):
        if augment:
            out["rot"] = random_rotation(shape[:2], generator, dtype, device)
            out["trans"] = s_trans * torch.randn(*shape[:2], 1, 3, generator=generator,
                                                 dtype=torch.float64, device=device).to(dtype)
        out["noise"] = torch.randn(*shape, 3, generator=generator, dtype=torch.float64,
                                   device=device).to(dtype)
    return out


def sampler_step(
    denoise: Denoiser, x: torch.Tensor, atom_mask: torch.Tensor, noise: torch.Tensor,
    t_hat, xi_scale, step_coef, rot: torch.Tensor | None = None,
    trans: torch.Tensor | None = None,
) -> torch.Tensor:
    """One step of Alg. 18 (lines 3-9) with its draws given: augment ``x [B, S, A, 3]`` (when
    ``rot``/``trans`` are given; else ``x`` is used as is), add ``xi_scale noise``, denoise at
    ``t_hat``, move by ``step_coef (x_noisy - x_denoised) / t_hat``. ``t_hat``, ``xi_scale``,
    ``step_coef``: floats (:func:`sampler_schedule`) or 0-dim tensors (a captured step reads
    them from static buffers). Padded atoms stay 0."""
    B, S = x.shape[:2]
    dtype, device = x.dtype, x.device
    with _exact(device):
        if rot is not None:
            x = apply_augmentation(x, atom_mask, rot, trans).to(dtype)
        w = atom_mask.to(dtype)[:, None, :, None]
        x_noisy = (x + xi_scale * noise) * w
        if isinstance(t_hat, torch.Tensor):
            t = t_hat.to(dtype).expand(B, S)
        else:
            t = torch.full((B, S), t_hat, dtype=dtype, device=device)
    x_denoised = denoise(x_noisy, t)
    with _exact(device):
        delta = (x_noisy - x_denoised.to(dtype)) / t_hat
        return (x_noisy + step_coef * delta) * w


def sample_diffusion(
    denoise: Denoiser,
    atom_mask: torch.Tensor,
    no_samples: int,
    cfg,
    sigma_data: float,
    no_steps: int | None = None,
    generator: torch.Generator | None = None,
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    s_trans: float = 1.0,
) -> torch.Tensor:
    """Alg. 18, the EDM sampler with AF3's stochasticity (``gamma_0``, ``gamma_min``, noise scale
    ``lambda``, step scale ``eta``). ``denoise(x_noisy [B, S, A, 3], t_hat [B, S]) -> x_denoised``;
    ``augment(x)`` replaces the centre-random augmentation of each step (tests). Returns
    ``[B, S, A, 3]`` (padded atoms 0) in ``coordinate_dtype`` of the default dtype: the noise,
    augmentation and updates run without autocast, only ``denoise`` under the caller's autocast
    (its output is cast back to the coordinate dtype). Each step is :func:`sampler_step` on the
    draws of :func:`draw_sampler_noise`."""
    B, A = atom_mask.shape
    dtype, device = coordinate_dtype(torch.get_default_dtype()), atom_mask.device
    c0, steps = sampler_schedule(cfg, sigma_data, no_steps)
    with _exact(device):
        x = c0 * torch.randn(B, no_samples, A, 3, generator=generator,
                             dtype=torch.float64, device=device).to(dtype)
    for t_hat, xi_scale, step_coef in steps:
        if augment is not None:
            with _exact(device):
                x = augment(x).to(dtype)
        draws = draw_sampler_noise((B, no_samples, A), generator, device, s_trans,
                                   augment=augment is None)
        x = sampler_step(denoise, x, atom_mask, draws["noise"], t_hat, xi_scale, step_coef,
                         draws.get("rot"), draws.get("trans"))
    return x


def sample_training_noise(shape: tuple[int, ...], sigma_data: float, p_mean: float, p_std: float,
                          generator: torch.Generator | None = None,
                          dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Section 3.7.1: ``sigma = sigma_data exp(p_mean + p_std N(0, 1))``."""
    n = torch.randn(shape, generator=generator, dtype=torch.float64, device=device)
    return (sigma_data * torch.exp(p_mean + p_std * n)).to(dtype)


def noisy_training_samples(
    x_gt: torch.Tensor, atom_mask: torch.Tensor, no_samples: int, cfg,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The diffusion batch of one trunk pass (section 3.7.1): ``no_samples`` copies of the ground
    truth ``x_gt [B, A, 3]``, each centred, randomly rotated and translated (Alg. 19), with noise
    ``sigma`` added. Returns ``(x_gt_aug [B, S, A, 3], x_noisy [B, S, A, 3], sigma [B, S])``, all
    in ``coordinate_dtype(x_gt.dtype)`` (fp32 for bf16 input or under autocast)."""
    B = x_gt.shape[0]
    dtype = coordinate_dtype(x_gt.dtype)
    with _exact(x_gt.device):
        x = x_gt.to(dtype).unsqueeze(1).expand(B, no_samples, *x_gt.shape[1:])
        x = centre_random_augmentation(x, atom_mask, cfg.augment_translation, generator)
        w = atom_mask.to(dtype)[:, None, :, None]
        x = x * w
        sigma = sample_training_noise((B, no_samples), cfg.sigma_data, cfg.p_mean, cfg.p_std,
                                      generator, dtype, x.device)
        eps = torch.randn(x.shape, generator=generator, dtype=torch.float64, device=x.device)
        x_noisy = x + sigma[..., None, None] * eps.to(dtype) * w
    return x, x_noisy, sigma
