"""Deterministic AF2 features of one chain (the ``RAW_FEATURES`` schema).

:func:`make_features` is the training entry point (an mmCIF chain: sequence, structure, ground
truth); :func:`make_features_from_sequence` the prediction one (a sequence alone: ground-truth
arrays zero with zero masks). Both are pure functions of their input files, so their results are
what the ahead-of-time cache stores; the per-step randomness lives in :mod:`.transforms`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import numpy as np

from fold_data import residue_constants as rc
from fold_data.limits import check_size, sequence_size
from fold_data.msa import load_msa
from fold_data.schema import validate
from fold_data.template_hits import TemplateHit
from fold_data.templates import (
    empty_template_features,
    load_template_hits,
    make_template_features,
)

from .ground_truth import make_ground_truth
from .parse import parse_protein_chain, parse_query_sequence
from .schema import RAW_FEATURES

__all__ = ["make_features", "make_features_from_sequence"]

PathLike = str | os.PathLike
TemplateHitsArg = PathLike | Sequence[TemplateHit] | None


def _sequence_features(
    sequence: str,
    msa_paths: Sequence[PathLike],
    template_hits: TemplateHitsArg,
    *,
    template_mmcif_dir: PathLike | None,
    max_template_date: str | datetime.date | None,
    max_templates: int,
    max_msa_sequences: int | None,
    source: PathLike | None = None,
) -> dict[str, np.ndarray]:
    """Everything but the ground truth: sequence, MSA and template features (``source``: the
    file named when the chain and its MSA exceed the size limits, ``InputTooLarge``)."""
    check_size(sequence_size(source, sequence, msa_paths, max_rows=max_msa_sequences),
               record="chain and MSA")
    n_res = len(sequence)
    feats: dict[str, np.ndarray] = {
        "aatype": rc.sequence_to_aatype(sequence).astype(np.int32),
        "residue_index": np.arange(n_res, dtype=np.int32),
        "seq_length": np.asarray(n_res, dtype=np.int32),
        "sequence": np.asarray(sequence.encode("ascii")),
    }
    feats.update(load_msa(sequence, msa_paths, max_msa_sequences=max_msa_sequences))
    hits = load_template_hits(sequence, template_hits)
    if hits:
        if template_mmcif_dir is None:
            raise ValueError("template hits were given but no template_mmcif_dir to read them from")
        feats.update(
            make_template_features(
                sequence,
                hits,
                template_mmcif_dir,
                max_template_date=max_template_date,
                max_hits=max_templates,
            )
        )
    else:
        feats.update(empty_template_features(n_res))
    return feats


def make_features(
    mmcif_path: PathLike,
    chain_id: str,
    msa_paths: Sequence[PathLike] = (),
    template_hits: TemplateHitsArg = None,
    *,
    template_mmcif_dir: PathLike | None = None,
    max_template_date: str | datetime.date | None = None,
    max_templates: int = 4,
    max_msa_sequences: int | None = None,
) -> dict[str, np.ndarray]:
    """Raw AF2 features (:data:`RAW_FEATURES`) of chain ``chain_id`` (author or label ID).

    ``msa_paths``: ``.a3m`` / ``.sto`` alignments of the chain (none: the single-sequence MSA).
    ``template_hits``: a ``.hhr`` / ``.sto`` hits file or parsed hits (``None``: zero templates),
    whose mmCIFs are read from ``template_mmcif_dir``, released no later than
    ``max_template_date``, at most ``max_templates`` of them. Ground truth comes from the chain's
    atom37 coordinates; ``resolution`` is 0 when the method reports none (NMR).
    Raises :class:`InputError` naming the file and record on bad input.
    """
    structure, chain = parse_protein_chain(mmcif_path, chain_id)
    feats = _sequence_features(
        chain.sequence,
        msa_paths,
        template_hits,
        template_mmcif_dir=template_mmcif_dir,
        max_template_date=max_template_date,
        max_templates=max_templates,
        max_msa_sequences=max_msa_sequences,
        source=mmcif_path,
    )
    feats.update(make_ground_truth(feats["aatype"], chain.atom37_positions, chain.atom37_mask))
    feats["resolution"] = np.asarray(structure.resolution, dtype=np.float32)
    validate(feats, RAW_FEATURES, where=f"{os.fspath(mmcif_path)} [chain {chain_id}]")
    return feats



def make_features_from_sequence(
    sequence: str,
    msa_paths: Sequence[PathLike] = (),
    template_hits: TemplateHitsArg = None,
    *,
    template_mmcif_dir: PathLike | None = None,
    max_template_date: str | datetime.date | None = None,
    max_templates: int = 4,
    max_msa_sequences: int | None = None,
) -> dict[str, np.ndarray]:
    """Raw AF2 features of a query sequence for prediction: as :func:`make_features`, with the
    ground-truth arrays zero and their masks zero (the per-residue-type arrays such as
    ``atom14_atom_exists`` are filled, since they depend on the sequence only)."""
    sequence = parse_query_sequence(sequence)
    feats = _sequence_features(
        sequence,
        msa_paths,
        template_hits,
        template_mmcif_dir=template_mmcif_dir,
        max_template_date=max_template_date,
        max_templates=max_templates,
        max_msa_sequences=max_msa_sequences,
    )
    n_res = len(sequence)
    feats.update(
        make_ground_truth(
            feats["aatype"],
            np.zeros((n_res, rc.atom_type_num, 3), dtype=np.float32),
            np.zeros((n_res, rc.atom_type_num), dtype=np.float32),
        )
    )
    feats["resolution"] = np.asarray(0.0, dtype=np.float32)
    validate(feats, RAW_FEATURES, where="query sequence features")
    return feats
