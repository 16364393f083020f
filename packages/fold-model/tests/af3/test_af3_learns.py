"""A tiny AF3 learns a real protein-ligand complex on CPU: FKBP51 with FK506 (PDB 3O5R, shared
data), featurised by fold-data (CCD reference conformers, tokens, atoms), cropped spatially around
the ligand (the whole FK506, 57 atom tokens, and its 8 nearest residues). 80 Adam steps of the
full training objective (48-sample-style diffusion batch of 4, distogram, confidence on the
mini-rollout) at least halve the loss measured on fixed noise draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[4]
COMPLEX = REPO.parent / "shared" / "data" / "af3-examples" / "biotite-structures" / "3o5r.cif"


def _features() -> dict[str, torch.Tensor]:
    pytest.importorskip("fold_data")
    if not COMPLEX.exists():
        pytest.skip(f"shared AF3 example not found at {COMPLEX}")
    from fold_data.af3 import AF3DataPreset, make_features, make_sample
    from fold_data.af3.ccd import biotite_ccd_path, default_ccd
    from fold_data.af3.crop import crop_features

    if biotite_ccd_path() is None:
        pytest.skip("biotite's CCD is not installed")
    raw = make_features(COMPLEX, ccd=default_ccd())
    ligand = np.nonzero(raw["is_ligand"])[0]
    protein = np.nonzero(raw["is_ligand"] == 0)[0]
    centres = raw["atom_positions"][raw["token_center_atom"]]
    dist = np.linalg.norm(centres[protein] - centres[ligand].mean(0), axis=-1)
    tokens = np.sort(np.concatenate([ligand, protein[np.argsort(dist)[:8]]]))
    sample = make_sample(crop_features(raw, tokens),
                         AF3DataPreset("test", n_token=None, n_atom=None, n_msa=1, n_templ=0),
                         seed=0)
    return {k: torch.from_numpy(np.asarray(v))[None] for k, v in sample.items()}


def test_tiny_af3_learns_protein_ligand_complex():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model only stalls with more on a busy 2-core machine
    try:
        _learn()
    finally:
        torch.set_num_threads(threads)


def _learn() -> None:
    from fold_model.af3 import AlphaFold3, config

    feats = _features()
    assert feats["is_ligand"].sum() == 57 and feats["token_mask"].sum() == 65
    cfg = config("tiny", pairformer__dropout=0.0, msa__msa_dropout=0.0, msa__pair_dropout=0.0,
                 template__enabled=False, no_cycles=1)
    torch.manual_seed(0)
    model = AlphaFold3(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)

    def held_out_loss() -> float:
        total = 0.0
        with torch.no_grad():
            for seed in (101, 102):
                out = model(feats, generator=torch.Generator().manual_seed(seed))
                total += model.loss(out, feats)[0].item() / 2
        return total

    before = held_out_loss()
    for step in range(80):
        out = model(feats, generator=torch.Generator().manual_seed(step))
        loss, _ = model.loss(out, feats)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        assert torch.isfinite(loss)
    after = held_out_loss()
    assert after <= 0.5 * before, (before, after)
