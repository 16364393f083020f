"""The one table that picks a file's reader by its suffix.

Three kinds of input are read by format, each with its own readers:

* ``msa``: ``.a3m`` (HHblits), ``.sto`` (jackhmmer Stockholm); a reader takes ``(path)``.
* ``template_hits``: ``.hhr`` (HHsearch), ``.sto`` (hmmsearch Stockholm); a reader takes
  ``(path, query_sequence)``.
* ``af3_entry``: ``.json`` (AlphaFold3 input), mmCIF complexes, FASTA; a reader takes
  ``(path, *, ccd, allow_outside_paths)``.

A ``.sto`` file is both an MSA and a hits format, so callers always name the kind they read.
Readers are imported when first called: this module needs neither gemmi nor RDKit.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError

__all__ = [
    "FASTA_SUFFIXES",
    "MMCIF_SUFFIXES",
    "READERS",
    "FileKind",
    "file_suffix",
    "kinds_of",
    "reader",
    "suffixes",
]

MMCIF_SUFFIXES = (".cif", ".mmcif", ".cif.gz")
FASTA_SUFFIXES = (".fasta", ".fa", ".faa")


def file_suffix(path: str | os.PathLike) -> str:
    """The lower-case suffix that picks the reader: the last one, the last two when gzipped."""
    parts = [s.lower() for s in Path(path).suffixes]
    if parts and parts[-1] == ".gz":
        return "".join(parts[-2:])
    return parts[-1] if parts else ""


def _imported(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _lazy(target: str) -> Callable:
    """``module:function``, imported on the first call."""
    return lambda *args, **kwargs: _imported(target)(*args, **kwargs)


def _hhr(path, query_sequence):  # an .hhr file names its own query
    return _imported("fold_data.template_hits:parse_hhr")(path)


def _af3_json(path, *, ccd, allow_outside_paths):
    return _imported("fold_data.af3.parse:parse_af3_json")(
        path, ccd=ccd, allow_outside_paths=allow_outside_paths)


def _af3_mmcif(path, *, ccd, allow_outside_paths):  # an mmCIF names no other file
    return _imported("fold_data.af3.parse:parse_complex_mmcif")(path, ccd=ccd)


def _af3_fasta(path, *, ccd, allow_outside_paths):  # sequences only: no CCD, no paths
    return _imported("fold_data.af3.parse:parse_fasta_entry")(path)


@dataclass(frozen=True)
class FileKind:
    """One kind of input: its readers by suffix and the words of its error message."""

    what: str  # "unknown {what} {suffix!r}; expected {expected}"
    expected: str
    readers: Mapping[str, Callable]


READERS: dict[str, FileKind] = {
    "msa": FileKind("MSA format", ".a3m or .sto", {
        ".a3m": _lazy("fold_data.msa:parse_a3m"),
        ".sto": _lazy("fold_data.msa:parse_stockholm"),
    }),
    "template_hits": FileKind("template hits format", ".hhr or .sto", {
        ".hhr": _hhr,
        ".sto": _lazy("fold_data.template_hits:parse_hmmsearch_sto"),
    }),
    "af3_entry": FileKind(
        "input format", ".json (AlphaFold3 input), .cif (mmCIF) or .fasta", {
            ".json": _af3_json,
            **dict.fromkeys(MMCIF_SUFFIXES, _af3_mmcif),
            **dict.fromkeys(FASTA_SUFFIXES, _af3_fasta),
        }),
}


def reader(path: str | os.PathLike, kind: str) -> Callable:
    """The reader of ``path`` as a ``kind`` file; :class:`InputError` naming the file when its
    suffix is not one of the kind's."""
    table = READERS[kind]
    suffix = file_suffix(path)
    if suffix not in table.readers:
        raise InputError(path, None, f"unknown {table.what} {suffix!r}; expected {table.expected}")
    return table.readers[suffix]


def suffixes(kind: str) -> tuple[str, ...]:
    """The suffixes that ``kind`` reads."""
    return tuple(READERS[kind].readers)


def kinds_of(path: str | os.PathLike) -> tuple[str, ...]:
    """Every kind whose readers take ``path``'s suffix (``.sto``: both MSA and template hits)."""
    suffix = file_suffix(path)
    return tuple(kind for kind, table in READERS.items() if suffix in table.readers)
