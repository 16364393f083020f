"""Fixed sample sizes and sampling probabilities for the AF2 per-step transforms.

The numbers come from the AlphaFold2 supplement (Jumper et al. 2021):

* Table 4 ("Training protocol"): initial training crops to ``N_res`` = 256 residues with
  ``N_clust`` = 128 MSA cluster centres, ``N_extra`` = 1024 extra sequences and ``N_templ`` = 4
  templates; fine-tuning uses 384, 512, 5120 and 4.
* Section 1.2.7 (masked MSA): 15% of the cluster-centre positions are replaced; of those 10% by a
  uniformly random amino acid, 10% by a draw from the MSA profile, 10% left unchanged and 70% by
  the mask token.
* Algorithm 1 / section 1.2.6 (MSA block deletion): 5 blocks, each 30% of the MSA depth.
* Section 1.10 (recycling): ``N_cycle`` = 4, i.e. 3 recycling iterations plus the final pass.
* Section 1.11.5: clamped FAPE in 90% of the training samples.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataPreset", "PRESETS", "get_preset"]


@dataclass(frozen=True)
class DataPreset:
    """Sizes and probabilities of one training/inference sample (see the module docstring).

    ``max_recycling_iters`` counts the recycling iterations; a sample carries
    ``n_cycle = max_recycling_iters + 1`` copies (the leading ``R`` dim of the sample schema), one
    per forward pass, each with its own MSA sampling and BERT masking.
    """

    name: str
    n_res: int
    n_clust: int
    n_extra: int
    n_templ: int
    max_recycling_iters: int = 3
    # Masked MSA (supplement 1.2.7).
    masked_msa_replace_fraction: float = 0.15
    masked_msa_uniform_prob: float = 0.1
    masked_msa_profile_prob: float = 0.1
    masked_msa_same_prob: float = 0.1
    # MSA block deletion (supplement Alg. 1), training only.
    msa_block_deletion: bool = True
    msa_fraction_per_block: float = 0.3
    msa_num_blocks: int = 5
    # Training samples a random number of templates in [0, min(hits, n_templ)].
    subsample_templates: bool = True
    # Probability that a training sample uses clamped FAPE (supplement 1.11.5).
    clamped_fape_prob: float = 0.9

    def __post_init__(self) -> None:
        for field in ("n_res", "n_clust"):
            if getattr(self, field) < 1:
                raise ValueError(f"DataPreset {self.name!r}: {field} must be >= 1")
        for field in ("n_extra", "n_templ", "max_recycling_iters", "msa_num_blocks"):
            if getattr(self, field) < 0:
                raise ValueError(f"DataPreset {self.name!r}: {field} must be >= 0")
        probs = (
            self.masked_msa_uniform_prob,
            self.masked_msa_profile_prob,
            self.masked_msa_same_prob,
        )
        if min(probs) < 0 or sum(probs) > 1:
            raise ValueError(
                f"DataPreset {self.name!r}: masked-MSA probabilities must be >= 0 and sum to <= 1"
            )
        for field in ("masked_msa_replace_fraction", "msa_fraction_per_block", "clamped_fape_prob"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"DataPreset {self.name!r}: {field} must be in [0, 1]")

    @property
    def n_cycle(self) -> int:
        """Total forward passes per sample (``R``): recycling iterations + the final pass."""
        return self.max_recycling_iters + 1


PRESETS: dict[str, DataPreset] = {
    # AF2 supplement Table 4, "Initial training".
    "af2_initial": DataPreset("af2_initial", n_res=256, n_clust=128, n_extra=1024, n_templ=4),
    # AF2 supplement Table 4, "Fine-tuning".
    "af2_finetune": DataPreset("af2_finetune", n_res=384, n_clust=512, n_extra=5120, n_templ=4),
    # Small sizes for CPU tests and the demo; same probabilities as AF2.
    "tiny": DataPreset("tiny", n_res=64, n_clust=16, n_extra=32, n_templ=2, max_recycling_iters=2),
}


def get_preset(preset: DataPreset | str) -> DataPreset:
    """Return ``preset`` itself or the named entry of :data:`PRESETS`."""
    if isinstance(preset, DataPreset):
        return preset
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(
            f"unknown AF2 data preset {preset!r}; expected one of {sorted(PRESETS)}"
        ) from None
