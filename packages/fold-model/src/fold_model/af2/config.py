"""AlphaFold2 configuration dataclasses and presets.

Sizes follow the AF2 supplement (Jumper et al. 2021, Suppl. Methods 1.5-1.11; the Evoformer
section 1.6, extra MSA stack 1.7.2, templates 1.7.1, recycling 1.10, training 1.11) and agree with
OpenFold's ``config.py``. Per-head sizes are per head (the supplement's ``c``).

``config(name, **overrides)`` builds a preset; overrides name top-level fields (``chunk_size=64``)
or nested ones with a double underscore (``evoformer__no_blocks=2``).

Note: ``fold_model.af2.config`` is the *function* (re-exported by the package); import the
dataclasses with ``from fold_model.af2.config import AlphaFold2Config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from fold_model.af2.heads import HeadsConfig
from fold_model.af2.loss import LossConfig
from fold_model.af2.structure_module import StructureModuleConfig
from fold_model.config_overrides import build_config

__all__ = [
    "BlockOrder",
    "EmbedderConfig",
    "RecyclingConfig",
    "TemplateConfig",
    "ExtraMsaConfig",
    "EvoformerConfig",
    "AlphaFold2Config",
    "PRESETS",
    "config",
]

BlockOrder = Literal["af2", "multimer", "parallel"]


@dataclass
class EmbedderConfig:
    """Input embedder (Alg. 3) and relative position encoding (Alg. 4)."""

    tf_dim: int = 22  # target_feat: 20 amino acids + X + between-segment bit (Table 1)
    msa_dim: int = 49  # msa_feat (Table 1)
    extra_msa_dim: int = 25  # one-hot(extra_msa, 23) + has_deletion + deletion_value (1.7.2)
    relpos_k: int = 32  # clip window: 2 * 32 + 1 = 65 relative-position bins


@dataclass
class RecyclingConfig:
    """Recycling embedder (Alg. 32). Distance bins as in the AF2 code / OpenFold
    (``prev_pos_linear``): 15 bins with lower edges 3.25 .. 20.75 A, the last one open."""

    min_bin: float = 3.25
    max_bin: float = 20.75
    no_bins: int = 15
    inf: float = 1e8


@dataclass
class TemplateConfig:
    """Template embedding (supplement 1.7.1, Alg. 2 lines 7-9, Alg. 16, 17)."""

    enabled: bool = True
    embed_angles: bool = True  # template torsion features as extra MSA rows (Alg. 2 line 7)
    c_t: int = 64
    no_blocks: int = 2  # template pair stack
    c_hidden_tri_att: int = 16
    no_heads_tri_att: int = 4
    c_hidden_tri_mul: int = 64
    pair_transition_n: int = 2
    dropout_rate: float = 0.25
    c_hidden_pointwise: int = 16  # AF2 code: key_dim 64 over 4 heads
    no_heads_pointwise: int = 4
    c_pair_feat: int = 88  # 39 distogram + 1 mask + 2 x 22 aatype + 3 unit vector + 1 mask
    c_angle_feat: int = 57  # 22 aatype + 14 sin/cos + 14 alt sin/cos + 7 mask
    distogram_min_bin: float = 3.25
    distogram_max_bin: float = 50.75
    distogram_no_bins: int = 39
    # supplement Table 1 has the unit vector; AF2's released configuration
    # (use_template_unit_vector=False) zeroes these 3 channels, and its weights expect zeros
    use_unit_vector: bool = False
    eps: float = 1e-6


@dataclass
class ExtraMsaConfig:
    """Extra MSA stack (Alg. 18): Evoformer-like blocks with global column attention (Alg. 19)."""

    enabled: bool = True
    c_e: int = 64
    no_blocks: int = 4
    c_hidden_msa_att: int = 8
    no_heads_msa: int = 8
    c_hidden_opm: int = 32
    c_hidden_mul: int = 128
    c_hidden_pair_att: int = 32
    no_heads_pair: int = 4
    transition_n: int = 4
    msa_dropout: float = 0.15
    pair_dropout: float = 0.25
    # outer product mean: AF2's code (and its released weights) divides the output bias by the
    # pair count with the rest, (W o + b) / (eps + n); False: the supplement's Linear(mean)
    opm_divide_bias: bool = True


@dataclass
class EvoformerConfig:
    """Evoformer stack (supplement 1.6, Alg. 6-15)."""

    c_m: int = 256
    c_z: int = 128
    c_s: int = 384
    no_blocks: int = 48
    c_hidden_msa_att: int = 32
    no_heads_msa: int = 8
    c_hidden_opm: int = 32
    c_hidden_mul: int = 128
    c_hidden_pair_att: int = 32
    no_heads_pair: int = 4
    transition_n: int = 4
    msa_dropout: float = 0.15
    pair_dropout: float = 0.25
    # outer product mean: AF2's code (and its released weights) divides the output bias by the
    # pair count with the rest, (W o + b) / (eps + n); False: the supplement's Linear(mean)
    opm_divide_bias: bool = True


@dataclass
class AlphaFold2Config:
    """The whole AF2 model (Alg. 2)."""

    evoformer: EvoformerConfig = field(default_factory=EvoformerConfig)
    extra_msa: ExtraMsaConfig = field(default_factory=ExtraMsaConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    recycling: RecyclingConfig = field(default_factory=RecyclingConfig)
    structure_module: StructureModuleConfig = field(default_factory=StructureModuleConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    block_order: BlockOrder = "af2"
    checkpoint_blocks: bool = True  # activation checkpointing per block while training
    # with checkpoint_blocks: this many of the Evoformer stack's last blocks keep their
    # activations (less recompute where memory allows; fold-train's
    # activation_checkpointing=auto plans it from the device's memory)
    uncheckpointed_blocks: int = 0
    # the same for the extra MSA stack's last blocks
    uncheckpointed_extra_msa_blocks: int = 0
    chunk_size: int | None = None  # inference-only chunking of attention / OPM / triangle mult
    max_recycling_iters: int = 3  # N_cycle = 1 + iterations; drawn from 1..4 in training (1.10)

    def __post_init__(self) -> None:
        if self.block_order not in ("af2", "multimer", "parallel"):
            raise ValueError(
                f"block_order must be 'af2', 'multimer' or 'parallel', got {self.block_order!r}"
            )
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {self.chunk_size}")
        if not 0 <= self.uncheckpointed_blocks <= self.evoformer.no_blocks:
            raise ValueError(f"uncheckpointed_blocks must be in 0..{self.evoformer.no_blocks} "
                             f"(the Evoformer's blocks), got {self.uncheckpointed_blocks}")
        if not 0 <= self.uncheckpointed_extra_msa_blocks <= self.extra_msa.no_blocks:
            raise ValueError(
                f"uncheckpointed_extra_msa_blocks must be in 0..{self.extra_msa.no_blocks} (the "
                f"extra MSA stack's blocks), got {self.uncheckpointed_extra_msa_blocks}")


def _af2_initial() -> AlphaFold2Config:
    """AF2 initial training (supplement 1.11.1, Table 4; sizes 1.5-1.8)."""
    return AlphaFold2Config(loss=LossConfig.initial_training())


def _af2_finetune() -> AlphaFold2Config:
    """AF2 fine-tuning (supplement 1.11.1, Table 4): same network, violation and
    experimentally-resolved losses switched on."""
    return AlphaFold2Config(loss=LossConfig.finetuning())


def _tiny() -> AlphaFold2Config:
    """A few-thousand-parameter AF2 for CPU tests: every module present, all sizes small and
    mutually distinct so that a transposed dim fails loudly."""
    return AlphaFold2Config(
        evoformer=EvoformerConfig(
            c_m=16, c_z=12, c_s=20, no_blocks=2, c_hidden_msa_att=4, no_heads_msa=2,
            c_hidden_opm=6, c_hidden_mul=10, c_hidden_pair_att=4, no_heads_pair=3,
            transition_n=2,
        ),
        extra_msa=ExtraMsaConfig(
            c_e=8, no_blocks=1, c_hidden_msa_att=4, no_heads_msa=2, c_hidden_opm=6,
            c_hidden_mul=10, c_hidden_pair_att=4, no_heads_pair=3, transition_n=2,
        ),
        template=TemplateConfig(
            c_t=10, no_blocks=1, c_hidden_tri_att=4, no_heads_tri_att=2, c_hidden_tri_mul=6,
            c_hidden_pointwise=4, no_heads_pointwise=2,
        ),
        structure_module=_tiny_structure_module(),
        heads=_tiny_heads(),
        checkpoint_blocks=False,
        max_recycling_iters=1,
    )


def _tiny_structure_module() -> StructureModuleConfig:
    names = {f.name for f in dataclasses.fields(StructureModuleConfig)}
    small = {"c_ipa": 4, "c_resnet": 8, "no_heads_ipa": 2, "no_qk_points": 2,
             "no_v_points": 3, "no_blocks": 2}
    return StructureModuleConfig(**{k: v for k, v in small.items() if k in names})


def _tiny_heads() -> HeadsConfig:
    names = {f.name for f in dataclasses.fields(HeadsConfig)}
    small = {"lddt_c_hidden": 8}
    return HeadsConfig(**{k: v for k, v in small.items() if k in names})


PRESETS = {
    "af2_initial": _af2_initial,
    "af2_finetune": _af2_finetune,
    "tiny": _tiny,
}


def config(name: str, **overrides: Any) -> AlphaFold2Config:
    """Preset ``name`` (``af2_initial``, ``af2_finetune``, ``tiny``) with ``overrides`` applied.

    ``config("tiny", block_order="parallel", evoformer__no_blocks=3)``.
    """
    return build_config("AF2", PRESETS, name, overrides)
