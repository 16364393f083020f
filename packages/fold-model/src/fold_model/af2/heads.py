"""AF2 output heads (supplement 1.9) and the confidence metrics derived from them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeadsConfig"]


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
