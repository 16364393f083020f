"""Sequence databases: FASTA files, optionally gzipped, read into HMMER's digital form.

Each record's header is ``>NAME DESCRIPTION`` (UniProt: ``>tr|ACC|ENTRY_SPECIES ... OX=9606``);
the name and description travel with the hit into the MSA, where species are read from them.
A file that is missing, empty, not FASTA, or holds letters outside the molecule's alphabet is
refused with an :class:`~fold_data.errors.InputError` naming the file, the record and what was
expected. A terminal ``*`` (stop codon in protein FASTA) is dropped.
"""

from __future__ import annotations

import gzip
import os
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError

__all__ = ["Database", "alphabet_for", "database_signature", "load_database"]

# IUPAC letters HMMER's alphabets accept (easel: amino 'ACDEFGHIKLMNPQRSTVWY' + 'BJZOUX';
# nucleic 'ACGT'/'ACGU' + ambiguity codes RYMKSWHBVDN).
_LETTERS = {
    "protein": re.compile(r"[ACDEFGHIKLMNPQRSTVWYBJZOUX]*"),
    "rna": re.compile(r"[ACGTURYMKSWHBVDN]*"),
    "dna": re.compile(r"[ACGTURYMKSWHBVDN]*"),
}


def alphabet_for(molecule: str):
    from pyhmmer import easel

    return {"protein": easel.Alphabet.amino, "rna": easel.Alphabet.rna,
            "dna": easel.Alphabet.dna}[molecule]()


@dataclass(frozen=True)
class Database:
    path: str
    molecule: str
    block: object            # pyhmmer.easel.DigitalSequenceBlock
    residues: int

    def __len__(self) -> int:
        return len(self.block)


def database_signature(path: str | os.PathLike) -> dict:
    """What identifies a database file's content for the result cache: resolved path, size and
    modification time (nanoseconds). Raises :class:`InputError` when the file is missing."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(path, None, "sequence database not found; expected a FASTA file "
                         "(optionally .gz)") from None
    if not p.is_file():
        raise InputError(path, None, "not a file; expected a FASTA sequence database")
    return {"path": os.fspath(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _open_text(path: Path):
    with path.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _records(path: Path):
    """``(index, header, sequence)`` per record, checking the FASTA layout as it goes."""
    src = os.fspath(path)
    header: str | None = None
    parts: list[str] = []
    index = -1
    try:
        with _open_text(path) as fh:
            for line_no, raw in enumerate(fh, start=1):
                line = raw.strip()
                if not line:
                    continue
                if line.startswith(">"):
                    if header is not None:
                        yield index, header, "".join(parts)
                    index += 1
                    header, parts = line[1:].strip(), []
                    if not header:
                        raise InputError(src, f"record {index} (line {line_no})",
                                         "empty header; expected '>NAME [DESCRIPTION]'")
                    continue
                if header is None:
                    raise InputError(src, f"line {line_no}", "text before the first '>' header; "
                                     "expected a FASTA sequence database")
                parts.append("".join(line.split()))
    except UnicodeDecodeError as err:
        raise InputError(src, None, f"not UTF-8 text ({err.reason}); expected a FASTA sequence "
                         "database (optionally gzipped)") from None
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(src, None, f"unreadable ({err}); expected a FASTA sequence database "
                         "(optionally gzipped)") from None
    if header is not None:
        yield index, header, "".join(parts)


def _read(path: Path, molecule: str) -> Database:
    from pyhmmer import easel

    src = os.fspath(path)
    alphabet = alphabet_for(molecule)
    allowed = _LETTERS[molecule]
    seqs = []
    residues = 0
    for index, header, seq in _records(path):
        name, _, description = header.partition(" ")
        seq = seq.upper().removesuffix("*")
        if not seq:
            raise InputError(src, f"record {index} ({name})", "no residues; expected a sequence "
                             "after the header")
        if not allowed.fullmatch(seq):
            bad = next(c for c in seq if not allowed.fullmatch(c))
            raise InputError(src, f"record {index} ({name})", f"letter {bad!r}; expected "
                             f"{molecule} letters (IUPAC)")
        seqs.append(easel.TextSequence(name=name, description=description.strip(),
                                       sequence=seq).digitize(alphabet))
        residues += len(seq)
    if not seqs:
        raise InputError(src, None, "no sequences; expected a FASTA file with '>' records")
    return Database(src, molecule, easel.DigitalSequenceBlock(alphabet, seqs), residues)


_LOADED: dict[tuple, Database] = {}
_LOCK = threading.Lock()


def load_database(path: str | os.PathLike, molecule: str) -> Database:
    """The database at ``path`` in digital form; kept in memory for the process (keyed by path,
    size and mtime, so a changed file is read again)."""
    sig = database_signature(path)
    key = (sig["path"], sig["size"], sig["mtime_ns"], molecule)
    with _LOCK:
        if key not in _LOADED:
            for old in [k for k in _LOADED if k[0] == key[0]]:  # the file changed: drop it
                del _LOADED[old]
            _LOADED[key] = _read(Path(path), molecule)
        return _LOADED[key]
