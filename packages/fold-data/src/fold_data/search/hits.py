"""HMMER hits as A3M rows aligned to the query, deduplicated and capped per database.

The query HMM of a one-iteration jackhmmer (and of nhmmer) is built from the query alone, so its
match states are the query residues in order. Each included domain becomes one row: match
columns upper case (``-`` where the hit skips a query residue), insert columns lower case
(the a3m insertions that fold-data's loader counts into the deletion matrix), ``-`` outside the
domain's ``hmm_from..hmm_to``. The row is named ``NAME/START-END`` (1-based, in the target) and
keeps the database header's description, so UniProt species (``OX=``, the entry mnemonic) are
kept for pairing. This is the alignment jackhmmer's ``-A`` Stockholm holds, written as A3M.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["A3mRow", "dedup_and_cap", "domain_row", "rows_from_hits", "to_a3m"]


@dataclass(frozen=True)
class A3mRow:
    name: str          # NAME/START-END
    description: str   # the database header's description
    row: str           # a3m: upper case / '-' per query residue, lower case insertions
    evalue: float

    @property
    def aligned(self) -> str:
        """The row without insertions: one character per query residue."""
        return "".join(c for c in self.row if not c.islower())


def domain_row(hmm_from: int, hmm_to: int, hmm_sequence: str, target_sequence: str,
               query_length: int) -> str:
    """One domain alignment (HMMER's strings) as an a3m row over ``query_length`` columns."""
    if len(hmm_sequence) != len(target_sequence):
        raise ValueError("HMMER alignment strings differ in length")
    out = ["-" * (hmm_from - 1)]
    for model, target in zip(hmm_sequence, target_sequence):
        if model == ".":            # insert state: target residue between query residues
            if target not in "-.":
                out.append(target.lower())
        else:                       # match state: one query residue
            out.append("-" if target in "-." else target.upper())
    out.append("-" * (query_length - hmm_to))
    row = "".join(out)
    matched = sum(1 for c in row if not c.islower())
    if matched != query_length:
        raise ValueError(f"alignment covers {matched} query columns; expected {query_length}")
    return row


def rows_from_hits(hits, query_length: int) -> list[A3mRow]:
    """Rows of the included domains of included hits, best hit first (HMMER's order)."""
    rows = []
    for hit in hits:
        if not hit.included:
            continue
        for dom in hit.domains:
            if not dom.included:
                continue
            ali = dom.alignment
            start, end = sorted((ali.target_from, ali.target_to))
            row = domain_row(ali.hmm_from, ali.hmm_to, ali.hmm_sequence, ali.target_sequence,
                             query_length)
            rows.append(A3mRow(f"{hit.name}/{start}-{end}", hit.description or "", row,
                               float(dom.i_evalue)))
    return rows


def dedup_and_cap(rows: list[A3mRow], max_hits: int | None, *, query: str,
                  seen: set[str] | None = None) -> list[A3mRow]:
    """The first ``max_hits`` rows of a database's hits (AF2 truncates each jackhmmer result,
    AF3 caps ``max_sequences``), then without rows whose aligned string (insertions removed)
    equals the query's or an earlier row's, as both deduplicate when merging. ``seen`` carries
    the aligned strings of databases merged before this one and is updated."""
    seen = set() if seen is None else seen
    seen.add(query)
    out = []
    for row in rows[:max_hits] if max_hits is not None else rows:
        key = row.aligned
        if key in seen:
            continue
        seen.add(key)
        out.append(row)
    return out


def to_a3m(query_name: str, query: str, rows: list[A3mRow]) -> str:
    """A3M text: the query first, then the rows."""
    lines = [f">{query_name}", query]
    for r in rows:
        lines += [f">{r.name} {r.description}".rstrip(), r.row]
    return "\n".join(lines) + "\n"
