"""The AlphaFold2 model (supplement Alg. 2): embedders, template embedding, extra MSA stack,
Evoformer, structure module and heads, with recycling (1.10).

``AlphaFold2(config).forward(batch)`` takes a batch of fold-data ``SAMPLE_FEATURES`` (tensors
``[B, R, ...]``) and runs ``N_cycle`` passes (R unless ``num_recycles`` says otherwise): passes
``0 .. N_cycle - 2`` without gradients, each feeding the next the first MSA row, the pair and the
pseudo-beta positions of its structure (Alg. 32); the last pass with gradients.
"""

from __future__ import annotations

import torch
from fold_data import residue_constants as rc
from torch import nn

from fold_model.af2.config import AlphaFold2Config
from fold_model.af2.embedders import (
    ExtraMsaEmbedder,
    InputEmbedder,
    RecyclingEmbedder,
    build_extra_msa_feat,
)
from fold_model.af2.evoformer import EvoformerStack, ExtraMsaStack, offload_to_host
from fold_model.af2.heads import AuxiliaryHeads
from fold_model.af2.structure_module import StructureModule
from fold_model.af2.template import TemplateEmbedder
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = ["AlphaFold2", "pseudo_beta"]

_GLY = rc.restype_order["G"]
_CA = rc.atom_order["CA"]
_CB = rc.atom_order["CB"]


def pseudo_beta(aatype: torch.Tensor, atom37: torch.Tensor) -> torch.Tensor:
    """CB position (CA for glycine): ``[*, N_res]``, ``[*, N_res, 37, 3]`` -> ``[*, N_res, 3]``."""
    is_gly = (aatype == _GLY)[..., None]
    return torch.where(is_gly, atom37[..., _CA, :], atom37[..., _CB, :])


class AlphaFold2(nn.Module):
    """AlphaFold2 (Jumper et al. 2021, supplement Alg. 2).

    ``forward(batch, num_recycles=None) -> dict`` with ``msa [B, N_clust, N_res, C_m]``,
    ``pair [B, N_res, N_res, C_z]``, ``single [B, N_res, C_s]``, ``sm`` (structure-module
    outputs), ``final_atom_positions [B, N_res, 37, 3]``, ``final_atom_mask [B, N_res, 37]``
    and the auxiliary head outputs, all of the last recycling pass.
    """

    def __init__(self, config: AlphaFold2Config, comm: AxialComm = IDENTITY_COMM) -> None:
        super().__init__()
        self.config = config
        self.msa_offload = False  # inference: MSA representations in host memory
        evo, emb, rec = config.evoformer, config.embedder, config.recycling
        ckpt, order = config.checkpoint_blocks, config.block_order
        self.input_embedder = InputEmbedder(
            emb.tf_dim, emb.msa_dim, evo.c_m, evo.c_z, emb.relpos_k
        )
        self.recycling_embedder = RecyclingEmbedder(
            evo.c_m, evo.c_z, rec.min_bin, rec.max_bin, rec.no_bins, rec.inf
        )
        self.template_embedder = (
            TemplateEmbedder(config.template, evo.c_m, evo.c_z, ckpt, comm)
            if config.template.enabled else None
        )
        if config.extra_msa.enabled:
            self.extra_msa_embedder = ExtraMsaEmbedder(emb.extra_msa_dim, config.extra_msa.c_e)
            self.extra_msa_stack = ExtraMsaStack(config.extra_msa, evo.c_z, order, ckpt, comm)
        self.evoformer = EvoformerStack(evo, order, ckpt, comm)
        self.set_uncheckpointed_blocks(evoformer=config.uncheckpointed_blocks,
                                       extra_msa=config.uncheckpointed_extra_msa_blocks)
        self.structure_module = StructureModule(config.structure_module, evo.c_s, evo.c_z)
        self.aux_heads = AuxiliaryHeads(config.heads, c_m=evo.c_m, c_z=evo.c_z, c_s=evo.c_s)
        self.set_chunk_size(config.chunk_size)

    def _block_stacks(self) -> dict[str, nn.Module]:
        stacks = {"evoformer": self.evoformer}
        if self.config.extra_msa.enabled:
            stacks["extra_msa"] = self.extra_msa_stack
        return stacks

    def checkpointed_stacks(self) -> dict[str, int]:
        """``{stack: number of blocks}`` of the stacks that run their blocks under activation
        checkpointing (``evoformer``, ``extra_msa``), the ones whose last blocks
        :meth:`set_uncheckpointed_blocks` can exempt."""
        return {name: len(s.blocks) for name, s in self._block_stacks().items()
                if s.checkpoint_blocks}

    def uncheckpointed_blocks(self) -> dict[str, int]:
        """``{stack: k}``: the last ``k`` blocks of each stack run without checkpointing."""
        return {name: s.uncheckpointed_blocks for name, s in self._block_stacks().items()}

    def set_uncheckpointed_blocks(self, **counts: int) -> None:
        """With checkpointing on, the last ``counts[stack]`` blocks of ``evoformer`` /
        ``extra_msa`` keep their activations instead of being recomputed in backward (faster
        where memory allows; every block of a stack saves the same bytes, so which ones does
        not matter). 0 checkpoints every block; stacks not named keep their setting."""
        stacks = self._block_stacks()
        for name, k in counts.items():
            if name not in stacks:
                raise ValueError(f"unknown stack {name!r}; stacks are {sorted(stacks)}")
            n = len(stacks[name].blocks)
            if not 0 <= k <= n:
                raise ValueError(f"uncheckpointed blocks of {name!r} must be in 0..{n}, got {k}")
            stacks[name].uncheckpointed_blocks = int(k)

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """Chunk attention rows, outer-product-mean rows and triangle-multiplication rows
        (inference memory saving; ``None`` turns chunking off)."""
        self.chunk_size = chunk_size
        self.evoformer.set_chunk_size(chunk_size)
        if self.config.extra_msa.enabled:
            self.extra_msa_stack.set_chunk_size(chunk_size)
        if self.template_embedder is not None:
            self.template_embedder.set_chunk_size(chunk_size)

    def set_msa_offload(self, offload: bool) -> None:
        """Inference: the Evoformer's and the extra MSA stack's MSA representations wait in
        host memory while each block's pair updates run (the same numbers). Set it before
        AutoChunk wraps the stacks (the wrapped code is traced with it)."""
        self.msa_offload = bool(offload)
        self.evoformer.set_msa_offload(offload)
        if self.config.extra_msa.enabled:
            self.extra_msa_stack.set_msa_offload(offload)

    def set_comm(self, comm: AxialComm) -> None:
        """Install an axial communicator (DAP) in every stack."""
        self.evoformer.set_comm(comm)
        if self.config.extra_msa.enabled:
            self.extra_msa_stack.set_comm(comm)
        if self.template_embedder is not None:
            self.template_embedder.pair_stack.set_comm(comm)

    def sample_num_recycles(self, generator: torch.Generator | None = None) -> int:
        """N_cycle for a training step: uniform in ``1 .. max_recycling_iters + 1`` (1.10; the
        same draw must be used on every data-parallel rank)."""
        high = self.config.max_recycling_iters + 1
        return int(torch.randint(1, high + 1, (), generator=generator))

    @property
    def dtype(self) -> torch.dtype:
        return self.input_embedder.linear_tf_m.weight.dtype

    def iteration(
        self,
        feats: dict[str, torch.Tensor],
        prev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ) -> tuple[dict, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """One pass of Alg. 2 on one recycling slice (``[B, ...]`` features).

        ``prev = (m_1 [B, N_res, C_m], z [B, N_res, N_res, C_z], x [B, N_res, 3])`` or None for
        the first pass (zeros). Returns the outputs and the (detached) values to recycle.
        """
        dtype = self.dtype
        evo = self.config.evoformer
        seq_mask = feats["seq_mask"].to(dtype)  # [B, N_res]
        pair_mask = seq_mask[..., :, None] * seq_mask[..., None, :]  # [B, N_res, N_res]
        msa_mask = feats["msa_mask"].to(dtype)  # [B, N_clust, N_res]
        n_clust = msa_mask.shape[-2]

        m, z = self.input_embedder(
            feats["target_feat"].to(dtype), feats["residue_index"], feats["msa_feat"].to(dtype)
        )
        if prev is None:
            n_res = seq_mask.shape[-1]
            prev = (
                m.new_zeros(*m.shape[:-3], n_res, evo.c_m),
                z.new_zeros(z.shape),
                m.new_zeros(*m.shape[:-3], n_res, 3, dtype=torch.float32),
            )
        dm, dz = self.recycling_embedder(prev[0].to(dtype), prev[1].to(dtype), prev[2])
        m = torch.cat([m[..., :1, :, :] + dm.unsqueeze(-3), m[..., 1:, :, :]], dim=-3)
        z = z + dz
        del dm, dz  # not kept alive through the stacks (a pair-sized tensor)

        if self.template_embedder is not None and feats["template_mask"].shape[-1] > 0:
            templ = self.template_embedder(
                {k: v for k, v in feats.items() if k.startswith("template_")}, z, pair_mask
            )
            z = z + templ["template_pair_embedding"]
            if "template_single_embedding" in templ:
                # Alg. 2 line 7: template torsion rows join the MSA (N_clust + N_templ rows).
                m = torch.cat([m, templ["template_single_embedding"]], dim=-3)
                msa_mask = torch.cat([msa_mask, templ["template_single_mask"].to(dtype)], dim=-2)
            del templ

        offload = self.msa_offload
        if offload:  # the MSA waits in host memory (the stacks load it block by block)
            m = offload_to_host(m)
        if self.config.extra_msa.enabled:
            extra_feat = build_extra_msa_feat(
                feats["extra_msa"], feats["extra_has_deletion"].to(dtype),
                feats["extra_deletion_value"].to(dtype),
            )
            a = self.extra_msa_embedder(extra_feat)  # [B, N_extra, N_res, C_e]
            if offload:
                del extra_feat
                a = offload_to_host(a)
            z = self.extra_msa_stack(a, z, feats["extra_msa_mask"].to(dtype), pair_mask)
            del a

        m, z, s = self.evoformer(m, z, msa_mask, pair_mask)
        aatype = feats["aatype"].long()
        sm = self.structure_module(s, z, aatype, seq_mask)
        outputs = {
            "msa": m[..., :n_clust, :, :],
            "pair": z,
            "single": s,
            "sm": sm,
            "final_atom_positions": sm["final_atom_positions"],
            "final_atom_mask": sm["final_atom_mask"],
        }
        outputs.update(self.aux_heads(outputs, seq_mask))
        x = pseudo_beta(aatype, sm["final_atom_positions"]).float()
        return outputs, (m[..., 0, :, :].detach(), z.detach(), x.detach())

    def forward(
        self, batch: dict[str, torch.Tensor], num_recycles: int | None = None
    ) -> dict:
        n_avail = batch["aatype"].shape[1]  # [B, R, N_res]
        n_cycle = n_avail if num_recycles is None else num_recycles
        if not 1 <= n_cycle <= n_avail:
            raise ValueError(
                f"num_recycles={n_cycle} passes requested but the batch has R={n_avail} "
                f"recycling copies of its features (need 1 <= passes <= R)"
            )
        grad = torch.is_grad_enabled()
        prev = None
        outputs: dict = {}
        for cycle in range(n_cycle):
            feats = {k: v[:, cycle] for k, v in batch.items()
                     if isinstance(v, torch.Tensor) and v.dim() >= 2}
            final = cycle == n_cycle - 1
            with torch.set_grad_enabled(grad and final):
                outputs, prev = self.iteration(feats, prev)
        return outputs
