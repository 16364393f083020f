"""AF2 output heads (supplement 1.9) and the confidence metrics derived from them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fold_model.layers import LayerNorm

__all__ = [
    "HeadsConfig",
    "DistogramHead",
    "MaskedMSAHead",
    "PerResidueLDDTCaPredictor",
    "ExperimentallyResolvedHead",
    "TMScoreHead",
    "AuxiliaryHeads",
    "compute_plddt",
    "compute_predicted_aligned_error",
    "compute_tm",
]


@dataclass
class HeadsConfig:
    """Head sizes; defaults from the AF2 supplement 1.9.5-1.9.10 and 1.9.7 (pTM)."""

    distogram_no_bins: int = 64  # 1.9.8: 64 bins, 2.3125 .. 21.6875 A
    distogram_first_break: float = 2.3125
    distogram_last_break: float = 21.6875
    masked_msa_c_out: int = 23  # 20 amino acids + X + gap + mask (1.9.9)
    lddt_no_bins: int = 50  # 1.9.6, Alg. 29
    lddt_c_hidden: int = 128
    experimentally_resolved_c_out: int = 37  # atom37 (1.9.10)
    tm_enabled: bool = False  # pTM / PAE head (1.9.7), used only in fine-tuned models
    tm_no_bins: int = 64
    tm_max_bin: float = 31.0


def _zero_init(linear: nn.Linear) -> nn.Linear:
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


class DistogramHead(nn.Module):
    """Distogram logits from the pair representation, symmetrised (1.9.8)."""

    def __init__(self, c_z: int, no_bins: int = 64) -> None:
        super().__init__()
        self.linear = _zero_init(nn.Linear(c_z, no_bins))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z ``[*, N, N, c_z]`` -> logits ``[*, N, N, no_bins]``, symmetric in (i, j)."""
        logits = self.linear(z)
        return logits + logits.transpose(-2, -3)


class MaskedMSAHead(nn.Module):
    """Masked-MSA logits over 23 classes from the MSA representation (1.9.9)."""

    def __init__(self, c_m: int, c_out: int = 23) -> None:
        super().__init__()
        self.linear = _zero_init(nn.Linear(c_m, c_out))

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        """m ``[*, N_clust, N, c_m]`` -> ``[*, N_clust, N, c_out]``."""
        return self.linear(m)


class PerResidueLDDTCaPredictor(nn.Module):
    """pLDDT head (Alg. 29): LayerNorm, two ReLU layers, logits over lDDT-Ca bins."""

    def __init__(self, c_s: int, c_hidden: int = 128, no_bins: int = 50) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c_s)
        self.linear_1 = nn.Linear(c_s, c_hidden)
        self.linear_2 = nn.Linear(c_hidden, c_hidden)
        self.linear_3 = _zero_init(nn.Linear(c_hidden, no_bins))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        """s ``[*, N, c_s]`` -> ``[*, N, no_bins]``."""
        s = F.relu(self.linear_1(self.layer_norm(s)))
        s = F.relu(self.linear_2(s))
        return self.linear_3(s)


class ExperimentallyResolvedHead(nn.Module):
    """Per-atom logits that the atom is resolved in the experiment (1.9.10)."""

    def __init__(self, c_s: int, c_out: int = 37) -> None:
        super().__init__()
        self.linear = _zero_init(nn.Linear(c_s, c_out))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        """s ``[*, N, c_s]`` -> ``[*, N, 37]``."""
        return self.linear(s)


class TMScoreHead(nn.Module):
    """Predicted aligned error logits from the pair representation (1.9.7)."""

    def __init__(self, c_z: int, no_bins: int = 64) -> None:
        super().__init__()
        self.linear = _zero_init(nn.Linear(c_z, no_bins))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z ``[*, N, N, c_z]`` -> ``[*, N, N, no_bins]`` (not symmetric: frame i, atom j)."""
        return self.linear(z)


def compute_plddt(logits: torch.Tensor) -> torch.Tensor:
    """Expected lDDT-Ca in [0, 100] from logits ``[*, N, no_bins]`` -> ``[*, N]``."""
    no_bins = logits.shape[-1]
    centers = (
        torch.arange(no_bins, dtype=logits.dtype, device=logits.device) + 0.5
    ) / no_bins  # [no_bins]
    return 100.0 * torch.sum(torch.softmax(logits, dim=-1) * centers, dim=-1)


def _aligned_error_bin_centers(
    max_bin: float, no_bins: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    # no_bins - 1 breaks from 0 to max_bin; the last bin (beyond max_bin) gets centre + step.
    breaks = torch.linspace(0.0, max_bin, no_bins - 1, dtype=dtype, device=device)
    step = breaks[1] - breaks[0]
    centers = breaks + step / 2
    return torch.cat([centers, (centers[-1] + step)[None]])  # [no_bins]


def compute_predicted_aligned_error(
    logits: torch.Tensor, max_bin: float = 31.0, no_bins: int = 64
) -> dict[str, torch.Tensor]:
    """PAE from pTM-head logits ``[*, N, N, no_bins]`` (1.9.7).

    Returns ``aligned_confidence_probs`` ``[*, N, N, no_bins]``, ``predicted_aligned_error``
    ``[*, N, N]`` (expected error in Angstrom) and ``max_predicted_aligned_error`` (scalar).
    """
    probs = torch.softmax(logits, dim=-1)
    centers = _aligned_error_bin_centers(max_bin, no_bins, logits.dtype, logits.device)
    return {
        "aligned_confidence_probs": probs,
        "predicted_aligned_error": torch.sum(probs * centers, dim=-1),
        "max_predicted_aligned_error": centers[-1],
    }


def compute_tm(
    logits: torch.Tensor,
    residue_weights: torch.Tensor | None = None,
    max_bin: float = 31.0,
    no_bins: int = 64,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Predicted TM-score (pTM, 1.9.7 eq. 40) from logits ``[*, N, N, no_bins]`` -> ``[*]``.

    ``residue_weights`` ``[*, N]`` (e.g. the sequence mask) select the residues scored; the TM
    normaliser d0 uses their count (clipped at 19 as in AF2). The score is the best over the
    choice of the aligned frame i.
    """
    if residue_weights is None:
        residue_weights = logits.new_ones(logits.shape[:-2])
    centers = _aligned_error_bin_centers(max_bin, no_bins, logits.dtype, logits.device)
    n_clip = torch.clamp(residue_weights.sum(-1), min=19.0)  # [*]
    d0 = 1.24 * (n_clip - 15.0) ** (1.0 / 3.0) - 1.8  # [*]
    tm_per_bin = 1.0 / (1.0 + (centers / d0[..., None]) ** 2)  # [*, no_bins]
    probs = torch.softmax(logits, dim=-1)
    tm_term = torch.sum(probs * tm_per_bin[..., None, None, :], dim=-1)  # [*, N, N]
    normed = residue_weights / (eps + residue_weights.sum(-1, keepdim=True))  # [*, N]
    per_alignment = torch.sum(tm_term * normed[..., None, :], dim=-1)  # [*, N]
    return torch.amax(per_alignment * residue_weights, dim=-1)


class AuxiliaryHeads(nn.Module):
    """All AF2 output heads on the final representations.

    ``forward(outputs)`` reads ``outputs["msa"]`` ``[*, N_clust, N, c_m]``, ``outputs["pair"]``
    ``[*, N, N, c_z]``, ``outputs["single"]`` ``[*, N, c_s]`` and ``outputs["sm"]["single"]``
    ``[*, N, c_s]``. As in AF2, the pLDDT head reads the structure module's final single
    representation (``sm.single``; ``single`` when there is no ``sm``) and the
    experimentally-resolved head the Evoformer's (``single``; ``sm.single`` when absent).
    Returns ``distogram_logits``, ``masked_msa_logits``, ``lddt_logits``, ``plddt`` (0-100),
    ``experimentally_resolved_logits``, and with the pTM head on also ``tm_logits``,
    ``aligned_confidence_probs``, ``predicted_aligned_error``, ``max_predicted_aligned_error``,
    ``ptm``. ``seq_mask`` ``[*, N]`` (optional) weights the residues in pTM.
    """

    def __init__(self, config: HeadsConfig, c_m: int, c_z: int, c_s: int) -> None:
        super().__init__()
        self.config = config
        self.distogram = DistogramHead(c_z, config.distogram_no_bins)
        self.masked_msa = MaskedMSAHead(c_m, config.masked_msa_c_out)
        self.plddt = PerResidueLDDTCaPredictor(c_s, config.lddt_c_hidden, config.lddt_no_bins)
        self.experimentally_resolved = ExperimentallyResolvedHead(
            c_s, config.experimentally_resolved_c_out
        )
        self.tm = TMScoreHead(c_z, config.tm_no_bins) if config.tm_enabled else None

    def forward(
        self, outputs: dict, seq_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        sm_single = outputs["sm"]["single"] if "sm" in outputs else outputs["single"]
        evo_single = outputs["single"] if "single" in outputs else sm_single
        lddt_logits = self.plddt(sm_single)
        out = {
            "distogram_logits": self.distogram(outputs["pair"]),
            "masked_msa_logits": self.masked_msa(outputs["msa"]),
            "lddt_logits": lddt_logits,
            "plddt": compute_plddt(lddt_logits),
            "experimentally_resolved_logits": self.experimentally_resolved(evo_single),
        }
        if self.tm is not None:
            cfg = self.config
            tm_logits = self.tm(outputs["pair"])
            out["tm_logits"] = tm_logits
            out.update(compute_predicted_aligned_error(tm_logits, cfg.tm_max_bin, cfg.tm_no_bins))
            out["ptm"] = compute_tm(tm_logits, seq_mask, cfg.tm_max_bin, cfg.tm_no_bins)
        return out
