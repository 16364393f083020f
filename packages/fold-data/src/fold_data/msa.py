"""Multiple sequence alignments: FASTA / a3m / Stockholm parsing, merging, MSA features, and
:func:`load_msa`, which both families use to read a chain's alignment files.

Every parser returns an :class:`Msa` in the AF2 convention (supplement 1.2.2 and Table 1): each row
is aligned to the query, has exactly one character per query residue (upper case or ``-``), and
residues that the row has *between* two query columns (a3m lower-case insertions, Stockholm columns
where the query has a gap) are removed from the row and counted in ``deletion_matrix`` at the next
query column. Row 0 is the query.

Residue codes of :func:`make_msa_features` follow AF2's mapping of the HHblits alphabet onto the
20 ``restypes`` (``ARNDCQEGHILKMFPSTWYV``), 20 = unknown, 21 = gap: the ambiguity codes are
resolved as HHblits does, ``B`` (Asx) -> ``D``, ``Z`` (Glx) -> ``E``, ``U`` (selenocysteine) ->
``C``; ``J`` (Leu/Ile), ``O`` (pyrrolysine) and ``X`` -> unknown.

No torch here: fold-data builds and caches features with numpy only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from fold_data.errors import InputError
from fold_data.readers import reader
from fold_data.residue_constants import (
    HHBLITS_AA_TO_ID,
    MAP_HHBLITS_AATYPE_TO_OUR_AATYPE,
    sequence_to_aatype,
)

__all__ = [
    "GAP_CODE",
    "MSA_RESTYPE_TO_CODE",
    "Msa",
    "StockholmAlignment",
    "check_query",
    "load_msa",
    "make_msa_features",
    "merge_msas",
    "parse_a3m",
    "parse_fasta",
    "parse_stockholm",
    "read_stockholm_alignment",
    "species_id",
]

# --- alphabet ---------------------------------------------------------------------------------

GAP_CODE = 21
# One-letter code (upper case or '-') -> MSA code 0-21: AF2's two tables composed (letter ->
# HHblits id -> our code).
MSA_RESTYPE_TO_CODE: dict[str, int] = {
    aa: MAP_HHBLITS_AATYPE_TO_OUR_AATYPE[i] for aa, i in HHBLITS_AA_TO_ID.items()
}

_GAPS = frozenset("-.")
_FASTA_ALLOWED = re.compile(r"[A-Za-z.\-]*")
_ALIGNED_ALLOWED = frozenset(MSA_RESTYPE_TO_CODE)  # A-Z and '-'

# Lookup table for vectorised encoding: byte -> code, -1 for characters outside the alphabet.
_CODE_LUT = np.full(256, -1, dtype=np.int32)
for _aa, _code in MSA_RESTYPE_TO_CODE.items():
    _CODE_LUT[ord(_aa)] = _code


# --- species ----------------------------------------------------------------------------------

# UniProt entry name ``ENTRY_SPECIES`` (ENTRY: accession or mnemonic, SPECIES: 1-5 characters),
# optionally inside ``db|accession|name`` and followed by a ``/start-end`` range.
_UNIPROT_NAME = re.compile(
    r"^(?:[a-z]{2}\|[A-Z0-9_.\-]+\|)?[A-Z0-9]{1,10}_(?P<species>[A-Z0-9]{1,5})(?:/\d+-\d+)?$"
)
_OX_FIELD = re.compile(r"\bOX=(?P<taxid>\d+)")


def species_id(description: str) -> str:
    """Species identifier of one MSA row, ``""`` when unknown.

    The UniProt mnemonic of the row's name comes first (``tr|A0A2A6NXF8|A0A2A6NXF8_9BRAD`` ->
    ``9BRAD``, ``Q9XYZ_HUMAN/1-100`` -> ``HUMAN``), as AF-Multimer pairs rows by it; a description
    without one falls back to its UniProt taxonomy field (``OX=9606`` -> ``9606``).
    """
    words = description.split(maxsplit=1)
    if not words:
        return ""
    match = _UNIPROT_NAME.match(words[0])
    if match:
        return match.group("species")
    match = _OX_FIELD.search(description)
    return match.group("taxid") if match else ""


# --- the Msa type -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Msa:
    """An alignment in the AF2 convention, row 0 the query.

    ``sequences``: ``N_msa`` rows of ``N_res`` characters (upper case or ``-``).
    ``deletion_matrix``: ``[N_msa][N_res]`` residues deleted before each aligned position.
    ``descriptions``: the ``N_msa`` record descriptions (FASTA header / Stockholm name + DE).
    ``source``: the file it came from (several joined by ``"; "`` after :func:`merge_msas`).
    """

    sequences: list[str]
    deletion_matrix: list[list[int]]
    descriptions: list[str]
    source: str = ""

    def __post_init__(self) -> None:
        n = len(self.sequences)
        if len(self.deletion_matrix) != n or len(self.descriptions) != n:
            raise InputError(self.source or None, None,
                             f"MSA has {n} sequences but {len(self.deletion_matrix)} deletion rows "
                             f"and {len(self.descriptions)} descriptions; expected equal counts")
        if n:
            width = len(self.sequences[0])
            for i, (seq, dels) in enumerate(zip(self.sequences, self.deletion_matrix)):
                if len(seq) != width or len(dels) != width:
                    raise InputError(self.source or None, _record(i, self.descriptions[i]),
                                     f"row has {len(seq)} aligned columns and {len(dels)} "
                                     f"deletion counts; expected {width} (the query's length)")

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def num_res(self) -> int:
        """``N_res``: the number of aligned columns (query residues)."""
        return len(self.sequences[0]) if self.sequences else 0

    @cached_property
    def species(self) -> list[str]:
        """Species identifier per row (:func:`species_id`), ``""`` when unknown."""
        return [species_id(d) for d in self.descriptions]

    def truncate(self, n: int) -> Msa:
        """The first ``n`` rows (the query stays row 0)."""
        if n < 0:
            raise ValueError(f"truncate expects n >= 0, got {n}")
        return Msa(self.sequences[:n], self.deletion_matrix[:n], self.descriptions[:n], self.source)


def _record(index: int, description: str) -> str:
    return f"record {index} ({description.split(maxsplit=1)[0] if description else 'no name'})"


# --- reading ----------------------------------------------------------------------------------


def _read_text(path: str | os.PathLike) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(path, None, f"not UTF-8 text ({err.reason} at byte {err.start})") from err


def _is_text(text_or_path: str | os.PathLike) -> bool:
    """A ``str`` holding FASTA content (rather than a file name): empty, multi-line or ``>...``."""
    return isinstance(text_or_path, str) and (
        not text_or_path or "\n" in text_or_path or text_or_path.lstrip().startswith(">")
    )


def parse_fasta(text_or_path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(description, sequence)`` for each record of a FASTA / a3m file or string.

    Sequences keep their case and gap characters (``-``, ``.``); whitespace inside sequence lines is
    dropped. ``#`` lines before the first header (a3m comments) are skipped. Raises
    :class:`InputError` for an empty input, sequence lines before any header and characters other
    than letters, ``-`` and ``.``.
    """
    if _is_text(text_or_path):
        path, text = None, str(text_or_path)
    else:
        path, text = os.fspath(text_or_path), _read_text(text_or_path)
    records: list[tuple[str, list[str]]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(">"):
            records.append((line[1:].strip(), []))
            continue
        if not records:
            if line.startswith("#"):
                continue
            # the line's text is not echoed: the file may not be a FASTA at all
            raise InputError(path, f"line {line_no}",
                             "text before the first '>' header; expected a FASTA/a3m file")
        chunk = "".join(line.split())
        if not _FASTA_ALLOWED.fullmatch(chunk):
            bad = next(c for c in chunk if not _FASTA_ALLOWED.fullmatch(c))
            raise InputError(path, f"{_record(len(records) - 1, records[-1][0])}, line {line_no}",
                             f"illegal character {bad!r}; expected letters, '-' or '.'")
        records[-1][1].append(chunk)
    if not records:
        raise InputError(path, None, "no sequences: expected at least one '>' record")
    return [(desc, "".join(parts)) for desc, parts in records]


# --- a3m --------------------------------------------------------------------------------------


def _a3m_row(path: str, index: int, description: str, row: str) -> tuple[str, list[int]]:
    """Split one a3m row into its aligned string and deletion counts (supplement 1.2.2)."""
    aligned: list[str] = []
    deletions: list[int] = []
    pending = 0  # insertions since the last aligned column
    for char in row:
        if char == ".":  # gap in an insert column (a2m style): not a column, not a residue
            continue
        if char.islower():
            pending += 1
            continue
        if char not in _ALIGNED_ALLOWED:
            raise InputError(path, _record(index, description),
                             f"illegal character {char!r}; expected A-Z, a-z, '-' or '.'")
        aligned.append(char)
        deletions.append(pending)
        pending = 0
    return "".join(aligned), deletions


def parse_a3m(path: str | os.PathLike) -> Msa:
    """Read an a3m alignment (HHblits): lower case are insertions, the first record the query.

    Insertions are removed from each row and counted into the deletion matrix at the next aligned
    column; every row must then have the query's length.
    """
    path = os.fspath(path)
    records = parse_fasta(Path(path))
    sequences, deletion_matrix, descriptions = [], [], []
    for index, (description, row) in enumerate(records):
        aligned, deletions = _a3m_row(path, index, description, row)
        if index == 0 and not aligned:
            raise InputError(path, _record(0, description), "the query has no aligned residues")
        if sequences and len(aligned) != len(sequences[0]):
            raise InputError(path, _record(index, description),
                             f"aligned length {len(aligned)} after removing insertions; expected "
                             f"{len(sequences[0])} (the query's)")
        sequences.append(aligned)
        deletion_matrix.append(deletions)
        descriptions.append(description)
    return Msa(sequences, deletion_matrix, descriptions, path)


# --- Stockholm --------------------------------------------------------------------------------


@dataclass
class StockholmAlignment:
    """The content of one Stockholm alignment, blocks joined.

    ``rows``: name -> aligned row (all of one length ``N_col``), in the order of first appearance.
    ``gs``: name -> feature -> text (``#=GS``; repeated lines joined by a space).
    ``gr``: name -> feature -> per-column annotation (``#=GR``), ``gc``: feature -> annotation
    (``#=GC``), ``gf``: feature -> text (``#=GF``).
    """

    rows: dict[str, str]
    gs: dict[str, dict[str, str]]
    gr: dict[str, dict[str, str]]
    gc: dict[str, str]
    gf: dict[str, str]

    @property
    def num_columns(self) -> int:
        return len(next(iter(self.rows.values()))) if self.rows else 0


def read_stockholm_alignment(
    path: str | os.PathLike, max_sequences: int | None = None
) -> StockholmAlignment:
    """Read the first alignment of a Stockholm file (interleaved blocks allowed).

    ``max_sequences`` keeps only the first that many sequence names (and their annotations).
    Raises :class:`InputError` when the header is missing, a line is malformed, no sequences are
    present, or rows / per-column annotations differ in length.
    """
    path = os.fspath(path)
    lines = _read_text(path).splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise InputError(path, None, "empty file: expected a '# STOCKHOLM 1.0' alignment")
    if not lines[first].startswith("# STOCKHOLM"):
        raise InputError(path, f"line {first + 1}", "expected the header '# STOCKHOLM 1.0' "
                         "(the line is not shown: the file may not be a Stockholm file)")
    parts: dict[str, list[str]] = {}
    gr_parts: dict[str, dict[str, list[str]]] = {}
    gc_parts: dict[str, list[str]] = {}
    gs: dict[str, dict[str, str]] = {}
    gf: dict[str, str] = {}

    def keep(name: str) -> bool:
        return name in parts or max_sequences is None or len(parts) < max_sequences

    closed = False
    for line_no, raw in enumerate(lines[first + 1:], start=first + 2):
        line = raw.rstrip()
        if line.startswith("//"):
            closed = True
            break
        if not line.strip():
            continue
        if line.startswith("#=GF"):
            fields = line.split(maxsplit=2)
            if len(fields) >= 2:
                gf[fields[1]] = (gf.get(fields[1], "") + " " + (fields[2] if len(fields) > 2
                                                                  else "")).strip()
        elif line.startswith("#=GS"):
            fields = line.split(maxsplit=3)
            if len(fields) < 3:
                raise InputError(path, f"line {line_no}", "malformed #=GS line: expected "
                                 "'#=GS <name> <feature> <text>'")
            text = fields[3] if len(fields) > 3 else ""
            if max_sequences is None or fields[1] in parts or len(gs) < max_sequences:
                features = gs.setdefault(fields[1], {})
                features[fields[2]] = (features.get(fields[2], "") + " " + text).strip()
        elif line.startswith("#=GR"):
            fields = line.split()
            if len(fields) != 4:
                raise InputError(path, f"line {line_no}", "malformed #=GR line: expected "
                                 "'#=GR <name> <feature> <annotation>'")
            if max_sequences is None or fields[1] in parts:
                gr_parts.setdefault(fields[1], {}).setdefault(fields[2], []).append(fields[3])
        elif line.startswith("#=GC"):
            fields = line.split()
            if len(fields) != 3:
                raise InputError(path, f"line {line_no}", "malformed #=GC line: expected "
                                 "'#=GC <feature> <annotation>'")
            gc_parts.setdefault(fields[1], []).append(fields[2])
        elif line.startswith("#"):
            continue
        else:
            fields = line.split()
            if len(fields) != 2:
                raise InputError(path, f"line {line_no}", "malformed sequence line: expected "
                                 f"'<name> <aligned sequence>', got {len(fields)} fields")
            name, chunk = fields
            if keep(name):
                parts.setdefault(name, []).append(chunk)
    if not closed:  # a truncated file would silently lose rows or columns
        raise InputError(path, f"line {len(lines)}", "the alignment does not end with '//'; "
                         "expected a complete Stockholm file (truncated?)")
    if not parts:
        raise InputError(path, None, "no sequences in the alignment")
    rows = {name: "".join(chunks) for name, chunks in parts.items()}
    width = len(next(iter(rows.values())))
    for index, (name, row) in enumerate(rows.items()):
        if len(row) != width:
            raise InputError(path, f"record {index} ({name})",
                             f"aligned length {len(row)}; expected {width} (the first row's)")
    gr = {name: {feat: "".join(chunks) for feat, chunks in feats.items()}
          for name, feats in gr_parts.items()}
    gc = {feat: "".join(chunks) for feat, chunks in gc_parts.items()}
    for feat, annotation in gc.items():
        if len(annotation) != width:
            raise InputError(path, f"#=GC {feat}",
                             f"annotation length {len(annotation)}; expected {width} columns")
    for name, feats in gr.items():
        for feat, annotation in feats.items():
            if len(annotation) != width:
                raise InputError(path, f"#=GR {name} {feat}",
                                 f"annotation length {len(annotation)}; expected {width} columns")
    return StockholmAlignment(rows, gs, gr, gc, gf)


def parse_stockholm(path: str | os.PathLike, max_sequences: int | None = None) -> Msa:
    """Read a jackhmmer Stockholm alignment as an :class:`Msa` (first sequence = query).

    AF2's conversion: columns where the query has a gap are dropped; residues other rows have in
    those columns are counted as deletions before the next query column. Descriptions are the
    sequence name followed by its ``#=GS ... DE`` text. ``max_sequences`` keeps the first rows only.
    """
    path = os.fspath(path)
    alignment = read_stockholm_alignment(path, max_sequences)
    names = list(alignment.rows)
    query = alignment.rows[names[0]]
    keep = [char not in _GAPS for char in query]  # [N_col]: query columns
    if not any(keep):
        raise InputError(path, _record(0, names[0]), "the query row has no residues")
    sequences, deletion_matrix, descriptions = [], [], []
    for index, name in enumerate(names):
        aligned: list[str] = []
        deletions: list[int] = []
        pending = 0
        for char, is_query_col in zip(alignment.rows[name], keep):
            if is_query_col:
                char = "-" if char in _GAPS else char.upper()
                if char not in _ALIGNED_ALLOWED:
                    raise InputError(path, _record(index, name),
                                     f"illegal character {char!r}; expected A-Z, '-' or '.'")
                aligned.append(char)
                deletions.append(pending)
                pending = 0
            elif char not in _GAPS:
                if not char.isalpha():
                    raise InputError(path, _record(index, name),
                                     f"illegal character {char!r}; expected A-Z, '-' or '.'")
                pending += 1
        description = alignment.gs.get(name, {}).get("DE", "")
        sequences.append("".join(aligned))
        deletion_matrix.append(deletions)
        descriptions.append(f"{name} {description}" if description else name)
    return Msa(sequences, deletion_matrix, descriptions, path)


# --- merging and checks -----------------------------------------------------------------------


def merge_msas(msas: Sequence[Msa]) -> Msa:
    """Concatenate alignments of one query in order, keeping the first copy of each aligned row.

    Rows are compared as aligned strings (insertions already removed), as AF2 deduplicates; the
    deletion counts and description of the first occurrence are kept.
    """
    if not msas:
        raise ValueError("merge_msas needs at least one Msa")
    width = msas[0].num_res
    seen: set[str] = set()
    sequences, deletion_matrix, descriptions = [], [], []
    for msa in msas:
        if len(msa) and msa.num_res != width:
            raise InputError(msa.source or None, "query",
                             f"alignment has {msa.num_res} columns; expected {width} like "
                             f"{msas[0].source or 'the first MSA'}")
        for seq, dels, desc in zip(msa.sequences, msa.deletion_matrix, msa.descriptions):
            if seq in seen:
                continue
            seen.add(seq)
            sequences.append(seq)
            deletion_matrix.append(dels)
            descriptions.append(desc)
    sources = "; ".join(dict.fromkeys(m.source for m in msas if m.source))
    return Msa(sequences, deletion_matrix, descriptions, sources)


def check_query(msa: Msa, sequence: str, *, path: str | os.PathLike | None = None) -> None:
    """Raise ``InputError(path, "query", ...)`` unless the MSA's first row is the chain sequence.

    Gaps are removed from the first row before comparing; an ``X`` in the chain sequence matches
    any residue (MSE must already be mapped to M by the caller).
    """
    path = path if path is not None else (msa.source or None)
    if not len(msa):
        raise InputError(path, "query", "empty MSA: expected the chain sequence as the first row")
    query = msa.sequences[0].replace("-", "")
    sequence = sequence.upper()
    if len(query) != len(sequence):
        raise InputError(path, "query", f"the MSA's query has {len(query)} residues; expected "
                         f"{len(sequence)} (the chain sequence {_short(sequence)})")
    for i, (got, want) in enumerate(zip(query, sequence)):
        if got != want and want != "X":
            raise InputError(path, "query", f"residue {i + 1} of the MSA's query is {got!r}; "
                             f"expected {want!r} (the chain sequence {_short(sequence)})")


def _short(sequence: str, limit: int = 30) -> str:
    return sequence if len(sequence) <= limit else sequence[:limit] + "..."


# --- features ---------------------------------------------------------------------------------


def make_msa_features(msa: Msa) -> dict[str, np.ndarray]:
    """AF2 MSA features of one alignment.

    Returns ``msa`` ``[N_msa, N_res]`` int32 (0-19 restypes, 20 X, 21 gap), ``deletion_matrix``
    ``[N_msa, N_res]`` float32 and ``msa_species`` ``[N_msa]`` bytes (``""`` when unknown).
    """
    source = msa.source or None
    if not len(msa):
        raise InputError(source, None, "empty MSA: expected at least the query row")
    width = msa.num_res
    # Non-ASCII characters become '?' (one byte each, so columns stay put) and then code -1.
    raw = np.frombuffer("".join(msa.sequences).encode("ascii", "replace"), dtype=np.uint8)
    codes = _CODE_LUT[raw].reshape(len(msa), width)  # [N_msa, N_res]
    if (codes < 0).any():
        row, col = (int(v[0]) for v in np.nonzero(codes < 0))
        raise InputError(source, _record(row, msa.descriptions[row]),
                         f"illegal character {msa.sequences[row][col]!r} at column {col + 1}; "
                         "expected A-Z or '-'")
    deletion_matrix = np.asarray(msa.deletion_matrix, dtype=np.float32).reshape(len(msa), width)
    species = np.array([s.encode("ascii", "replace") for s in msa.species], dtype=np.bytes_)
    return {"msa": codes.astype(np.int32), "deletion_matrix": deletion_matrix,
            "msa_species": species}


# --- loading ----------------------------------------------------------------------------------


def load_msa(
    sequence: str, msa_paths: Sequence[str | os.PathLike], *, max_msa_sequences: int | None = None
) -> dict[str, np.ndarray]:
    """MSA features of the query ``sequence`` from alignment files (AF2 supplement 1.2.2).

    Files are read by suffix (:mod:`fold_data.readers`: ``.a3m`` HHblits, ``.sto`` jackhmmer
    Stockholm), each one's query checked against ``sequence`` (:class:`InputError` naming the file
    otherwise), merged in order and deduplicated, then cut to ``max_msa_sequences`` rows. With no
    file, the MSA is the query alone. Returns ``msa`` / ``deletion_matrix`` ``[N_msa, N_res]``,
    ``msa_species``.
    """
    if not msa_paths:
        return {
            "msa": sequence_to_aatype(sequence)[None].astype(np.int32),
            "deletion_matrix": np.zeros((1, len(sequence)), dtype=np.float32),
            "msa_species": np.array([b""], dtype=np.bytes_),
        }
    msas: list[Msa] = []
    for path in msa_paths:
        msa = reader(path, "msa")(path)
        check_query(msa, sequence, path=path)
        msas.append(msa)
    merged = merge_msas(msas)
    if max_msa_sequences is not None:
        merged = merged.truncate(max_msa_sequences)
    return make_msa_features(merged)
