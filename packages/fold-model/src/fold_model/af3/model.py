"""AlphaFold3 (supplement Alg. 1): input embedding, recycled trunk (templates, MSA module,
Pairformer), the diffusion module (trained on ``no_samples`` noised copies of the ground truth per
trunk pass, sampled with the EDM sampler at inference), distogram and confidence heads.

``AlphaFold3(config)(feats)`` takes a batch of fold-data AF3 samples (``SAMPLE_FEATURES`` with a
leading batch dim, as torch tensors). In training mode it returns the denoised samples and the
ground-truth copies they were made from, plus the confidence head's logits on a mini-rollout;
:meth:`AlphaFold3.loss` turns these into the AF3 loss. In eval mode it samples structures.
"""

from __future__ import annotations

import torch
from torch import nn

from fold_model.af3.confidence import (
    ConfidenceHead,
    confidence_loss,
    confidence_targets,
    expected_value,
)
from fold_model.af3.config import AlphaFold3Config
from fold_model.af3.diffusion import (
    DiffusionModule,
    coordinate_dtype,
    noisy_training_samples,
    sample_diffusion,
)
from fold_model.af3.embedders import InputFeatureEmbedder, RelativePositionEncoding
from fold_model.af3.loss import LossPairs, diffusion_loss, distogram_loss
from fold_model.af3.msa_module import MSAModule, msa_features
from fold_model.af3.pairformer import PairformerStack, SubLayers
from fold_model.af3.template import TemplateEmbedder
from fold_model.layers import LayerNorm, Linear
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["AlphaFold3"]


class AlphaFold3(nn.Module):
    """The AF3 network. ``forward(feats, no_cycles=None, generator=None) -> dict``."""

    def __init__(self, config: AlphaFold3Config, comm: AxialComm = IDENTITY_COMM) -> None:
        super().__init__()
        cfg = self.config = config
        c_s, c_z, c_si = cfg.c_s, cfg.c_z, cfg.c_s_inputs
        ckpt = cfg.checkpoint
        self.input_embedder = InputFeatureEmbedder(cfg.atom, cfg.c_token_input)
        self.linear_s_init = Linear(c_si, c_s, bias=False)
        c_z_init = c_s if cfg.z_init_from == "s_init" else c_si
        self.linear_z_i = Linear(c_z_init, c_z, bias=False)
        self.linear_z_j = Linear(c_z_init, c_z, bias=False)
        self.relpos = RelativePositionEncoding(c_z, cfg.relpos.r_max, cfg.relpos.s_max)
        self.linear_token_bonds = Linear(1, c_z, bias=False)
        self.layer_norm_z_prev = LayerNorm(c_z)
        self.linear_z_prev = Linear(c_z, c_z, bias=False)
        self.layer_norm_s_prev = LayerNorm(c_s)
        self.linear_s_prev = Linear(c_s, c_s, bias=False)
        self.template_embedder = (
            TemplateEmbedder(cfg.template, c_z, comm, ckpt) if cfg.template.enabled else None
        )
        self.msa_module = MSAModule(cfg.msa, c_z, c_si, comm, ckpt)
        self.pairformer = PairformerStack(cfg.pairformer, c_s, c_z, comm, ckpt)
        self.diffusion = DiffusionModule(cfg.diffusion, cfg.atom, cfg.relpos, c_s, c_z, c_si, ckpt)
        self.distogram_head = Linear(c_z, cfg.loss.distogram_no_bins, init="final")
        self.confidence_head = ConfidenceHead(cfg) if cfg.confidence.enabled else None
        if cfg.chunk_size is not None:
            self.set_chunk_size(cfg.chunk_size)
        self._uncheckpointed = {"pairformer": 0, "diffusion": 0}
        self.set_checkpointing(cfg.checkpoint, cfg.checkpoint_blocks, cfg.checkpoint_atoms)
        self.set_uncheckpointed_blocks(pairformer=cfg.uncheckpointed_pairformer_blocks,
                                       diffusion=cfg.uncheckpointed_diffusion_blocks)

    def set_checkpointing(self, sublayers: bool, blocks: bool = False, atoms: bool = False
                          ) -> None:
        """Activation checkpointing while training: ``sublayers`` recomputes the trunk blocks'
        sub-layers and the diffusion transformer's blocks; with ``blocks`` the trunk recomputes
        whole blocks instead (:class:`~fold_model.af3.pairformer.SubLayers`); ``atoms``
        recomputes the diffusion module's atom transformer blocks. The blocks exempted by
        :meth:`set_uncheckpointed_blocks` stay exempt."""
        for m in self.modules():
            if isinstance(m, SubLayers):
                m.use_checkpoint, m.checkpoint_blocks = sublayers, blocks
        self.diffusion.transformer.use_checkpoint = sublayers
        for coder in (self.diffusion.encoder, self.diffusion.decoder):
            coder.transformer.use_checkpoint = atoms
        self._checkpointing = sublayers
        self.set_uncheckpointed_blocks(**self._uncheckpointed)

    def checkpointed_stacks(self) -> dict[str, int]:
        """``{stack: number of blocks}`` of the stacks whose blocks run under activation
        checkpointing (``pairformer``: the trunk's; ``diffusion``: the diffusion transformer),
        the ones whose last blocks :meth:`set_uncheckpointed_blocks` can exempt."""
        if not self._checkpointing:
            return {}
        return {"pairformer": len(self.pairformer.blocks),
                "diffusion": len(self.diffusion.transformer.blocks)}

    def uncheckpointed_blocks(self) -> dict[str, int]:
        """``{stack: k}``: the last ``k`` blocks of each stack run without checkpointing."""
        return dict(self._uncheckpointed)

    def set_uncheckpointed_blocks(self, **counts: int) -> None:
        """With checkpointing on, the last ``counts[stack]`` blocks of the trunk ``pairformer``
        and of the ``diffusion`` transformer keep their activations instead of being recomputed
        in backward (faster where memory allows; a stack's blocks all save the same bytes). 0
        checkpoints every block; stacks not named keep their setting."""
        sizes = {"pairformer": len(self.pairformer.blocks),
                 "diffusion": len(self.diffusion.transformer.blocks)}
        for name, k in counts.items():
            if name not in sizes:
                raise ValueError(f"unknown stack {name!r}; stacks are {sorted(sizes)}")
            if not 0 <= k <= sizes[name]:
                raise ValueError(f"uncheckpointed blocks of {name!r} must be in "
                                 f"0..{sizes[name]}, got {k}")
            self._uncheckpointed[name] = int(k)
        first_plain = sizes["pairformer"] - self._uncheckpointed["pairformer"]
        for i, block in enumerate(self.pairformer.blocks):
            block.use_checkpoint = self._checkpointing and i < first_plain
        self.diffusion.transformer.uncheckpointed_blocks = self._uncheckpointed["diffusion"]

    def _trunk_stacks(self) -> list[nn.Module]:
        stacks: list[nn.Module] = [self.msa_module, self.pairformer]
        if self.template_embedder is not None:
            stacks.append(self.template_embedder)
        return stacks

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Inference-time chunking of the trunk's pair updates (template embedder, MSA module,
        Pairformer), the confidence Pairformer and its PAE / PDE heads when their logits are
        reduced in the head (rows), the diffusion's pair conditioning (rows), and the diffusion
        transformer's pair bias (rows) and attention (samples)."""
        for m in self._trunk_stacks():
            m.set_chunk_size(chunk_size)
        if self.confidence_head is not None:
            self.confidence_head.pairformer.set_chunk_size(chunk_size)
        self.diffusion.transformer.set_chunk_size(chunk_size)
        self.set_pair_row_blocks(chunk_size)

    def set_pair_row_blocks(self, rows: int | None) -> None:
        """Inference: the per-pair steps outside the stacks, the diffusion's pair conditioning
        and the confidence head's PAE / PDE logits (reduced in the head), ``rows`` pair rows at
        a time (None: all). Part of :meth:`set_chunk_size`; alone where the stacks are chunked
        otherwise (AutoChunk)."""
        if self.confidence_head is not None:
            self.confidence_head.chunk_size = rows
        self.diffusion.conditioning.chunk_size = rows

    def set_sample_group_size(self, group_size: int | None) -> None:
        """Inference: the diffusion network and the confidence head run on the samples in
        groups of ``group_size`` (None: all at once). The sampler's random draws are made for
        all samples at every step, as without groups, so the structures are the same."""
        if group_size is not None and group_size < 1:
            raise ValueError(f"sample group size must be >= 1, got {group_size}")
        self.diffusion.sample_group_size = group_size
        if self.confidence_head is not None:
            self.confidence_head.sample_group_size = group_size

    def set_comm(self, comm: AxialComm) -> None:
        """Put the trunk stacks on the axial seam (DAP)."""
        for m in self._trunk_stacks():
            m.set_comm(comm)

    def sample_no_cycles(self, generator: torch.Generator | None = None) -> int:
        """Training: the number of trunk passes drawn uniformly from 1..``no_cycles``."""
        n = self.config.no_cycles
        return int(torch.randint(1, n + 1, (1,), generator=generator).item())

    # -- trunk --------------------------------------------------------------------------------
    def trunk_inputs(self, feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Alg. 1 lines 1-5, what every trunk pass reads: ``s_inputs [B, N, C_si]``,
        ``s_init [B, N, C_s]``, ``z_init [B, N, N, C_z]``, ``msa [B, N_msa, N, C_msa]`` (its
        features), ``msa_mask [B, N_msa, N]``, ``token_mask [B, N]``, ``pair_mask [B, N, N]``."""
        dtype = self.linear_s_init.weight.dtype
        s_inputs = self.input_embedder(feats)  # [B, N, C_si]
        s_init = self.linear_s_init(s_inputs)
        z_src = s_init if self.config.z_init_from == "s_init" else s_inputs
        z_init = self.linear_z_i(z_src).unsqueeze(-2) + self.linear_z_j(z_src).unsqueeze(-3)
        z_init = z_init + self.relpos(feats).to(dtype)
        z_init = z_init + self.linear_token_bonds(feats["token_bonds"].to(dtype)[..., None])
        token_mask = feats["token_mask"].to(dtype)
        msa = msa_features(feats["msa"], feats["has_deletion"].to(dtype),
                           feats["deletion_value"].to(dtype))
        return {"s_inputs": s_inputs, "s_init": s_init, "z_init": z_init, "msa": msa,
                "msa_mask": feats["msa_mask"].to(dtype), "token_mask": token_mask,
                "pair_mask": token_mask[..., :, None] * token_mask[..., None, :]}

    def trunk_cycle(
        self, feats: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
        s: torch.Tensor, z: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Alg. 1 lines 7-13, one trunk pass: the recycled ``s [B, N, C_s]``, ``z [B, N, N, C_z]``
        (detached here) -> the new ``(s, z)``. ``inputs``: :meth:`trunk_inputs`."""
        pair_mask, token_mask = inputs["pair_mask"], inputs["token_mask"]
        z = inputs["z_init"] + self.linear_z_prev(self.layer_norm_z_prev(z.detach()))
        if self.template_embedder is not None:
            z = z + self.template_embedder(feats, z, pair_mask)
        z = self.msa_module(inputs["msa"], z, inputs["s_inputs"], inputs["msa_mask"], pair_mask,
                            token_mask)
        s = inputs["s_init"] + self.linear_s_prev(self.layer_norm_s_prev(s.detach()))
        return self.pairformer(s, z, token_mask, pair_mask)

    def trunk(
        self, feats: dict[str, torch.Tensor], no_cycles: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Alg. 1 lines 1-14: ``(s_inputs [B, N, C_si], s [B, N, C_s], z [B, N, N, C_z])``.
        Only the last pass keeps gradients (the recycled ``s``, ``z`` are detached)."""
        inputs = self.trunk_inputs(feats)
        s, z = torch.zeros_like(inputs["s_init"]), torch.zeros_like(inputs["z_init"])
        for cycle in range(no_cycles):
            last = cycle == no_cycles - 1
            with torch.set_grad_enabled(last and torch.is_grad_enabled()):
                s, z = self.trunk_cycle(feats, inputs, s, z)
        return inputs["s_inputs"], s, z

    # -- diffusion ----------------------------------------------------------------------------
    def sample(
        self,
        feats: dict[str, torch.Tensor],
        s_inputs: torch.Tensor,
        s: torch.Tensor,
        z: torch.Tensor,
        no_samples: int | None = None,
        no_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Alg. 18 with this model's diffusion module: ``[B, S, A, 3]``."""
        cfg = self.config
        context = self.diffusion.prepare(feats, s_inputs, s, z)  # noise-independent: once

        def denoise(x_noisy: torch.Tensor, t_hat: torch.Tensor) -> torch.Tensor:
            return self.diffusion(x_noisy, t_hat, feats, s_inputs, s, z, context)

        return sample_diffusion(
            denoise, feats["atom_mask"], no_samples or cfg.sampler.no_samples, cfg.sampler,
            cfg.diffusion.sigma_data, no_steps, generator,
            s_trans=cfg.diffusion.augment_translation,
        )

    def forward(
        self,
        feats: dict[str, torch.Tensor],
        no_cycles: int | None = None,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        cfg = self.config
        if no_cycles is None:
            no_cycles = self.sample_no_cycles(generator) if self.training else cfg.no_cycles
        s_inputs, s, z = self.trunk(feats, no_cycles)
        out: dict[str, torch.Tensor] = {
            "s_inputs": s_inputs, "single": s, "pair": z,
            "distogram_logits": self.distogram_head(z + z.transpose(-2, -3)),
        }
        if self.training:
            # One trunk pass, no_samples diffusion samples (section 3.7.1).
            gt_mask = feats["atom_mask"] * feats["atom_resolved"]
            # Coordinates in >= fp32 whatever the autocast dtype of s (bf16: ~0.2 A steps).
            x_gt, x_noisy, sigma = noisy_training_samples(
                feats["atom_positions"].to(coordinate_dtype(self.linear_s_init.weight.dtype)),
                gt_mask, cfg.diffusion.no_samples,
                cfg.diffusion, generator,
            )
            out["x_denoised"] = self.diffusion(x_noisy, sigma, feats, s_inputs, s, z)
            out["x_gt_augmented"], out["sigma"] = x_gt, sigma
            if self.confidence_head is not None:
                with torch.no_grad():  # the mini-rollout (section 4.3)
                    x_roll = self.sample(feats, s_inputs, s, z, 1, cfg.confidence.rollout_steps,
                                         generator)
                out["x_rollout"] = x_roll
                out["confidence_logits"] = self.confidence_head(feats, s_inputs, s, z, x_roll)
            return out
        x = self.sample(feats, s_inputs, s, z, generator=generator)
        out["x_pred"] = x
        if self.confidence_head is not None:
            logits = self.confidence_head(feats, s_inputs, s, z, x)
            out["confidence_logits"] = logits
            out["plddt"] = expected_value(logits["plddt"], 100.0)  # [B, S, A]
            out["pae"] = expected_value(logits["pae"], cfg.confidence.pae_max)
            out["pde"] = expected_value(logits["pde"], cfg.confidence.pde_max)
        return out

    def loss(
        self, out: dict[str, torch.Tensor], feats: dict[str, torch.Tensor],
        pairs: LossPairs | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``alpha_diffusion L_diffusion + alpha_distogram L_distogram + alpha_confidence
        L_confidence`` (section 4) and the parts (detached). ``pairs``: the diffusion loss's
        atom-pair lists (:func:`~fold_model.af3.loss.loss_pair_lists`), built from ``feats``
        when None."""
        cfg = self.config
        lc = cfg.loss
        parts = diffusion_loss(out["x_denoised"], out["x_gt_augmented"], out["sigma"], feats, lc,
                               cfg.diffusion.sigma_data, pairs)
        parts["distogram"] = distogram_loss(out["distogram_logits"], feats, lc.distogram_min_bin,
                                            lc.distogram_max_bin).mean()
        total = lc.diffusion_weight * parts["diffusion"] + lc.distogram_weight * parts["distogram"]
        if "confidence_logits" in out:
            targets = confidence_targets(feats, out["x_rollout"], cfg)
            parts.update(confidence_loss(out["confidence_logits"], targets, lc))
            total = total + lc.confidence_weight * parts["confidence"]
        parts = {k: v.detach() for k, v in parts.items()}
        parts["loss"] = total.detach()
        return total, parts
