"""Inputs of the prediction benchmarks (train.predict_graphs, chunk.longest_input,
parallel.predict_dap): a checkpoint of a preset with random (seeded) weights, written by
fold-train's ``save_checkpoint`` as the CLI reads it, and random queries with MSAs mutated from
them (the cost of a prediction depends on the sizes, not on the residues)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common.results import REPO

__all__ = ["AMINO", "a3m_text", "af2_query_files", "af3_prediction", "random_checkpoint",
           "random_sequence"]

AMINO = "ACDEFGHIKLMNPQRSTVWY"


def random_checkpoint(preset: str, overrides: list[str], path: Path) -> Path:
    """A fold-train checkpoint of ``preset`` (with ``overrides``) and seeded random weights."""
    from fold_train.checkpoint import save_checkpoint
    from fold_train.config import apply_overrides
    from fold_train.config import preset as get_preset
    from fold_train.families import make_family

    cfg = apply_overrides(get_preset(preset), overrides)
    torch.manual_seed(0)
    mc = cfg.model_config()
    model = make_family(cfg.model.family, mc).build_model(mc)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return save_checkpoint(path, {"format": "fold-train/1", "config": cfg.to_dict(),
                                  "model": state, "optimizer": {}})


def random_sequence(n: int, seed: int = 0) -> str:
    """``n`` residues drawn uniformly from the 20 amino acids."""
    rng = np.random.default_rng(seed)
    return "".join(AMINO[i] for i in rng.integers(0, 20, n))


def a3m_text(query: str, depth: int, seed: int = 1) -> str:
    """An a3m of ``depth`` rows (the query first) mutated from ``query``: 30% substitutions,
    5% gaps."""
    rng = np.random.default_rng(seed)
    rows = [query]
    for _ in range(depth - 1):
        row = np.array(list(query))
        hit = rng.random(len(query)) < 0.3
        row[hit] = [AMINO[i] for i in rng.integers(0, 20, hit.sum())]
        row[rng.random(len(query)) < 0.05] = "-"
        rows.append("".join(row))
    return "".join(f">row{i}\n{r}\n" for i, r in enumerate(rows))


def af2_query_files(n_res: int, n_msa: int, folder: Path, stem: str = "query"
                    ) -> tuple[Path, Path]:
    """``(FASTA, a3m)`` in ``folder``: ``n_res`` random residues and ``n_msa`` rows."""
    query = random_sequence(n_res, 0)
    fasta = folder / f"{stem}.fasta"
    fasta.write_text(f">query\n{query}\n")
    a3m = folder / f"{stem}.a3m"
    a3m.write_text(a3m_text(query, n_msa))
    return fasta, a3m


def af3_prediction(device: torch.device, tiny: bool, folder: Path) -> tuple:
    """``(model, cfg, raw, preset, n_token, samples)``: the AF3 preset with random weights read
    back by the CLI's loader, and a random protein (768 tokens; 30 with ``tiny``) featurized
    from an AlphaFold3 input JSON in ``folder`` as ``fold-train predict`` does."""
    from fold_data.af3 import Ccd
    from fold_train.predict import load_trained_model
    from fold_train.predict_af3 import make_af3_inputs

    if tiny:
        preset, n_token, samples = "af3_tiny", 30, 2
    else:
        preset, n_token, samples = "af3", 768, 5
    ckpt = random_checkpoint(preset, [], folder / "af3.ckpt")
    model, cfg = load_trained_model(ckpt, device, family="af3")
    doc = {"name": "bench", "modelSeeds": [0], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": random_sequence(n_token, 2)}}]}
    source = folder / "bench.json"
    source.write_text(json.dumps(doc))
    ccd = Ccd([REPO / "data" / "demo" / "af3" / "ccd.cif"], use_biotite=False)
    _, raw = make_af3_inputs(source, ccd)
    return model, cfg, raw, preset, n_token, samples
