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


def noisy_tiny_af3(seed: int = 0):
    """``(family, model)``: the tiny AF3 in eval mode with random weights everywhere (its
    zero-initialised final layers perturbed too, so that pLDDT, the distogram, PAE and PDE
    depend on the input)."""
    import torch
    from fold_train.config import apply_overrides, preset
    from fold_train.families import make_family

    torch.manual_seed(seed)
    mc = apply_overrides(preset("af3_tiny"), []).model_config()
    family = make_family("af3", mc)
    model = family.build_model(mc)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return family, model.eval()


def fkbp_crop_batch() -> dict:
    """A collated inference sample of FKBP51 + FK506 cropped around the ligand (67 tokens, 121
    atoms, FK506 whole) with a hole in the MSA mask."""
    needs_af3_demo()
    from fold_data.af3 import Ccd, make_sample
    from fold_data.af3.crop import crop_features
    from fold_train.data import collate
    from fold_train.predict_af3 import make_af3_inputs

    _, raw = make_af3_inputs(INPUTS / "fkbp51_fk506.json", Ccd([CCD], use_biotite=False))
    raw = crop_features(raw, ligand_crop(raw, 10))
    out = collate([make_sample(raw, "af3_predict", seed=0)])
    out["msa_mask"][..., 5:9] = 0
    return out
