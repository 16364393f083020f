"""Template features from template-search hits and the template mmCIFs (AF2 supplement 1.2.3),
shared by both families: AF2 uses them as they are, AF3 turns each chain's into token features
(:mod:`fold_data.af3.templates`). :func:`load_template_hits` reads a hits file by suffix.

For each hit, best first, until ``max_hits`` are accepted:

1. find and parse the template mmCIF (each file at most once per call); an unreadable file is
   skipped with an :class:`~fold_data.errors.InputWarning` naming the hit and the path; missing
   files are collected and reported in one warning per call naming the directory, the number of
   hits skipped and the first missing entries (a local PDB mirror usually lacks many entries,
   and one warning per file would drown everything else);
2. skip templates released after ``max_template_date`` (silently, as this is the intended
   filter; a file without a release date is skipped with a warning);
3. skip the query itself (the hit's residues are a subsequence of the query covering more than
   95% of it) and hits aligning fewer than 10% of the query's residues;
4. check that the hit's template residues match the mmCIF chain's full sequence at the hit's
   indices; if not (hit databases and mmCIFs can number residues differently), realign the
   hit's template segment onto the chain sequence (exact substring first, then a local
   alignment accepted at >= 90% identity), else skip with a warning;
5. copy the mmCIF atom37 coordinates of the aligned template residues onto the query positions.

Hits are ranked by ``sum_probs`` (HHsearch) when every hit has one, else kept in file order
(hmmsearch). fold-data has no torch: numpy only.
"""

from __future__ import annotations

import datetime
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError, InputWarning
from fold_data.readers import reader

if TYPE_CHECKING:  # the dataclass lives in the hit parsers' module
    from fold_data.mmcif import MmcifChain, MmcifStructure
    from fold_data.template_hits import TemplateHit

__all__ = [
    "empty_template_features",
    "load_template_hits",
    "make_template_features",
    "realign_segment",
]

MAX_SUBSEQUENCE_RATIO = 0.95  # hit covering more of the query than this is the query itself
MIN_ALIGN_RATIO = 0.1  # hits aligning fewer query residues than this are too short
MIN_REALIGN_IDENTITY = 0.9  # a realigned hit must agree this well with the mmCIF sequence
_GAP_CODE = 21  # template_aatype of query residues without a template residue


def load_template_hits(
    sequence: str, template_hits: str | os.PathLike | Sequence[TemplateHit] | None
) -> list[TemplateHit]:
    """Template hits from a file (``.hhr`` HHsearch, ``.sto`` hmmsearch) or as given."""
    if template_hits is None:
        return []
    if not isinstance(template_hits, str | os.PathLike):
        return list(template_hits)
    return reader(template_hits, "template_hits")(template_hits, sequence)


def empty_template_features(num_res: int) -> dict[str, np.ndarray]:
    """Template features with zero templates (first dimension 0) for a query of ``num_res``."""
    return {
        "template_aatype": np.zeros((0, num_res), dtype=np.int32),
        "template_all_atom_positions": np.zeros((0, num_res, rc.atom_type_num, 3), np.float32),
        "template_all_atom_mask": np.zeros((0, num_res, rc.atom_type_num), dtype=np.float32),
        "template_sum_probs": np.zeros((0,), dtype=np.float32),
        "template_domain_names": np.zeros((0,), dtype="S1"),
    }


def _same_residue(a: str, b: str) -> bool:
    return a == b or a == "X" or b == "X"


def realign_segment(segment: str, sequence: str) -> list[int] | None:
    """Place ``segment`` (a hit's template residues) onto ``sequence`` (the chain's full one).

    Returns, per residue of ``segment``, its 0-based index in ``sequence`` (-1 where it aligns
    to nothing), or None when no placement reaches ``MIN_REALIGN_IDENTITY``. An exact substring
    match wins; otherwise a local alignment (Smith-Waterman, match +2, mismatch -1, linear gap
    -2; X matches anything) whose identity is counted over the whole segment.
    """
    if not segment:
        return None
    at = sequence.find(segment)
    if at >= 0:
        return list(range(at, at + len(segment)))
    n, m = len(segment), len(sequence)
    gap = 2.0
    seg = np.frombuffer(segment.encode(), dtype=np.uint8)
    seq = np.frombuffer(sequence.encode(), dtype=np.uint8)
    x = ord("X")
    score = np.where(
        (seg[:, None] == seq[None, :]) | (seg[:, None] == x) | (seq[None, :] == x), 2.0, -1.0
    )  # [n, m]
    h = np.zeros((n + 1, m + 1))
    cols = np.arange(m + 1) * gap
    for i in range(1, n + 1):
        diag = h[i - 1, :-1] + score[i - 1]
        up = h[i - 1, 1:] - gap
        row = np.maximum(np.maximum(diag, up), 0.0)
        row = np.concatenate([[0.0], row])
        # Gaps along the sequence: H[i, j] = max_k<=j (T[k] - gap * (j - k)), a running max.
        h[i] = np.maximum.accumulate(row + cols) - cols
    # Trace back from the best cell.
    i, j = np.unravel_index(int(np.argmax(h)), h.shape)
    mapping = [-1] * n
    while i > 0 and j > 0 and h[i, j] > 0:
        if np.isclose(h[i, j], h[i - 1, j - 1] + score[i - 1, j - 1]):
            mapping[i - 1] = j - 1
            i, j = i - 1, j - 1
        elif np.isclose(h[i, j], h[i - 1, j] - gap):
            i -= 1
        else:
            j -= 1
    same = sum(
        1 for k, j2 in enumerate(mapping) if j2 >= 0 and _same_residue(segment[k], sequence[j2])
    )
    return mapping if same >= MIN_REALIGN_IDENTITY * n else None


def _find_mmcif(mmcif_dirs: Sequence[Path], pdb_id: str) -> Path | None:
    for mmcif_dir in mmcif_dirs:  # in order: the first folder holding the file wins
        for name in (pdb_id.lower(), pdb_id.upper()):
            for suffix in (".cif", ".cif.gz"):
                path = mmcif_dir / f"{name}{suffix}"
                if path.is_file():
                    return path
    return None


def _date_string(date: str | datetime.date | None) -> str | None:
    if date is None:
        return None
    if isinstance(date, datetime.date):
        return date.isoformat()
    try:
        return datetime.date.fromisoformat(date).isoformat()
    except ValueError:
        raise InputError(None, "max_template_date", f"expected YYYY-MM-DD, got {date!r}") from None


def _check_query(hit: TemplateHit, query_sequence: str) -> list[tuple[int, int]]:
    """(query index, hit index) of every aligned column; checks the hit is for this query."""
    pairs = []
    for column, (qi, ti) in enumerate(zip(hit.indices_query, hit.indices_hit, strict=True)):
        if qi < 0:
            continue
        if qi >= len(query_sequence) or not _same_residue(
            hit.query[column].upper(), query_sequence[qi]
        ):
            found = hit.query[column] if qi < len(query_sequence) else "beyond the end"
            raise InputError(
                None,
                f"template hit {hit.index} {hit.name}",
                f"query residue {qi} is {found!r} in the hit but the query sequence "
                f"(length {len(query_sequence)}) differs: the hits belong to another query",
            )
        if ti >= 0:
            pairs.append((qi, ti))
    return pairs


def _map_onto_chain(
    hit: TemplateHit, pairs: list[tuple[int, int]], chain: MmcifChain
) -> list[tuple[int, int]] | None:
    """Hit (query, template) pairs with template indices in the chain's full sequence."""
    hit_residues = {}
    for column, ti in enumerate(hit.indices_hit):
        if ti >= 0:
            hit_residues[ti] = hit.hit_sequence[column].upper()
    seq = chain.sequence
    if all(ti < len(seq) and _same_residue(r, seq[ti]) for ti, r in hit_residues.items()):
        return pairs
    order = sorted(hit_residues)
    mapping = realign_segment("".join(hit_residues[t] for t in order), seq)
    if mapping is None:
        return None
    new_index = dict(zip(order, mapping, strict=True))
    return [(qi, new_index[ti]) for qi, ti in pairs if new_index[ti] >= 0]


def make_template_features(
    query_sequence: str,
    hits: Sequence[TemplateHit],
    mmcif_dir: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    max_template_date: str | datetime.date | None = None,
    max_hits: int = 4,
) -> dict[str, np.ndarray]:
    """Raw template features of the accepted hits (schema ``RAW_FEATURES``).

    Returns ``template_aatype`` [T, N_res] int32 (0-20, 21 where the query residue has no
    template residue), ``template_all_atom_positions`` [T, N_res, 37, 3] and
    ``template_all_atom_mask`` [T, N_res, 37] float32, ``template_sum_probs`` [T] float32 (0 for
    hmmsearch hits) and ``template_domain_names`` [T] bytes (``b"<pdb id>_<chain>"``), with
    T <= ``max_hits`` the number of accepted hits (possibly 0).
    """
    query_sequence = query_sequence.upper()
    num_res = len(query_sequence)
    # one folder, or several searched in order (a training directory's template_mmcifs/, mmcifs/)
    mmcif_dirs = ([Path(d) for d in mmcif_dir] if isinstance(mmcif_dir, list | tuple)
                  else [Path(mmcif_dir)])
    cutoff = _date_string(max_template_date)
    if all(h.sum_probs is not None for h in hits):
        hits = sorted(hits, key=lambda h: -float(h.sum_probs))  # stable: ties keep file order
    parsed: dict[str, MmcifStructure | None] = {}
    missing: list[TemplateHit] = []

    def skip(hit: TemplateHit, why: str) -> None:
        warnings.warn(f"template hit {hit.index} {hit.name}: {why}; skipped", InputWarning, 2)

    aatypes, positions, masks, sum_probs, names = [], [], [], [], []
    for hit in hits:
        if len(aatypes) >= max_hits:
            break
        pairs = _check_query(hit, query_sequence)
        template_residues = hit.hit_sequence.replace("-", "").upper()
        if (
            template_residues in query_sequence
            and len(template_residues) > MAX_SUBSEQUENCE_RATIO * num_res
        ):
            continue  # the query itself
        if hit.aligned_cols < MIN_ALIGN_RATIO * num_res:
            continue  # too short to be useful

        pdb_id = hit.pdb_id.lower()
        if pdb_id not in parsed:
            path = _find_mmcif(mmcif_dirs, pdb_id)
            if path is None:
                parsed[pdb_id] = None
                missing.append(hit)
                continue
            try:
                from fold_data.mmcif import parse_mmcif  # gemmi: only when there are hits

                parsed[pdb_id] = parse_mmcif(path)
            except InputError as err:
                parsed[pdb_id] = None
                skip(hit, f"unreadable template mmCIF: {err}")
                continue
        structure = parsed[pdb_id]
        if structure is None:
            continue  # already warned about at this file's first hit
        if cutoff is not None:
            if structure.release_date is None:
                skip(hit, f"{structure.path} has no release date to compare with {cutoff}")
                continue
            if structure.release_date > cutoff:
                continue
        try:
            chain = structure.get_chain(hit.chain_id)
        except InputError as err:
            skip(hit, str(err))
            continue
        if chain.polymer_type != "protein":
            skip(hit, f"chain {hit.chain_id} of {structure.path} is {chain.polymer_type}")
            continue
        mapped = _map_onto_chain(hit, pairs, chain)
        if mapped is None:
            skip(
                hit,
                f"its template residues do not match chain {hit.chain_id} of {structure.path} "
                "and could not be realigned",
            )
            continue

        aatype = np.full(num_res, _GAP_CODE, dtype=np.int32)
        pos = np.zeros((num_res, rc.atom_type_num, 3), dtype=np.float32)
        mask = np.zeros((num_res, rc.atom_type_num), dtype=np.float32)
        if mapped:
            qi, ti = np.asarray(mapped, dtype=np.int64).T
            aatype[qi] = chain.aatype[ti]
            pos[qi] = chain.atom37_positions[ti]
            mask[qi] = chain.atom37_mask[ti]
        if not mask.any():
            skip(hit, f"no aligned residue has coordinates in {structure.path}")
            continue
        aatypes.append(aatype)
        positions.append(pos)
        masks.append(mask)
        sum_probs.append(0.0 if hit.sum_probs is None else float(hit.sum_probs))
        names.append(f"{pdb_id}_{hit.chain_id}".encode("ascii"))

    if missing:
        shown = ", ".join(f"hit {h.index} {h.name} -> {h.pdb_id.lower()}.cif" for h in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        warnings.warn(
            f"{len(missing)} template hits skipped: mmCIF not found in "
            f"{', '.join(map(str, mmcif_dirs))} "
            f"({shown}{more})",
            InputWarning,
            2,
        )
    if not aatypes:
        return empty_template_features(num_res)
    return {
        "template_aatype": np.stack(aatypes),
        "template_all_atom_positions": np.stack(positions),
        "template_all_atom_mask": np.stack(masks),
        "template_sum_probs": np.asarray(sum_probs, dtype=np.float32),
        "template_domain_names": np.asarray(names, dtype=np.bytes_),
    }
