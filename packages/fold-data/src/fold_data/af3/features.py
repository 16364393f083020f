"""Deterministic AF3 features of one entry (the ``RAW_FEATURES`` schema).

:func:`make_features` takes an :class:`~fold_data.af3.parse.Entry` (or a path: ``.json`` AF3
input, ``.cif``/``.mmcif`` complex, ``.fasta``/``.fa`` proteins) and returns tokens, atoms,
reference conformers, bonds, MSA and template features. It is a pure function of the inputs, the
CCD and ``seed``, so its result is what :mod:`fold_data.af3.cache` stores; per-step randomness
(cropping, MSA sampling, conformer rotation) lives in :mod:`.transforms`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fold_data.limits import check_size, entry_size
from fold_data.readers import reader
from fold_data.schema import validate

from .ccd import Ccd, default_ccd
from .msa import make_msa_features
from .parse import Entry
from .schema import RAW_FEATURES
from .templates import make_af3_template_features
from .tokenizer import tokenize

__all__ = ["load_entry", "make_features"]

PathLike = str | os.PathLike


def load_entry(source: Entry | PathLike, *, ccd: Ccd | None = None,
               allow_outside_paths: bool = False) -> Entry:
    """An :class:`Entry` from an entry or a file, chosen by the file's suffix. A JSON's file
    paths must stay inside its directory unless ``allow_outside_paths``."""
    if isinstance(source, Entry):
        return source
    path = Path(source)
    return reader(path, "af3_entry")(path, ccd=ccd, allow_outside_paths=allow_outside_paths)


def make_features(
    source: Entry | PathLike,
    *,
    ccd: Ccd | None = None,
    msa_paths: Mapping[str, list[PathLike]] | None = None,
    template_hits: Mapping[str, object] | None = None,
    template_mmcif_dir: PathLike | None = None,
    max_template_date: str | None = None,
    max_templates: int = 4,
    max_msa_rows: int | None = 16384,
    paired_msa_paths: Mapping[str, PathLike] | None = None,
    pairing_msa_paths: Mapping[str, PathLike] | None = None,
    seed: int = 0,
    max_conformer_attempts: int = 200,
) -> dict[str, np.ndarray]:
    """Raw AF3 features (:data:`~fold_data.af3.schema.RAW_FEATURES`) of an entry.

    ``msa_paths`` / ``template_hits``: per author chain ID (the JSON ``id``, mmCIF
    ``auth_asym_id``) alignment files and a
    template-hits file (whose mmCIFs are read from ``template_mmcif_dir``).
    ``paired_msa_paths``: per author chain ID the A3M of rows paired by species across chains
    (``fold-data msa`` writes ``paired/<name>_<chain>.a3m``); or ``pairing_msa_paths``: per
    author chain ID the pairing database hits (``uniprot_hits.sto``), paired here by species
    (:func:`fold_data.af3.msa.species_paired_msas`). ``seed`` seeds the
    ETKDGv3 reference conformers. Raises :class:`InputError` naming the file, entity and field,
    and ``InputTooLarge`` for an entry over the size limits in force (:mod:`fold_data.limits`).
    """
    ccd = ccd or default_ccd()
    entry = load_entry(source, ccd=ccd)
    # size limits (fold_data.limits) before tokens, conformers and MSAs are made: InputTooLarge
    check_size(entry_size(entry, ccd, msa_paths), record=entry.name)
    feats = tokenize(entry, ccd, seed=seed, max_attempts=max_conformer_attempts)
    feats.update(make_msa_features(entry, feats, dict(msa_paths or {}), max_rows=max_msa_rows,
                                   paired_paths=dict(paired_msa_paths or {}),
                                   pairing_paths=dict(pairing_msa_paths or {})))
    feats.update(make_af3_template_features(
        entry, feats, template_hits, template_mmcif_dir=template_mmcif_dir,
        max_template_date=max_template_date, max_templates=max_templates))
    feats["resolution"] = np.asarray(entry.resolution, dtype=np.float32)
    feats["chain_ids"] = np.asarray([c.chain_id.encode("ascii") for c in entry.chains],
                                    dtype=np.bytes_)
    validate(feats, RAW_FEATURES, where=f"{entry.source or entry.name} AF3 features",
             allow_extra=False)
    return feats
