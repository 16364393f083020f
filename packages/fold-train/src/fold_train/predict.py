"""Prediction: a sequence (FASTA) or a chain of an mmCIF, with its MSAs and template hits, in; an
mmCIF of the predicted all-atom structure, pLDDT in the B-factor column, out.

Features come from fold-data (``make_features_from_sequence`` / ``make_features``, then
``make_sample(training=False)``: the whole chain, the top templates), the model and its averaged
(EMA) weights from a fold-train checkpoint. The structure is written by fold-data
(``fold_data.af2.write.prediction_to_structure``, ``fold_data.write.write_mmcif``). When the
input is an mmCIF chain, the prediction is also scored against it (lDDT-Ca, TM-score, GDT, RMSD).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from fold_data import residue_constants as rc
from fold_data.af2.write import Prediction
from fold_data.errors import InputError

from fold_train import metrics
from fold_train.config import TrainConfig

__all__ = [
    "load_trained_model",
    "make_raw_features",
    "predict_structure",
    "read_query",
    "score_against_truth",
]

_CA = rc.atom_order["CA"]


def load_trained_model(checkpoint: str | os.PathLike, device: str | torch.device = "cpu", *,
                       use_ema: bool = True, family: str = "af2"):
    """``(model, TrainConfig)`` from a fold-train checkpoint: the model in eval mode with the
    averaged weights when the checkpoint has them (``use_ema``), else the live weights.
    ``family``: the model family the caller expects (``af2`` / ``af3``); a checkpoint of the
    other family is a :class:`CheckpointError` that says which input it needs."""
    from fold_model.layers import skip_weight_init

    from fold_train.checkpoint import CheckpointError, load_checkpoint
    from fold_train.families import make_family
    from fold_train.optim import FlatParams

    state = load_checkpoint(checkpoint, map_location="cpu")
    try:
        cfg = TrainConfig.from_dict(state["config"])
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(checkpoint, f"cannot read its training config: {e}") from e
    if cfg.model.family != family:
        raise CheckpointError(
            checkpoint, f"is an {cfg.model.family.upper()} checkpoint (preset "
                        f"{cfg.run.preset!r}) but the input needs an {family.upper()} model; "
                        f"predict with it from {cfg.family.input_hint}")
    try:
        model_config = cfg.model_config()
        with skip_weight_init():  # the strict load below sets every parameter
            model = make_family(cfg.model.family, model_config).build_model(model_config)
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(checkpoint, f"cannot rebuild the model from it: {e}") from e
    ema = state.get("optimizer", {}).get("ema")
    if use_ema and ema is not None:
        flat = FlatParams(model)  # the EMA buffers have the flat layout of the parameters
        try:  # by name when saved under an earlier layout of the parameters
            flat.load_saved([g.param for g in flat.groups], ema, state["optimizer"]["layout"],
                            state["optimizer"].get("offsets"))
        except (ValueError, RuntimeError) as e:
            raise CheckpointError(checkpoint, f"EMA buffers do not fit the model: {e}") from e
    return model.to(device).eval(), cfg


def read_query(fasta: str | os.PathLike) -> tuple[str, str]:
    """``(name, sequence)`` of a FASTA file's first record: the query that ``predict`` folds
    (the name is the header's first word, else the file's stem)."""
    from fold_data.msa import parse_fasta

    records = parse_fasta(Path(fasta))
    if not records:
        raise InputError(fasta, None, "expected at least one FASTA record")
    description, sequence = records[0]
    return (description.split() or [Path(fasta).stem])[0], sequence


def make_raw_features(
    *, fasta: str | os.PathLike | None = None, mmcif: str | os.PathLike | None = None,
    chain: str | None = None, msas: Sequence[str | os.PathLike] = (),
    template_hits: str | os.PathLike | None = None,
    template_mmcif_dir: str | os.PathLike | None = None,
) -> tuple[str, dict[str, np.ndarray], bool]:
    """``(name, raw features, has ground truth)`` from a FASTA (first record) or an mmCIF chain."""
    from fold_data.af2 import make_features, make_features_from_sequence

    kw = {"template_mmcif_dir": template_mmcif_dir}
    if (fasta is None) == (mmcif is None):
        raise ValueError("give exactly one of a FASTA file or an mmCIF file (with its chain)")
    if fasta is not None:
        name, sequence = read_query(fasta)
        try:
            raw = make_features_from_sequence(sequence, list(msas), template_hits, **kw)
        except InputError as e:
            if e.path is not None:
                raise
            raise InputError(fasta, f"record {name}, {e.record}", e.reason) from None
        return name, raw, False
    if chain is None:
        raise InputError(mmcif, None, "expected a chain ID (--chain) for an mmCIF input")
    raw = make_features(mmcif, chain, list(msas), template_hits, **kw)
    return f"{Path(mmcif).stem}_{chain}", raw, True


@torch.no_grad()
def predict_structure(
    model, raw: dict[str, np.ndarray], data_preset, *, device: str | torch.device = "cpu",
    precision: str = "fp32", num_recycles: int | None = None, seed: int = 0,
    cuda_graphs: bool | None = None, predictor=None,
) -> Prediction:
    """Run ``model`` on the inference sample of ``raw`` (all ``R`` recycling passes unless
    ``num_recycles``) and return the chain's prediction (padding removed).

    ``cuda_graphs`` (None: on when ``device`` is CUDA): pad the sample to its shape bucket and
    replay one captured recycling iteration per pass (:mod:`fold_train.predict_graphs`); off, the
    same iterations run eagerly on the unpadded sample. ``predictor``: an
    :class:`~fold_train.predict_graphs.AF2Predictor` to reuse (its graphs) across calls."""
    from fold_data.af2 import make_sample

    from fold_train.data import collate
    from fold_train.predict_graphs import AF2Predictor

    device = torch.device(device)
    n = int(raw["seq_length"])
    sample = make_sample(raw, data_preset, seed=seed, training=False)
    batch = collate([sample])
    if predictor is None:
        predictor = AF2Predictor(model, device, precision=precision, cuda_graphs=cuda_graphs)
    out = predictor(batch, num_recycles=num_recycles)
    return Prediction(
        aatype=raw["aatype"].astype(np.int64)[:n],
        positions=out["final_atom_positions"][0, :n].float().cpu().numpy(),
        atom_mask=out["final_atom_mask"][0, :n].float().cpu().numpy(),
        plddt=out["plddt"][0, :n].float().cpu().numpy(),
        contact_probs=_contact_probs(out["distogram_logits"][0, :n, :n], model.config.heads),
        **(_aligned_error(out["tm_logits"][0, :n, :n], model.config.heads)
           if "tm_logits" in out else {}),
    )


def _contact_probs(distogram_logits: torch.Tensor, heads) -> np.ndarray:
    """``[N, N]`` probability of CB-CB (CA for glycine) within 8 A from the distogram head's
    logits (1.9.8's bins; AF3's ``contact_probs`` definition)."""
    from fold_train.confidence import contact_probs

    return contact_probs(distogram_logits.float(), heads.distogram_first_break,
                         heads.distogram_last_break).cpu().numpy()


def _aligned_error(tm_logits: torch.Tensor, heads) -> dict:
    """PAE, its maximum and pTM of the real residues from the pTM head's logits ``[N, N, bins]``
    (AF2 supplement 1.9.7; the padding of a shape bucket sliced off first)."""
    from fold_model.af2.heads import compute_predicted_aligned_error, compute_tm

    logits = tm_logits.float().cpu()
    pae = compute_predicted_aligned_error(logits, heads.tm_max_bin, heads.tm_no_bins)
    return {"pae": pae["predicted_aligned_error"].numpy(),
            "max_pae": float(pae["max_predicted_aligned_error"]),
            "ptm": float(compute_tm(logits, None, heads.tm_max_bin, heads.tm_no_bins))}


def score_against_truth(pred: Prediction, raw: dict[str, np.ndarray]) -> dict[str, float]:
    """CA metrics of the prediction against the ground truth in ``raw`` (mmCIF input)."""
    n = len(pred.aatype)
    true = raw["all_atom_positions"][:n, _CA].astype(np.float64)
    mask = raw["all_atom_mask"][:n, _CA].astype(np.float64)
    p = pred.positions[:, _CA].astype(np.float64)
    if mask.sum() < 3:
        raise InputError(None, "ground truth", "fewer than 3 resolved CA atoms to score against")
    return {
        "lddt_ca": float(metrics.lddt_ca(p, true, mask)),
        "tm_score": metrics.tm_score(p, true, mask),
        "gdt_ts": metrics.gdt_ts(p, true, mask),
        "gdt_ha": metrics.gdt_ha(p, true, mask),
        "rmsd": metrics.rmsd(p, true, mask),
        "mean_plddt": float(pred.plddt.mean()),
        "n_res": n,
        "n_resolved": int(mask.sum()),
    }
