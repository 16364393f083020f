"""Shared by the AF3 fold-train tests: the bundled AF3 demo data and the CLI arguments of a tiny
AF3 run (a uniquely named module; see _train_helpers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _train_helpers import DEMO

AF3_DEMO = DEMO / "af3"
CCD = AF3_DEMO / "ccd.cif"  # the 20 amino acids and FK5, so no test needs biotite's CCD
INPUTS = AF3_DEMO / "inputs"
# No dropout: the learning test measures the loss on fixed noise draws.
NO_DROPOUT = ["model.pairformer.dropout=0", "model.msa.msa_dropout=0",
              "model.msa.pair_dropout=0", "model.template.dropout=0"]
# Crops around the protein-ligand interface (AF3 2.7's spatial interface crop), so that the
# ligand is in (almost) every training crop of 3O5R.
INTERFACE_CROPS = ["data.p_contiguous=0", "data.p_spatial=0", "data.p_spatial_interface=1"]


def needs_af3_demo() -> None:
    if not (AF3_DEMO / "mmcifs" / "3o5r.cif").is_file() or not CCD.is_file():
        pytest.skip(f"bundled AF3 demo data not found at {AF3_DEMO}")


def train_args(run_dir: Path, *overrides: str, cache: Path | None = None) -> list[str]:
    """``fold-train train`` arguments of the tiny AF3 preset on the bundled 3O5R."""
    args = ["train", "--preset", "af3_tiny", "--data", str(AF3_DEMO), "--ccd", str(CCD),
            "--run-dir", str(run_dir), "--no-progress"]
    if cache is not None:
        args += ["--cache", str(cache)]
    return [*args, "loader_workers=0", *NO_DROPOUT, *INTERFACE_CROPS, *overrides]


def ligand_crop(raw: dict[str, np.ndarray], n_residues: int = 8) -> np.ndarray:
    """Token indices of every ligand token and the ``n_residues`` protein tokens nearest to the
    ligand's centre (a fixed protein-ligand crop)."""
    ligand = np.nonzero(raw["is_ligand"])[0]
    protein = np.nonzero(raw["is_ligand"] == 0)[0]
    centres = raw["atom_positions"][raw["token_center_atom"]]
    dist = np.linalg.norm(centres[protein] - centres[ligand].mean(0), axis=-1)
    return np.sort(np.concatenate([ligand, protein[np.argsort(dist)[:n_residues]]]))
