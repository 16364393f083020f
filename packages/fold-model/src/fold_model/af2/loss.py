"""AF2 training losses (supplement 1.9, Algorithms 26-29)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LossConfig"]


@dataclass
class LossConfig:
    """Loss weights and constants; defaults are the AF2 initial-training preset (1.9, Table 4).

    ``L = 0.5 L_FAPE + 0.5 L_aux + 0.3 L_dist + 2.0 L_msa + 0.01 L_conf``; fine-tuning adds
    ``0.01 L_exp_resolved + 1.0 L_viol`` (and optionally 0.1 L_pTM). ``L_aux`` is the mean over the
    structure-module layers of the backbone FAPE plus the torsion loss
    ``L_chi + 0.02 L_anglenorm`` (Alg. 27).
    """

    fape_weight: float = 0.5  # final-layer all-atom FAPE (side-chain frames included)
    aux_weight: float = 0.5  # layer-mean backbone FAPE + torsion loss
    distogram_weight: float = 0.3
    masked_msa_weight: float = 2.0
    plddt_weight: float = 0.01
    experimentally_resolved_weight: float = 0.0  # 0.01 in fine-tuning
    violation_weight: float = 0.0  # 1.0 in fine-tuning
    tm_weight: float = 0.0  # 0.1 in fine-tuning when the pTM head is on

    # FAPE (1.9.2, Alg. 28)
    fape_clamp_distance: float = 10.0
    fape_length_scale: float = 10.0
    fape_eps: float = 1e-4
    sidechain_clamp_distance: float = 10.0
    sidechain_length_scale: float = 10.0
    # Torsion loss (1.9.1, Alg. 27)
    chi_weight: float = 1.0
    angle_norm_weight: float = 0.02
    # Distogram (1.9.8)
    distogram_no_bins: int = 64
    distogram_min_bin: float = 2.3125
    distogram_max_bin: float = 21.6875
    # pLDDT (1.9.6): lDDT-Ca with 15 A inclusion radius, only on 0.1 <= resolution <= 3 A
    plddt_no_bins: int = 50
    plddt_cutoff: float = 15.0
    min_resolution: float = 0.1
    max_resolution: float = 3.0
    # Structural violations (1.9.11)
    violation_tolerance_factor: float = 12.0
    clash_overlap_tolerance: float = 1.5
    # pTM (1.9.7)
    tm_no_bins: int = 64
    tm_max_bin: float = 31.0
    eps: float = 1e-8

    @classmethod
    def initial_training(cls) -> LossConfig:
        """AF2 initial training (supplement 1.9, Table 4, 'initial training' row)."""
        return cls()

    @classmethod
    def finetuning(cls, ptm: bool = False) -> LossConfig:
        """AF2 fine-tuning: adds experimentally-resolved (0.01) and violation (1.0) terms."""
        return cls(
            experimentally_resolved_weight=0.01,
            violation_weight=1.0,
            tm_weight=0.1 if ptm else 0.0,
        )
