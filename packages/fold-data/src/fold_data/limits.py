"""Input sizes, estimated before any work, and the limits they are checked against.

An absurd input used to fail late and badly: a 1M-residue mmCIF in a numpy ``MemoryError``, an
AF3 JSON of 2000 chains in a 256 GB MSA allocation, a 100 000-residue protein in a run killed
hours later. Here each input is sized cheaply first and refused with the numbers and the options
when it exceeds a limit:

* :func:`mmcif_size`: one streaming pass over the file's text (no gemmi parse): ``_atom_site``
  rows, and polymer residues = ``_entity_poly_seq`` rows of each entity times its
  ``_struct_asym`` copies;
* :func:`sequence_size`: an AF2 query and its MSA files (rows counted, not parsed);
* :func:`entry_size`: an AF3 :class:`~fold_data.af3.parse.Entry` (tokens: one per standard
  polymer residue, one per heavy atom of ligands and modified residues, from the CCD or the
  SMILES; MSA rows of each chain's alignment, as ``make_features`` stacks them).

:class:`SizeLimits` are counts and bytes of host memory (fold-data needs no torch); device memory
for the model is fold-train's business (``fold_train.memory_estimate``). The limits in force are
:func:`current_limits`, set for a block with :func:`use_limits` (the ``--max-tokens`` /
``--max-atoms`` / ``--max-msa-memory`` options of ``fold-data cache`` and ``fold-train``).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import gzip
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError, InputWarning

__all__ = ["InputSize", "InputTooLarge", "SizeLimits", "SizeWarning", "add_limit_options",
           "check_mmcif", "check_size", "current_limits", "entry_size", "format_bytes",
           "limits_from_args",
           "mmcif_size", "msa_rows", "parse_bytes", "sequence_size", "use_limits"]

GIB = 2**30
MSA_BYTES_PER_CELL = 8  # int32 residue code + float32 deletion count per (row, token)
AF3_MAX_MSA_ROWS = 16384  # rows per chain that fold_data.af3.make_features keeps


class InputTooLarge(InputError):
    """An input exceeds a size limit; the message gives the numbers and the options."""


class SizeWarning(InputWarning):
    """An input is close to a limit: it may not fit."""


@dataclass(frozen=True)
class SizeLimits:
    """Largest input fold-data featurises (counts; bytes of host memory).

    The defaults pass every entry of the PDB's asymmetric units that AF2/AF3 training uses and
    stop what cannot fit a machine: ``max_tokens`` AF3 tokens / polymer residues of one input,
    ``max_atoms`` heavy atoms (mmCIF: ``_atom_site`` rows of all models), ``max_msa_bytes`` of MSA
    features (rows x tokens x 8 bytes)."""

    max_tokens: int = 400_000
    max_atoms: int = 4_000_000
    max_msa_bytes: int = 16 * GIB


_LIMITS: contextvars.ContextVar[SizeLimits | None] = contextvars.ContextVar(
    "fold_data_size_limits", default=None)


def current_limits() -> SizeLimits:
    """The limits in force (the defaults unless inside :func:`use_limits`)."""
    return _LIMITS.get() or SizeLimits()


@contextlib.contextmanager
def use_limits(limits: SizeLimits | None) -> Iterator[SizeLimits]:
    """Make ``limits`` (None: keep the current ones) the limits in force inside the block."""
    token = _LIMITS.set(limits or current_limits())
    try:
        yield current_limits()
    finally:
        _LIMITS.reset(token)


@dataclass(frozen=True)
class InputSize:
    """What an input will cost, estimated before featurising it.

    ``n_tokens``: AF3 tokens, AF2 residues (an mmCIF: its polymer residues); ``n_atoms``: heavy
    atoms (an mmCIF: ``_atom_site`` rows); ``n_msa_rows``: rows of the MSA features (the deepest
    chain's for AF3); ``largest``: the biggest part, for messages."""

    source: str
    n_chains: int
    n_tokens: int
    n_atoms: int
    n_msa_rows: int = 1
    largest: str = ""

    @property
    def msa_bytes(self) -> int:
        """Bytes of the MSA features ``[N_msa, N_token]`` (code + deletion count)."""
        return self.n_msa_rows * self.n_tokens * MSA_BYTES_PER_CELL

    def describe(self) -> str:
        part = f"; largest: {self.largest}" if self.largest else ""
        return (f"{self.n_chains} chains, {self.n_tokens} tokens, {self.n_atoms} atoms, "
                f"{self.n_msa_rows} MSA rows{part}")


def format_bytes(n: float) -> str:
    """``n`` bytes in MiB, GiB or TiB, one decimal."""
    for unit, size in (("TiB", 2**40), ("GiB", GIB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**20:.1f} MiB"


def check_size(size: InputSize, limits: SizeLimits | None = None, *,
               record: str | None = None) -> None:
    """Raise :class:`InputTooLarge` naming ``size.source`` when ``size`` exceeds ``limits``
    (default: :func:`current_limits`), with every number exceeded and the options."""
    limits = limits or current_limits()
    over = []
    if size.n_tokens > limits.max_tokens:
        over.append(f"{size.n_tokens} tokens/residues > the limit of {limits.max_tokens} "
                    "(--max-tokens)")
    if size.n_atoms > limits.max_atoms:
        over.append(f"{size.n_atoms} atoms > the limit of {limits.max_atoms} (--max-atoms)")
    if size.msa_bytes > limits.max_msa_bytes:
        over.append(f"MSA features of {size.n_msa_rows} rows x {size.n_tokens} tokens = "
                    f"{format_bytes(size.msa_bytes)} > the limit of "
                    f"{format_bytes(limits.max_msa_bytes)} (--max-msa-memory)")
    if not over:
        return
    raise InputTooLarge(size.source, record, (
        f"input too large to featurise: {'; '.join(over)} ({size.describe()}). Options: crop the "
        "input (fewer chains or residues, a shallower MSA), or, on a machine with the memory, "
        "raise the limit with the option named"))


# -- mmCIF -----------------------------------------------------------------------------------------
def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _scan_mmcif(path: Path) -> tuple[int, Counter, Counter]:
    """``(_atom_site rows, _entity_poly_seq rows per entity, _struct_asym chains per entity)``
    in one pass over the text: loops are read row by row (one row per line, as wwPDB writes
    them), ``_struct_asym`` also as key-value pairs; semicolon text fields are skipped."""
    atom_rows, seq_rows, copies = 0, Counter(), Counter()
    tags: list[str] = []
    in_loop_tags = in_rows = in_text = False
    pair_asym: dict[str, str] = {}
    with _open(path) as f:
        for line in f:
            if line[:1] == b";":
                in_text = not in_text
                continue
            if in_text:
                continue
            stripped = line.strip()
            if not stripped or stripped[:1] == b"#" or stripped.startswith(b"data_"):
                in_loop_tags = in_rows = False
                continue
            if stripped.startswith(b"loop_"):
                tags, in_loop_tags, in_rows = [], True, False
                continue
            if stripped[:1] == b"_":
                if in_loop_tags:
                    tags.append(stripped.split()[0].decode("ascii", "replace").lower())
                    continue
                in_rows = False
                key, _, value = stripped.decode("utf-8", "replace").partition(" ")
                if key.lower() in ("_struct_asym.id", "_struct_asym.entity_id"):
                    pair_asym[key.lower()] = value.strip().strip("'\"")
                continue
            if in_loop_tags:
                in_loop_tags, in_rows = False, True
            if not in_rows or not tags:
                continue
            category = tags[0].partition(".")[0]
            if category == "_atom_site":
                atom_rows += 1
            elif category in ("_entity_poly_seq", "_struct_asym"):
                values = stripped.split()
                column = f"{category}.entity_id"
                if column in tags and len(values) == len(tags):
                    entity = values[tags.index(column)].decode("utf-8", "replace")
                    (seq_rows if category == "_entity_poly_seq" else copies)[entity] += 1
    if "_struct_asym.entity_id" in pair_asym:
        copies[pair_asym["_struct_asym.entity_id"]] += 1
    return atom_rows, seq_rows, copies


def mmcif_size(path: str | os.PathLike) -> InputSize:
    """The size of an mmCIF file from one pass over its text (see the module docstring)."""
    path = Path(path)
    try:
        atom_rows, seq_rows, copies = _scan_mmcif(path)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(path, None, f"not a readable mmCIF file: {e}") from None
    per_entity = {e: n * max(1, copies.get(e, 0)) for e, n in seq_rows.items()}
    residues = sum(per_entity.values())
    largest = max(per_entity, key=per_entity.get, default=None)
    desc = (f"entity {largest}: {seq_rows[largest]} residues x {max(1, copies.get(largest, 0))} "
            "chains" if largest is not None else "")
    return InputSize(os.fspath(path), sum(max(1, copies.get(e, 0)) for e in seq_rows),
                     residues, atom_rows, 1, desc)


def check_mmcif(path: str | os.PathLike) -> None:
    """Refuse an mmCIF over the limits in force before it is parsed (a file that cannot be read
    is left to the parser, which says why)."""
    try:
        size = mmcif_size(path)
    except InputError:
        return
    check_size(size, record="whole file")


# -- MSAs and AF2 queries --------------------------------------------------------------------------
def msa_rows(path: str | os.PathLike) -> int:
    """Sequences in an alignment file, counted, not parsed: ``>`` headers of an A3M/FASTA, the
    distinct row names of a Stockholm file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(path, None, f"cannot read the alignment: {e.strerror or e}") from None
    if path.suffix.lower() == ".sto" or data.startswith(b"# STOCKHOLM"):
        return len({ln.split()[0] for ln in data.splitlines()
                    if ln.strip() and not ln.startswith((b"#", b"//"))})
    return data.count(b"\n>") + data.startswith(b">")


def sequence_size(source: str | os.PathLike | None, sequence: str,
                  msa_paths: Sequence[str | os.PathLike] = (), *, name: str = "",
                  max_rows: int | None = None) -> InputSize:
    """An AF2 query of ``sequence`` with the alignments ``msa_paths`` (rows summed, the query
    counted once, at most ``max_rows``)."""
    rows = 1 + sum(max(0, msa_rows(p) - 1) for p in msa_paths)
    rows = rows if max_rows is None else min(rows, max_rows)
    n = len(sequence)
    # heavy atoms: about 8 per residue (the mean of the 20 amino acids is 7.9)
    return InputSize("" if source is None else os.fspath(source), 1, n, 8 * n, rows,
                     f"{name or 'query'}: {n} residues" if n else "")


# -- AF3 entries -----------------------------------------------------------------------------------
_SMILES_ATOM = re.compile(r"\[([^\]]+)\]|Br|Cl|[BCNOPSFI]|[bcnops]")


def _smiles_heavy_atoms(smiles: str) -> int:
    """Heavy atoms of a SMILES string without RDKit: organic-subset letters and bracket atoms
    that are not hydrogen."""
    n = 0
    for m in _SMILES_ATOM.finditer(smiles):
        bracket = m.group(1)
        if bracket is None or not re.match(r"\d*(H|D)(?![a-z])", bracket):
            n += 1
    return n


def _component_atoms(ccd, code: str, memo: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """``(heavy atoms, heavy atoms that stay in a polymer)`` of a CCD component (leaving atoms
    such as OXT go when the next residue links); a code the CCD lacks counts 8."""
    if code not in memo:
        comp = ccd.get(code) if ccd is not None else None
        if comp is None:
            memo[code] = (8, 8)
        else:
            heavy = ~comp.is_hydrogen
            memo[code] = (int(heavy.sum()), int((heavy & ~comp.leaving).sum()))
    return memo[code]


def entry_size(entry, ccd=None, msa_paths: dict | None = None) -> InputSize:
    """The size of an AF3 entry before tokenization: tokens and heavy atoms from the CCD (a code
    it lacks counts 8 atoms; a SMILES by its atoms), MSA rows as ``make_features`` stacks them
    (each chain's rows, capped at 16384; the deepest chain sets the depth)."""
    from fold_data.af3.tokenizer import STANDARD_RESIDUES

    memo: dict[str, tuple[int, int]] = {}
    tokens = atoms = depth = 0
    largest, largest_n = "", -1
    msa_paths = msa_paths or {}
    for chain in entry.chains:
        if chain.smiles is not None:
            n_atoms = _smiles_heavy_atoms(chain.smiles)
            n_tokens = n_atoms
        else:
            standard = STANDARD_RESIDUES.get(chain.mol_type, frozenset())
            counts = [_component_atoms(ccd, code, memo) for code in chain.residues]
            # a polymer residue loses its leaving atoms to the link, but the last keeps them
            per = ([linked for _, linked in counts[:-1]] + [counts[-1][0]]
                   if chain.is_polymer and counts else [whole for whole, _ in counts])
            n_atoms = sum(per)
            n_tokens = sum(1 if chain.is_polymer and code in standard else n
                           for code, n in zip(chain.residues, per))
        tokens, atoms = tokens + n_tokens, atoms + n_atoms
        if n_tokens > largest_n:
            largest, largest_n = f"chain {chain.chain_id}: {n_tokens} tokens", n_tokens
        if chain.is_polymer:
            paths = msa_paths.get(chain.author_id) or chain.msa_paths
            if paths:
                rows = 1 + sum(max(0, msa_rows(p) - 1) for p in paths)
            elif chain.unpaired_msa:
                rows = max(1, chain.unpaired_msa.count("\n>") + chain.unpaired_msa.startswith(">"))
            else:
                rows = 1
            depth = max(depth, min(rows, AF3_MAX_MSA_ROWS))
    return InputSize(entry.source or entry.name, len(entry.chains), tokens, atoms, max(1, depth),
                     largest)


# -- options ---------------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"16GiB"``, ``"500MB"``, ``"1e9"`` -> bytes; ``argparse.ArgumentTypeError`` otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS or float(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"expected a size such as 16GiB, 500MB or 1e9 bytes, "
                                         f"got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--max-tokens``, ``--max-atoms``, ``--max-msa-memory`` (defaults: :class:`SizeLimits`)."""
    d = SizeLimits()
    parser.add_argument("--max-tokens", type=_positive, metavar="N",
                        help=f"refuse inputs of more AF3 tokens / residues (default "
                             f"{d.max_tokens})")
    parser.add_argument("--max-atoms", type=_positive, metavar="N",
                        help=f"refuse inputs of more heavy atoms (default {d.max_atoms})")
    parser.add_argument("--max-msa-memory", type=parse_bytes, metavar="BYTES",
                        help=f"refuse inputs whose MSA features need more host memory (default "
                             f"{d.max_msa_bytes // GIB}GiB)")


def limits_from_args(args: argparse.Namespace) -> SizeLimits:
    """The :class:`SizeLimits` of :func:`add_limit_options`' options (defaults where unset)."""
    d = SizeLimits()
    return SizeLimits(max_tokens=getattr(args, "max_tokens", None) or d.max_tokens,
                      max_atoms=getattr(args, "max_atoms", None) or d.max_atoms,
                      max_msa_bytes=getattr(args, "max_msa_memory", None) or d.max_msa_bytes)
