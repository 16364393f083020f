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
from pathlib import Path

import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.limits import check_size, sequence_size
from fold_data.mmcif import parse_mmcif
from fold_data.msa import (
    Msa,
    check_query,
    make_msa_features,
    merge_msas,
    parse_a3m,
    parse_stockholm,
)
from fold_data.template_hits import TemplateHit, parse_hhr, parse_hmmsearch_sto

from .ground_truth import make_ground_truth
from .schema import RAW_FEATURES, validate
from .templates import empty_template_features, make_template_features

__all__ = ["make_features", "make_features_from_sequence", "load_msa", "load_template_hits"]

PathLike = str | os.PathLike
TemplateHitsArg = PathLike | Sequence[TemplateHit] | None


def load_msa(
    sequence: str, msa_paths: Sequence[PathLike], *, max_msa_sequences: int | None = None
) -> dict[str, np.ndarray]:
    """MSA features of the query ``sequence`` from alignment files (AF2 supplement 1.2.2).

    Files are read by extension (``.a3m`` HHblits, ``.sto`` jackhmmer Stockholm), each one's
    query checked against ``sequence`` (:class:`InputError` naming the file otherwise), merged in
    order and deduplicated, then cut to ``max_msa_sequences`` rows. With no file, the MSA is the
    query alone. Returns ``msa`` / ``deletion_matrix`` ``[N_msa, N_res]``, ``msa_species``.
    """
    if not msa_paths:
        return {
            "msa": rc.sequence_to_aatype(sequence)[None].astype(np.int32),
            "deletion_matrix": np.zeros((1, len(sequence)), dtype=np.float32),
            "msa_species": np.array([b""], dtype=np.bytes_),
        }
    msas: list[Msa] = []
    for path in msa_paths:
        suffix = Path(path).suffix.lower()
        if suffix == ".a3m":
            msa = parse_a3m(path)
        elif suffix == ".sto":
            msa = parse_stockholm(path)
        else:
            raise InputError(path, None, f"unknown MSA format {suffix!r}; expected .a3m or .sto")
        check_query(msa, sequence, path=path)
        msas.append(msa)
    merged = merge_msas(msas)
    if max_msa_sequences is not None:
        merged = merged.truncate(max_msa_sequences)
    return make_msa_features(merged)


def load_template_hits(sequence: str, template_hits: TemplateHitsArg) -> list[TemplateHit]:
    """Template hits from a file (``.hhr`` HHsearch, ``.sto`` hmmsearch) or as given."""
    if template_hits is None:
        return []
    if not isinstance(template_hits, str | os.PathLike):
        return list(template_hits)
    suffix = Path(template_hits).suffix.lower()
    if suffix == ".hhr":
        return parse_hhr(template_hits)
    if suffix == ".sto":
        return parse_hmmsearch_sto(template_hits, sequence)
    raise InputError(
        template_hits, None, f"unknown template hits format {suffix!r}; expected .hhr or .sto"
    )


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
    structure = parse_mmcif(mmcif_path)
    chain = structure.get_chain(chain_id)
    if chain.polymer_type != "protein":
        raise InputError(
            mmcif_path, f"chain {chain_id}", f"is {chain.polymer_type}; expected a protein chain"
        )
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


_QUERY_LETTERS = "ACDEFGHIKLMNPQRSTVWXY"


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
    sequence = sequence.strip().upper()
    # B/J/O/U/Z are refused as the AF3 path does, not silently turned into UNK
    bad = sorted(set(sequence) - set(_QUERY_LETTERS))
    if not sequence or bad:
        raise InputError(
            None, "query sequence",
            f"got {bad or 'an empty sequence'}; expected the letters {_QUERY_LETTERS} (20 amino "
            "acids, X for unknown)",
        )
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
