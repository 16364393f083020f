"""Discover the training chains of a data directory (OpenFold's layout).

Layout::

    <root>/mmcifs/<pdb>.cif
    <root>/alignments/<pdb>_<chain>/uniref90_hits.sto, bfd_uniclust_hits.a3m, mgnify_hits.sto, ...
                                    hmm_output.sto | pdb70_hits.hhr   (template hits)
                                    uniprot_hits.sto                  (multimer pairing, not an MSA)

``<chain>`` is the author chain ID (``auth_asym_id``), as in OpenFold's alignment directories.

Choices, documented here because they decide what a build does:

* An alignment directory whose mmCIF is missing is skipped with an :class:`InputWarning` when
  chains are discovered; a chain named explicitly whose mmCIF is missing is an :class:`InputError`.
* A chain named explicitly whose alignment directory is absent is a single-sequence chain:
  no MSA files and no template hits.
* MSA files are ordered as the AF2 supplement 1.2.2 concatenates them (UniRef90, then
  BFD/Uniclust30/UniRef30, then MGnify, then any other file by name), so the featurizer's
  de-duplication keeps the same rows whatever order the filesystem lists them in.
* More than one template-hit file in one directory is an :class:`InputError` (never a silent pick).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError, InputWarning
from fold_data.readers import kinds_of

__all__ = ["ChainEntry", "discover_chains", "parse_chain_name"]

# Template-hit files: hmmsearch Stockholm (AF2-multimer / OpenFold) or HHsearch .hhr (AF2-monomer).
TEMPLATE_HIT_STO = "hmm_output.sto"
# jackhmmer vs UniProt: used to pair MSAs across chains in multimer mode, not a per-chain MSA.
PAIRING_MSA = "uniprot_hits.sto"
# AF2 supplement 1.2.2 concatenation order, by file-name prefix.
_MSA_ORDER = ("uniref90", "bfd", "uniclust", "uniref30", "mgnify")
_CHAIN_NAME = re.compile(r"^(?P<pdb>[A-Za-z0-9]+)_(?P<chain>[A-Za-z0-9]+)$")


@dataclass(frozen=True)
class ChainEntry:
    """One chain to featurize: the files that ``make_features`` reads for it."""

    name: str  # "<pdb>_<chain>", e.g. "4zey_A"
    mmcif_path: Path
    chain_id: str  # author chain ID
    msa_paths: tuple[Path, ...]  # in AF2 concatenation order; empty for a single-sequence chain
    template_hits: Path | None

    @property
    def input_paths(self) -> tuple[Path, ...]:
        """Every file the chain's features are a function of (what the cache key hashes)."""
        paths = (self.mmcif_path, *self.msa_paths)
        return paths + ((self.template_hits,) if self.template_hits is not None else ())


def parse_chain_name(name: str, *, where: str | os.PathLike | None = None) -> tuple[str, str]:
    """Split ``"4zey_A"`` into ``("4zey", "A")``; :class:`InputError` if not ``<pdb>_<chain>``."""
    m = _CHAIN_NAME.match(name)
    if m is None:
        raise InputError(where, name, "expected a chain name '<pdb>_<chain>', e.g. '4zey_A'")
    return m["pdb"], m["chain"]


def _msa_rank(path: Path) -> tuple[int, str]:
    stem = path.name.lower()
    for rank, prefix in enumerate(_MSA_ORDER):
        if stem.startswith(prefix):
            return rank, stem
    return len(_MSA_ORDER), stem


def _find_mmcif(mmcif_dir: Path, pdb: str) -> Path | None:
    for stem in dict.fromkeys((pdb, pdb.lower(), pdb.upper())):
        path = mmcif_dir / f"{stem}.cif"
        if path.is_file():
            return path
    return None


def _alignment_files(align_dir: Path) -> tuple[tuple[Path, ...], Path | None]:
    """(MSA files in AF2 order, template-hit file or None) of one alignment directory."""
    msas, hits = [], []
    for path in align_dir.iterdir():
        if not path.is_file():
            continue
        kinds = kinds_of(path)  # a .sto is both kinds: the layout tells them apart by name
        if path.name == TEMPLATE_HIT_STO or kinds == ("template_hits",):
            hits.append(path)
        elif "msa" in kinds and path.name != PAIRING_MSA:
            msas.append(path)
    if len(hits) > 1:
        names = ", ".join(sorted(p.name for p in hits))
        raise InputError(align_dir, None, f"expected at most one template-hit file, found {names}")
    return tuple(sorted(msas, key=_msa_rank)), (hits[0] if hits else None)


def discover_chains(
    root: str | os.PathLike, chains: Iterable[str] | None = None
) -> list[ChainEntry]:
    """List the chains of data directory ``root``, sorted by name.

    ``chains=None`` takes every ``alignments/<pdb>_<chain>/`` directory (skipping, with a warning,
    those whose mmCIF is missing). An explicit list takes exactly those chains, in the given order;
    a missing mmCIF is then an error and a missing alignment directory means a single-sequence
    chain.
    """
    root = Path(root)
    mmcif_dir = root / "mmcifs"
    align_root = root / "alignments"
    if not mmcif_dir.is_dir():
        raise InputError(mmcif_dir, None, "expected a directory of <pdb>.cif files")

    if chains is None:
        if not align_root.is_dir():
            raise InputError(
                align_root, None,
                "expected a directory of <pdb>_<chain>/ alignment folders "
                "(or name the chains explicitly to featurize them without MSAs)",
            )
        entries = []
        for align_dir in sorted(p for p in align_root.iterdir() if p.is_dir()):
            if _CHAIN_NAME.match(align_dir.name) is None:
                continue  # not a per-chain folder (OpenFold's test data has loose files here)
            pdb, chain = parse_chain_name(align_dir.name)
            mmcif = _find_mmcif(mmcif_dir, pdb)
            if mmcif is None:
                warnings.warn(
                    str(InputError(align_dir, align_dir.name,
                                   f"no mmCIF {mmcif_dir / (pdb + '.cif')}; chain skipped")),
                    InputWarning, stacklevel=2,
                )
                continue
            msas, hits = _alignment_files(align_dir)
            entries.append(ChainEntry(align_dir.name, mmcif, chain, msas, hits))
        if not entries:
            raise InputError(
                align_root, None, "expected at least one <pdb>_<chain>/ folder with its mmCIF"
            )
        return entries

    entries = []
    seen: set[str] = set()
    for name in chains:
        pdb, chain = parse_chain_name(name, where=root)
        if name in seen:
            raise InputError(root, name, "chain listed twice")
        seen.add(name)
        mmcif = _find_mmcif(mmcif_dir, pdb)
        if mmcif is None:
            raise InputError(mmcif_dir / f"{pdb}.cif", name, "expected the chain's mmCIF file")
        align_dir = align_root / name
        msas, hits = _alignment_files(align_dir) if align_dir.is_dir() else ((), None)
        entries.append(ChainEntry(name, mmcif, chain, msas, hits))
    return entries
