"""Detect an mmCIF file cut short at a line boundary.

A file cut between two lines of its ``_atom_site`` loop still parses: gemmi reads the rows that
are there, and the structure silently lacks the residues (and chains) after the cut. wwPDB files
always have categories after ``_atom_site`` (``_atom_site_anisotrop``, ``_pdbx_poly_seq_scheme``,
``_pdbx_audit_revision_history`` ...) and close every category with a ``#`` line, so a file
whose *last* content is an ``_atom_site`` data row has been cut, unless its author wrote it that
way. :func:`warn_if_truncated` therefore warns only when both hold:

* the file ends inside the ``_atom_site`` loop (it is the block's last category and the file's
  last line is a data row, not a ``#`` terminator), and
* the modelled residues end abruptly: the last residue misses heavy atoms of its type, or the
  last chain's ``_entity_poly_seq`` goes on after it, or polymer chains of ``_struct_asym`` have
  no atoms at all.

A cut inside a later model of an NMR ensemble leaves the first model (the one fold reads) whole
and is not reported.
"""

from __future__ import annotations

import gzip
import os
import warnings
from pathlib import Path

import gemmi

from fold_data import residue_constants as rc
from fold_data.errors import InputWarning

__all__ = ["TruncatedMmcifWarning", "truncation_problem", "warn_if_truncated"]

_TAIL_BYTES = 4096
_ATOM_TAGS = ["label_asym_id", "label_seq_id", "label_comp_id", "label_atom_id",
              "?auth_asym_id", "?pdbx_PDB_model_num", "?type_symbol", "?label_entity_id"]


class TruncatedMmcifWarning(InputWarning):
    """An mmCIF file looks cut short: its modelled residues end abruptly inside ``_atom_site``."""


def _last_category(block: gemmi.cif.Block) -> str | None:
    last = None
    for item in block:
        if item.loop is not None:
            last = item.loop.tags[0]
        elif item.pair is not None:
            last = item.pair[0]
    return None if last is None else last.partition(".")[0] + "."


def _last_line(path: Path) -> str:
    """The file's last non-blank line (decompressed for ``.gz``)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            tail = f.read()[-_TAIL_BYTES:]
    else:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            tail = f.read()
    lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def _value(row: gemmi.cif.Table.Row, i: int) -> str:
    return gemmi.cif.as_string(row[i]) if row.has(i) else ""


def _missing_heavy_atoms(comp: str, names: set[str]) -> list[str]:
    """Heavy atoms a standard amino acid has that ``names`` lacks (others: not checked)."""
    parent = "MET" if comp == "MSE" else comp
    if parent not in rc.residue_atoms:
        return []
    names = {"SD" if comp == "MSE" and n == "SE" else n for n in names}
    return [a for a in rc.residue_atoms[parent] if a not in names]


def truncation_problem(path: str | os.PathLike, block: gemmi.cif.Block) -> str | None:
    """What shows that ``path`` (parsed into ``block``) was cut short, or None (see module)."""
    path = Path(path)
    if _last_category(block) != "_atom_site." or _last_line(path).startswith("#"):
        return None
    table = block.find("_atom_site.", _ATOM_TAGS)
    if len(table) == 0:
        return None
    rows = [table[i] for i in range(len(table))]
    model = _value(rows[-1], 5)
    if model != _value(rows[0], 5):
        return None  # cut inside a later model: the first one is whole
    label, seq, comp = _value(rows[-1], 0), _value(rows[-1], 1), _value(rows[-1], 2)
    author, entity = _value(rows[-1], 4) or label, _value(rows[-1], 7)
    names = set()
    for row in reversed(rows):
        if (_value(row, 0), _value(row, 1), _value(row, 5)) != (label, seq, model):
            break
        if _value(row, 6).upper() not in ("H", "D"):
            names.add(_value(row, 3))
    problems = []
    missing = _missing_heavy_atoms(comp, names)
    if missing:
        problems.append(f"its last residue {comp} {seq} lacks heavy atoms {', '.join(missing)}")
    seq_nums = [int(n) for e, n in zip(block.find_values("_entity_poly_seq.entity_id"),
                                       block.find_values("_entity_poly_seq.num"))
                if gemmi.cif.as_string(e) == entity and n.isdigit()]
    if seq.isdigit() and seq_nums and max(seq_nums) > int(seq):
        problems.append(f"{max(seq_nums) - int(seq)} residues of its _entity_poly_seq "
                        f"({int(seq) + 1}..{max(seq_nums)}) come after the last atom row")
    polymer = {gemmi.cif.as_string(e) for e in block.find_values("_entity_poly.entity_id")}
    seen = {_value(r, 0) for r in rows}
    empty = [gemmi.cif.as_string(a) for a, e in zip(block.find_values("_struct_asym.id"),
                                                    block.find_values("_struct_asym.entity_id"))
             if gemmi.cif.as_string(e) in polymer and gemmi.cif.as_string(a) not in seen]
    if empty:
        problems.append(f"polymer chains (label) {', '.join(empty)} have no atoms")
    if not problems:
        return None
    return (f"chain {author} (label {label}) ends abruptly at residue {comp} {seq}: "
            f"{'; '.join(problems)}. The file ends inside the _atom_site loop (no closing '#' "
            "and none of the categories a complete file has after it): it looks cut short, "
            "and the missing residues are treated as unmodelled. Fetch the file again")


def warn_if_truncated(path: str | os.PathLike, block: gemmi.cif.Block) -> bool:
    """Warn (:class:`TruncatedMmcifWarning`, naming the file and chain) when ``path`` looks cut
    short; returns whether it warned."""
    problem = truncation_problem(path, block)
    if problem is not None:
        warnings.warn(f"{os.fspath(path)}: {problem}", TruncatedMmcifWarning, stacklevel=3)
    return problem is not None
