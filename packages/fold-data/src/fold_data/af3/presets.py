"""Fixed sample sizes and crop probabilities for the AF3 per-step transforms.

From the AlphaFold3 supplement (Abramson et al. 2024):

* section 5.2 / Table 6 (training stages): crop size ``N_token`` = 384 in initial training,
  640 in the first and 768 in the second fine-tuning stage;
* section 2.7 / Table 4 (cropping): for weighted-PDB samples the crop method is contiguous with
  probability 0.2, spatial 0.4, spatial interface 0.4;
* section 2.4: up to 4 templates per chain;
* section 2.3: at most 16,384 MSA rows are featurized per entry (the raw features keep that many).

* section 2.5 (training data): chains and interfaces drawn with the weights of 2.5.1
  (``sampling="weighted"``, :mod:`fold_data.af3.sampling`), after the filters of 2.5.4:
  resolution at most 9 Angstrom, released by 2021-09-30, at most 300 polymer chains.

Not fixed by the supplement, chosen here: the atom budget ``n_atom`` (12 atoms per token on
average, a multiple of 32 for the atom-attention blocks of 32 queries) and the number of MSA rows
per training sample ``n_msa`` (1024, as AF2's extra MSA; memory-bound).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

__all__ = ["AF3DataPreset", "PRESETS", "get_preset"]


@dataclass(frozen=True)
class AF3DataPreset:
    """Sizes and probabilities of one AF3 sample. ``n_token`` None: no crop, pad to the entry."""

    name: str
    n_token: int | None
    n_atom: int | None
    n_msa: int
    n_templ: int = 4
    p_contiguous: float = 0.2
    p_spatial: float = 0.4
    p_spatial_interface: float = 0.4
    ref_translation_std: float = 1.0  # Angstrom, random translation of each reference conformer
    # Training set (fold-train): "uniform" entries, or "weighted" chains and interfaces (2.5.1)
    sampling: str = "uniform"
    # Filters of the training entries (2.5.4); None: off
    max_resolution: float | None = None
    max_release_date: str | None = None
    max_polymer_chains: int | None = None

    def __post_init__(self) -> None:
        if self.sampling not in ("uniform", "weighted"):
            raise ValueError(f"preset {self.name}: sampling {self.sampling!r}; expected "
                             "'uniform' or 'weighted'")
        if self.max_release_date is not None:
            try:
                datetime.date.fromisoformat(self.max_release_date)
            except ValueError:
                raise ValueError(f"preset {self.name}: max_release_date "
                                 f"{self.max_release_date!r}; expected YYYY-MM-DD") from None
        total = self.p_contiguous + self.p_spatial + self.p_spatial_interface
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"preset {self.name}: crop probabilities sum to {total}, expected 1")


# AF3 supplement 2.5: weighted chains and interfaces of the filtered PDB set
_AF3_TRAINING = {"sampling": "weighted", "max_resolution": 9.0, "max_release_date": "2021-09-30",
                 "max_polymer_chains": 300}

PRESETS: dict[str, AF3DataPreset] = {
    p.name: p
    for p in (
        AF3DataPreset("af3_initial", n_token=384, n_atom=384 * 12, n_msa=1024, **_AF3_TRAINING),
        AF3DataPreset("af3_finetune1", n_token=640, n_atom=640 * 12, n_msa=1024,
                      **_AF3_TRAINING),
        AF3DataPreset("af3_finetune2", n_token=768, n_atom=768 * 12, n_msa=1024,
                      **_AF3_TRAINING),
        AF3DataPreset("af3_predict", n_token=None, n_atom=None, n_msa=16384),
    )
}


def get_preset(name: str) -> AF3DataPreset:
    """The preset called ``name``; :class:`KeyError` listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown AF3 data preset {name!r}; known: {sorted(PRESETS)}") from None
