"""AlphaFold3 configuration dataclasses and presets.

Sizes follow the AlphaFold3 supplement (Abramson et al. 2024): input embedder and atom attention
(section 3.1-3.2, Alg. 2-7), template embedder (3.5, Alg. 16), MSA module (3.3, Alg. 8-10),
Pairformer (3.6, Alg. 17), diffusion module (3.7, Alg. 18-26), losses and their weights (4.1-4.4,
Table 6), confidence head (4.3, Alg. 31), recycling (3.4). Per-head sizes are per head.

``config(name, **overrides)`` builds a preset (``af3``, ``af3_finetune``, ``tiny``); overrides name
top-level fields (``chunk_size=64``) or nested ones with a double underscore
(``pairformer__no_blocks=2``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fold_model.config_overrides import build_config

__all__ = [
    "AtomAttentionConfig",
    "RelPosConfig",
    "TemplateConfig",
    "MSAModuleConfig",
    "PairformerConfig",
    "DiffusionConfig",
    "SamplerConfig",
    "ConfidenceConfig",
    "LossConfig",
    "AlphaFold3Config",
    "PRESETS",
    "config",
]


@dataclass
class AtomAttentionConfig:
    """Atom attention encoder/decoder (Alg. 5-7): sequence-local attention in windows of
    ``n_queries`` queries around centres 15.5, 47.5, ... with ``n_keys`` keys each."""

    c_atom: int = 128
    c_atompair: int = 16
    no_blocks: int = 3
    no_heads: int = 4
    n_queries: int = 32
    n_keys: int = 128
    max_atoms_per_token: int = 24  # per-atom heads (pLDDT, resolved) index atoms within a token
    # Keys of the atom cross-attention get their own AdaLN (AF3's code), of the raw atom
    # activations ("input", AF3) or of the queries' AdaLN output ("query", Protenix 2.0).
    key_norm: str = "input"


@dataclass
class RelPosConfig:
    """Relative position encoding (Alg. 3)."""

    r_max: int = 32
    s_max: int = 2


@dataclass
class TemplateConfig:
    """Template embedder (Alg. 16): a 2-block pair-only Pairformer per template."""

    enabled: bool = True
    c_t: int = 64
    no_blocks: int = 2
    c_hidden_mul: int = 64
    c_hidden_tri_att: int = 16
    no_heads_tri_att: int = 4
    transition_n: int = 2
    dropout: float = 0.25
    distogram_min_bin: float = 3.25
    distogram_max_bin: float = 50.75
    distogram_no_bins: int = 39


@dataclass
class MSAModuleConfig:
    """MSA module (Alg. 8-10)."""

    c_m: int = 64
    no_blocks: int = 4
    c_hidden_opm: int = 32
    c_hidden_pair_avg: int = 32
    no_heads_pair_avg: int = 8
    c_hidden_mul: int = 128
    c_hidden_tri_att: int = 32
    no_heads_tri_att: int = 4
    transition_n: int = 4
    msa_dropout: float = 0.15
    pair_dropout: float = 0.25


@dataclass
class PairformerConfig:
    """Pairformer stack (Alg. 17)."""

    no_blocks: int = 48
    c_hidden_mul: int = 128
    c_hidden_tri_att: int = 32
    no_heads_tri_att: int = 4
    no_heads_single: int = 16
    transition_n: int = 4
    dropout: float = 0.25


@dataclass
class DiffusionConfig:
    """Diffusion module (Alg. 20-26) and its training noise (section 3.7.1)."""

    sigma_data: float = 16.0
    c_token: int = 768
    no_blocks: int = 24
    no_heads: int = 16
    c_fourier: int = 256
    conditioning_transition_n: int = 2
    transition_n: int = 2
    no_samples: int = 48  # diffusion batch per trunk pass in training
    p_mean: float = -1.2  # training noise: sigma = sigma_data * exp(p_mean + p_std * N(0, 1))
    p_std: float = 1.5
    augment_translation: float = 1.0  # Angstrom (Alg. 19, s_trans)


@dataclass
class SamplerConfig:
    """EDM sampler (Alg. 18) and its noise schedule (section 3.7.1)."""

    no_steps: int = 200
    s_max: float = 160.0
    s_min: float = 4e-4
    rho: float = 7.0
    gamma_0: float = 0.8
    gamma_min: float = 1.0
    noise_scale: float = 1.003
    step_scale: float = 1.5
    no_samples: int = 5  # samples per prediction at inference


@dataclass
class ConfidenceConfig:
    """Confidence head (Alg. 31) and the mini-rollout used to train it (section 4.3)."""

    enabled: bool = True
    no_blocks: int = 4
    # Lower edges of the pair-distance one-hot (AF3's code: DistogramFeaturesConfig, 3.25 to
    # 50.75 A in 39 bins; the last bin unbounded).
    distance_min_bin: float = 3.25
    distance_max_bin: float = 50.75
    distance_no_bins: int = 39
    # "af3" (AF3's code) or "protenix" (Protenix 2.0: LN(clamp(s_trunk, +-512)) before the
    # Pairformer, the raw distance embedded beside its one-hot, PDE = Linear(LN(z + z^T))).
    variant: str = "af3"
    plddt_no_bins: int = 50
    pae_no_bins: int = 64
    pae_max: float = 32.0
    pde_no_bins: int = 64
    pde_max: float = 32.0
    resolved_no_bins: int = 2
    rollout_steps: int = 20


@dataclass
class LossConfig:
    """Loss weights (section 4, Table 6 for the per-stage weights)."""

    diffusion_weight: float = 4.0
    distogram_weight: float = 3e-2
    confidence_weight: float = 1e-4
    bond_weight: float = 0.0  # 0 in initial training, 1 in fine-tuning
    smooth_lddt_weight: float = 1.0
    alpha_dna: float = 5.0
    alpha_rna: float = 5.0
    alpha_ligand: float = 10.0
    distogram_min_bin: float = 2.0
    distogram_max_bin: float = 22.0
    distogram_no_bins: int = 64
    plddt_weight: float = 1.0
    pae_weight: float = 1.0
    pde_weight: float = 1.0
    resolved_weight: float = 1.0


@dataclass
class AlphaFold3Config:
    """The whole AF3 model (Alg. 1)."""

    c_s: int = 384
    c_z: int = 128
    c_token_input: int = 384  # atom encoder output width of the input embedder (Alg. 2)
    restype_dim: int = 32
    atom: AtomAttentionConfig = field(default_factory=AtomAttentionConfig)
    relpos: RelPosConfig = field(default_factory=RelPosConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    msa: MSAModuleConfig = field(default_factory=MSAModuleConfig)
    pairformer: PairformerConfig = field(default_factory=PairformerConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    no_cycles: int = 4  # trunk passes at inference; drawn from 1..no_cycles in training
    checkpoint: bool = True  # activation checkpointing per sub-layer while training
    # With checkpoint: recompute whole trunk blocks (Pairformer, MSA module, template and
    # confidence blocks) instead of sub-layers: one saved pair per block instead of five.
    checkpoint_blocks: bool = False
    # Recompute the diffusion module's atom transformer blocks (their activations carry the
    # 48 samples) in backward while training.
    checkpoint_atoms: bool = False
    # With checkpoint: this many of the trunk Pairformer's last blocks, and of the diffusion
    # transformer's last blocks, keep their activations instead of being recomputed (faster
    # where memory allows; fold-train's activation_checkpointing=auto plans them).
    uncheckpointed_pairformer_blocks: int = 0
    uncheckpointed_diffusion_blocks: int = 0
    chunk_size: int | None = None  # inference-only chunking of the pair updates
    # What the initial pair is projected from (Alg. 1 line 3): "s_inputs" (the supplement and
    # AF3's code) or "s_init" (Protenix 2.0: LinearNoBias(s_init_i) + LinearNoBias(s_init_j)).
    z_init_from: str = "s_inputs"

    @property
    def c_s_inputs(self) -> int:
        """Width of ``s_inputs``: atom-encoder tokens, restype, profile, deletion_mean (Alg. 2)."""
        return self.c_token_input + 2 * self.restype_dim + 1

    def __post_init__(self) -> None:
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {self.chunk_size}")
        for name, k, n in (
            ("uncheckpointed_pairformer_blocks", self.uncheckpointed_pairformer_blocks,
             self.pairformer.no_blocks),
            ("uncheckpointed_diffusion_blocks", self.uncheckpointed_diffusion_blocks,
             self.diffusion.no_blocks),
        ):
            if not 0 <= k <= n:
                raise ValueError(f"{name} must be in 0..{n} (the stack's blocks), got {k}")
        if self.no_cycles < 1:
            raise ValueError(f"no_cycles must be >= 1, got {self.no_cycles}")
        for name, value, allowed in (("z_init_from", self.z_init_from, ("s_inputs", "s_init")),
                                     ("confidence.variant", self.confidence.variant,
                                      ("af3", "protenix"))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.atom.key_norm not in ("input", "query"):
            raise ValueError(f"atom.key_norm must be 'input' or 'query', got "
                             f"{self.atom.key_norm!r}")
        if self.atom.n_keys < self.atom.n_queries or self.atom.n_keys % 2:
            raise ValueError(
                f"atom attention: n_keys ({self.atom.n_keys}) must be even and >= n_queries "
                f"({self.atom.n_queries})"
            )
        for name, c, h in (
            ("single attention", self.c_s, self.pairformer.no_heads_single),
            ("diffusion transformer", self.diffusion.c_token, self.diffusion.no_heads),
            ("atom transformer", self.atom.c_atom, self.atom.no_heads),
        ):
            if c % h:
                raise ValueError(f"{name}: width {c} is not divisible by {h} heads")


def _af3() -> AlphaFold3Config:
    """AF3 initial training (supplement sections 3-4; Table 6 stage 1: bond loss off)."""
    return AlphaFold3Config()


def _af3_finetune() -> AlphaFold3Config:
    """AF3 fine-tuning stages (Table 6): the bond loss switched on."""
    cfg = AlphaFold3Config()
    cfg.loss.bond_weight = 1.0
    return cfg


def _tiny() -> AlphaFold3Config:
    """A small AF3 for CPU tests: every module present, sizes small and mutually distinct so that
    a transposed dim fails loudly."""
    return AlphaFold3Config(
        c_s=24,
        c_z=16,
        c_token_input=20,
        atom=AtomAttentionConfig(
            c_atom=12, c_atompair=6, no_blocks=1, no_heads=2, n_queries=8, n_keys=16,
        ),
        template=TemplateConfig(
            c_t=10, no_blocks=1, c_hidden_mul=6, c_hidden_tri_att=4, no_heads_tri_att=2,
        ),
        msa=MSAModuleConfig(
            c_m=14, no_blocks=1, c_hidden_opm=5, c_hidden_pair_avg=4, no_heads_pair_avg=2,
            c_hidden_mul=7, c_hidden_tri_att=4, no_heads_tri_att=2, transition_n=2,
        ),
        pairformer=PairformerConfig(
            no_blocks=2, c_hidden_mul=9, c_hidden_tri_att=4, no_heads_tri_att=2,
            no_heads_single=3, transition_n=2,
        ),
        diffusion=DiffusionConfig(
            c_token=30, no_blocks=2, no_heads=3, c_fourier=16, no_samples=4,
        ),
        sampler=SamplerConfig(no_steps=8, no_samples=1),
        confidence=ConfidenceConfig(no_blocks=1, rollout_steps=4),
        no_cycles=2,
        checkpoint=False,
    )


PRESETS = {"af3": _af3, "af3_finetune": _af3_finetune, "tiny": _tiny}


def config(name: str, **overrides: Any) -> AlphaFold3Config:
    """Preset ``name`` (``af3``, ``af3_finetune``, ``tiny``) with ``overrides`` applied.

    ``config("tiny", pairformer__no_blocks=3, chunk_size=4)``.
    """
    return build_config("AF3", PRESETS, name, overrides)
