"""Scoring predicted structures against true ones (mmCIF files), one chain at a time.

The residue correspondence is the sequence position: both files are read with
``fold_data.mmcif.parse_mmcif`` (full ``_entity_poly_seq`` sequence, atom37 coordinates, a mask of
the resolved atoms), the two sequences must be equal, and the CA atoms resolved in the *true*
structure are scored (lDDT-Ca, TM-score, GDT-TS, GDT-HA, RMSD; :mod:`fold_train.metrics`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif

from fold_train import metrics

__all__ = ["evaluate_pair", "pair_files", "read_chain_ca"]

_CA = rc.atom_order["CA"]


def read_chain_ca(path: str | os.PathLike, chain: str | None = None
                  ) -> tuple[str, np.ndarray, np.ndarray]:
    """``(sequence, CA [N, 3], resolved [N])`` of ``chain`` (default: the only protein chain)."""
    structure = parse_mmcif(path)
    if chain is None:
        proteins = [c for c in structure.chains.values() if c.polymer_type == "protein"]
        if len(proteins) != 1:
            ids = [c.author_chain_id for c in proteins]
            raise InputError(path, None, f"expected one protein chain or --chain, found {ids}")
        found = proteins[0]
    else:
        found = structure.get_chain(chain)
    return (found.sequence, found.atom37_positions[:, _CA].astype(np.float64),
            found.atom37_mask[:, _CA].astype(np.float64))


def evaluate_pair(pred_path: str | os.PathLike, true_path: str | os.PathLike, *,
                  true_chain: str | None = None, pred_chain: str | None = None
                  ) -> dict[str, float | int | str]:
    """Metrics of one predicted chain against its true structure."""
    seq_p, ca_p, mask_p = read_chain_ca(pred_path, pred_chain)
    seq_t, ca_t, mask_t = read_chain_ca(true_path, true_chain)
    if seq_p != seq_t:
        raise InputError(pred_path, f"chain {pred_chain or '(only)'}",
                         f"sequence ({len(seq_p)} residues) differs from the true chain "
                         f"{true_chain or '(only)'} of {os.fspath(true_path)} ({len(seq_t)} "
                         "residues); expected the same sequence")
    missing = (mask_t > 0) & (mask_p <= 0)
    if missing.any():
        raise InputError(pred_path, None, f"no CA for {int(missing.sum())} residues resolved in "
                                          "the true structure; expected a full prediction")
    if mask_t.sum() < 3:
        raise InputError(true_path, true_chain, "fewer than 3 resolved CA atoms to score")
    for path, chain, ca, mask in ((pred_path, pred_chain, ca_p, mask_t),
                                  (true_path, true_chain, ca_t, mask_t)):
        bad = ~np.isfinite(ca[mask > 0]).all(-1)
        if bad.any():  # NaN would pass through every metric as a NaN score
            raise InputError(path, f"chain {chain or '(only)'} _atom_site.Cartn_x/y/z",
                             f"{int(bad.sum())} CA atoms have non-finite coordinates; expected "
                             "numbers (a diverged prediction?)")
    return {
        "pred": os.fspath(pred_path),
        "true": os.fspath(true_path),
        "n_res": len(seq_t),
        "n_resolved": int(mask_t.sum()),
        "lddt_ca": float(metrics.lddt_ca(ca_p, ca_t, mask_t)),
        "tm_score": metrics.tm_score(ca_p, ca_t, mask_t),
        "gdt_ts": metrics.gdt_ts(ca_p, ca_t, mask_t),
        "gdt_ha": metrics.gdt_ha(ca_p, ca_t, mask_t),
        "rmsd": metrics.rmsd(ca_p, ca_t, mask_t),
    }


def pair_files(pred_dir: str | os.PathLike, true_dir: str | os.PathLike
               ) -> list[tuple[Path, Path, str]]:
    """``[(prediction, true mmCIF, chain)]`` for predictions named ``<pdb>_<chain>.cif`` in
    ``pred_dir`` whose ``<pdb>.cif`` exists in ``true_dir`` (what ``fold-train predict`` names
    its outputs)."""
    out = []
    for pred in sorted(Path(pred_dir).glob("*.cif")):
        pdb, sep, chain = pred.stem.rpartition("_")
        if not sep:
            raise InputError(pred, None, "expected a prediction named <pdb>_<chain>.cif")
        true = Path(true_dir) / f"{pdb}.cif"
        if not true.exists():
            raise InputError(true, None, f"expected the true structure of {pred.name}")
        out.append((pred, true, chain))
    if not out:
        raise InputError(pred_dir, None, "expected predicted <pdb>_<chain>.cif files")
    return out
