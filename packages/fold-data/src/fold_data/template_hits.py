"""Template hits from HHsearch (``.hhr``) and hmmsearch (Stockholm) output.

Both parsers return :class:`TemplateHit` records with the alignment as column-wise index lists:
``indices_query[c]`` / ``indices_hit[c]`` are the 0-based residue numbers that column ``c`` aligns
(``-1`` for a gap), the hit's counted in the template's full SEQRES. Template featurisation maps
query residues onto template residues through columns where both are not ``-1``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from fold_data.errors import InputError
from fold_data.msa import _read_text, read_stockholm_alignment

__all__ = ["TemplateHit", "parse_hhr", "parse_hmmsearch_sto", "split_hit_name"]


@dataclass(frozen=True)
class TemplateHit:
    index: int                 # 0-based rank in the file
    name: str                  # e.g. "3u8v_B" (pdb id lower-case, chain id as given)
    pdb_id: str
    chain_id: str
    aligned_cols: int
    sum_probs: float | None    # hhr "Sum_probs"; None for hmmsearch
    query: str                 # aligned query string (with '-' gaps), in the hit's aligned region
    hit_sequence: str          # aligned template string (with '-' gaps)
    indices_query: list[int]   # 0-based query residue index per alignment column, -1 for gaps
    indices_hit: list[int]     # 0-based template residue index (in the template's full seqres) per column, -1 for gaps  # noqa: E501


_HIT_NAME = re.compile(r"^(?P<pdb>[0-9A-Za-z]{4})_(?P<chain>\S+)$")


def split_hit_name(name: str) -> tuple[str, str] | None:
    """``"1HF9_B"`` -> ``("1hf9", "B")``; ``None`` when the name is not ``<pdb id>_<chain>``."""
    match = _HIT_NAME.match(name)
    return (match.group("pdb").lower(), match.group("chain")) if match else None


def _indices(aligned: str, start: int) -> list[int]:
    """0-based residue number per column of ``aligned`` (``-1`` at gaps), counting from ``start``.
    """
    out, counter = [], start
    for char in aligned:
        if char == "-":
            out.append(-1)
        else:
            out.append(counter)
            counter += 1
    return out


# --- HHsearch .hhr ----------------------------------------------------------------------------

# "Q query             7 AEHHHKAAEHHEQAAKHHHAAA   28 (73)":
# name, first residue, aligned columns, last residue, sequence length
_HHR_ALIGNMENT_LINE = re.compile(
    r"^(?P<kind>[QT]) (?P<name>\S+)\s+(?P<start>\d+) (?P<columns>\S+)\s+(?P<end>\d+)"
    r" +\((?P<length>\d+)\)\s*$"
)
_HHR_ANNOTATION_NAMES = frozenset({"Consensus", "ss_pred", "ss_conf", "ss_dssp"})
_HHR_BLOCK_START = re.compile(r"^No (\d+)\s*$")
_HHR_SUMMARY_ROW = re.compile(r"^\s*(\d+)\s+(\S+)")


@dataclass
class _HhrChunks:
    """One side (Q or T) of a hit's alignment, accumulated over the blocks it is split into."""

    columns: str = ""
    indices: list[int] | None = None

    def add(self, columns: str, start: int, end: int, path: str, record: str, line_no: int) -> None:
        residues = sum(char != "-" for char in columns)
        if residues and residues != end - start + 1:
            raise InputError(path, f"{record}, line {line_no}",
                             f"{residues} residues between positions {start} and {end}; expected "
                             f"{end - start + 1}")
        if self.indices is None:
            self.indices = []
        self.columns += columns
        self.indices += _indices(columns, start - 1)  # hhr positions are 1-based


def _hhr_summary(lines: list[str]) -> dict[int, str]:
    """Hit number -> name from the summary table (``No Hit  Prob E-value ...``)."""
    summary: dict[int, str] = {}
    in_table = False
    for line in lines:
        if line.strip().startswith("No Hit"):
            in_table = True
            continue
        if in_table:
            match = _HHR_SUMMARY_ROW.match(line)
            if not match:
                break
            summary[int(match.group(1))] = match.group(2)
    return summary


def _hhr_hit(path: str, number: int, block: list[tuple[int, str]]) -> TemplateHit:
    """One ``No N`` block: ``>name`` line, ``Probab=...`` line and the Q/T alignment lines."""
    record = f"hit {number}"
    name = None
    scores: dict[str, str] = {}
    query, hit = _HhrChunks(), _HhrChunks()
    for line_no, line in block:
        if line.startswith(">"):
            name = line[1:].split(maxsplit=1)[0] if line[1:].strip() else ""
        elif line.startswith("Probab="):
            scores = dict(item.split("=", 1) for item in line.split() if "=" in item)
        elif line.startswith(("Q ", "T ")):
            fields = line.split()
            if len(fields) > 1 and fields[1] in _HHR_ANNOTATION_NAMES:
                continue
            match = _HHR_ALIGNMENT_LINE.match(line)
            if not match:
                raise InputError(path, f"{record}, line {line_no}",
                                 f"malformed alignment line: expected '{line[0]} <name> <start> "
                                 f"<residues> <end> (<length>)', got {line[:60]!r}")
            side = query if match.group("kind") == "Q" else hit
            side.add(match.group("columns").upper(), int(match.group("start")),
                     int(match.group("end")), path, record, line_no)
    if not name:
        raise InputError(path, record, "no '>name' line in the hit block")
    split = split_hit_name(name)
    if split is None:
        raise InputError(path, record, f"hit name {name!r}; expected '<pdb id>_<chain>'")
    if "Aligned_cols" not in scores:
        raise InputError(path, record, "no 'Probab=... Aligned_cols=...' line in the hit block")
    try:
        aligned_cols = int(scores["Aligned_cols"])
        sum_probs = float(scores["Sum_probs"]) if "Sum_probs" in scores else None
    except ValueError as err:
        raise InputError(path, record, f"unreadable score line: {err}") from err
    if query.indices is None or hit.indices is None:
        raise InputError(path, record, "truncated hit block: expected both 'Q <query>' and "
                         "'T <template>' alignment lines")
    if len(query.columns) != len(hit.columns):
        raise InputError(path, record, f"the query alignment has {len(query.columns)} columns but"
                         f" the template's has {len(hit.columns)}; expected equal (truncated?)")
    pdb_id, chain_id = split
    return TemplateHit(
        index=number - 1, name=f"{pdb_id}_{chain_id}", pdb_id=pdb_id, chain_id=chain_id,
        aligned_cols=aligned_cols, sum_probs=sum_probs, query=query.columns,
        hit_sequence=hit.columns, indices_query=query.indices, indices_hit=hit.indices,
    )


def parse_hhr(path: str | os.PathLike) -> list[TemplateHit]:
    """Template hits of an HHsearch ``.hhr`` file, in file order.

    Each ``No N`` block gives one hit; its ``Q``/``T`` lines (possibly split over several blocks;
    ``Consensus``/``ss_*`` lines ignored) give the alignment, with 1-based start positions turned
    into 0-based indices. Hits listed in the summary table must all have a block.
    """
    path = os.fspath(path)
    lines = _read_text(path).splitlines()
    if not any(line.strip() for line in lines):
        raise InputError(path, None, "empty file: expected HHsearch output")
    summary = _hhr_summary(lines)
    blocks: list[tuple[int, list[tuple[int, str]]]] = []
    for line_no, line in enumerate(lines, start=1):
        start = _HHR_BLOCK_START.match(line)
        if start:
            blocks.append((int(start.group(1)), []))
        elif line.startswith("Done!"):
            break
        elif blocks:
            blocks[-1][1].append((line_no, line))
    hits = [_hhr_hit(path, number, block) for number, block in blocks]
    for position, hit in enumerate(hits, start=1):
        if hit.index + 1 != position:
            raise InputError(path, f"hit {position}", f"found block 'No {hit.index + 1}'; expected "
                             f"'No {position}' (blocks out of order or missing)")
    for number, name in summary.items():
        if number > len(hits):
            raise InputError(path, f"hit {number}", f"{name} is listed in the summary table but "
                             "has no alignment block (truncated file?)")
        if split_hit_name(name) not in (None, (hits[number - 1].pdb_id, hits[number - 1].chain_id)):
            raise InputError(path, f"hit {number}", f"summary table names {name} but the block "
                             f"names {hits[number - 1].name}")
    return hits


# --- hmmsearch Stockholm ----------------------------------------------------------------------

_HMMSEARCH_NAME = re.compile(r"^(?P<name>[^/\s]+)/(?P<start>\d+)-(?P<end>\d+)$")
_GAPS = frozenset("-.")


def _match_columns(alignment, query_row: str | None) -> list[bool]:
    """Which alignment columns are HMM match states, i.e. query positions ``[N_col]``.

    From the ``#=GC RF`` line when present; else the query row's residues; else every column
    where some row is upper case or ``-`` (HMMER writes insert states in lower case / ``.``).
    """
    if "RF" in alignment.gc:
        return [char not in _GAPS for char in alignment.gc["RF"]]
    if query_row is not None:
        return [char not in _GAPS for char in query_row]
    width = alignment.num_columns
    match = [False] * width
    for row in alignment.rows.values():
        for col, char in enumerate(row):
            if char == "-" or char.isupper():
                match[col] = True
    return match


def parse_hmmsearch_sto(path: str | os.PathLike, query_sequence: str) -> list[TemplateHit]:
    """Template hits of an hmmsearch Stockholm file (AF2's template search against PDB SEQRES).

    The HMM was built from the query's MSA, so its match states are the query residues in order;
    insert states are template residues aligned to no query residue. Hit names are
    ``<pdb id>_<chain>/<start>-<end>`` with 1-based ``start`` in the template SEQRES. A row
    without a range whose residues are the query is the query itself and is skipped; hits whose
    ``DE`` says ``mol:`` other than ``protein`` (nucleic acids) are skipped as well. ``index``
    is the hit's 0-based rank among the hit rows of the file.
    """
    path = os.fspath(path)
    query_sequence = query_sequence.upper()
    alignment = read_stockholm_alignment(path)
    rows = alignment.rows
    query_name = next((name for name, row in rows.items() if not _HMMSEARCH_NAME.match(name)
                       and "".join(c for c in row if c not in _GAPS).upper() == query_sequence),
                      None)
    match_cols = _match_columns(alignment, rows[query_name] if query_name else None)
    if sum(match_cols) != len(query_sequence):
        raise InputError(path, "#=GC RF", f"the alignment has {sum(match_cols)} match columns; "
                         f"expected {len(query_sequence)} (the query's length)")
    hits: list[TemplateHit] = []
    rank = -1
    for name, row in rows.items():
        if name == query_name:
            continue
        rank += 1
        record = f"hit {rank} ({name})"
        description = alignment.gs.get(name, {}).get("DE", "")
        mol = re.search(r"\bmol:(\S+)", description)
        if mol and mol.group(1) != "protein":
            continue
        parsed = _HMMSEARCH_NAME.match(name)
        split = split_hit_name(parsed.group("name")) if parsed else None
        if parsed is None or split is None:
            raise InputError(path, record, "hit name; expected '<pdb id>_<chain>/<start>-<end>'")
        start, end = int(parsed.group("start")), int(parsed.group("end"))
        hits.append(_hmmsearch_hit(path, record, rank, split, row, match_cols, query_sequence,
                                   start, end))
    return hits


def _hmmsearch_hit(path: str, record: str, rank: int, split: tuple[str, str], row: str,
                   match_cols: list[bool], query_sequence: str, start: int,
                   end: int) -> TemplateHit:
    """One hmmsearch row as a column-wise alignment, trimmed to the hit's aligned region."""
    query_chars: list[str] = []
    hit_chars: list[str] = []
    indices_query: list[int] = []
    indices_hit: list[int] = []
    q, t = 0, start - 1  # next query residue, next template residue (0-based)
    aligned_cols = 0
    for char, is_match in zip(row, match_cols):
        is_gap = char in _GAPS
        if not is_gap and not char.isalpha():
            raise InputError(path, record, f"illegal character {char!r}; expected letters, '-' "
                             "or '.'")
        if is_match:
            query_chars.append(query_sequence[q])
            indices_query.append(q)
            q += 1
        elif is_gap:
            continue  # insert column where this hit has nothing: not part of its alignment
        else:
            query_chars.append("-")
            indices_query.append(-1)
        if is_gap:
            hit_chars.append("-")
            indices_hit.append(-1)
        else:
            hit_chars.append(char.upper())
            indices_hit.append(t)
            t += 1
            aligned_cols += is_match
    if t - (start - 1) != end - start + 1:
        raise InputError(path, record, f"{t - (start - 1)} residues in the row; expected "
                         f"{end - start + 1} from the range {start}-{end}")
    covered = [c for c, i in enumerate(indices_hit) if i >= 0]
    if not covered:
        raise InputError(path, record, "the hit row has no residues")
    lo, hi = covered[0], covered[-1] + 1
    pdb_id, chain_id = split
    return TemplateHit(
        index=rank, name=f"{pdb_id}_{chain_id}", pdb_id=pdb_id, chain_id=chain_id,
        aligned_cols=aligned_cols, sum_probs=None, query="".join(query_chars[lo:hi]),
        hit_sequence="".join(hit_chars[lo:hi]), indices_query=indices_query[lo:hi],
        indices_hit=indices_hit[lo:hi],
    )
