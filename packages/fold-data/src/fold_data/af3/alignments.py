"""Per-chain alignments of an AF3 training directory: which files feed each chain's MSA, its
species pairing and its templates.

Layout (OpenFold / OpenFold3 key alignment folders by chain, Protenix by sequence; both work)::

    <data>/mmcifs/<entry>.cif                    the complexes (ground truth)
    <data>/alignments/<entry>_<chain>/           per chain: <chain> is the author chain ID
    <data>/alignments/<sha256 of the sequence>/  or per sequence (one folder serves every copy)
    <data>/alignments/seq_to_pdb_index.json      or Protenix's map: sequence -> folder name
        *.a3m, *.sto          unpaired MSAs (uniref90_hits.sto, bfd_uniclust_hits.a3m,
                              mgnify_hits.sto, Protenix's non_pairing.a3m ...), concatenated in
                              AF2's order
        uniprot_hits.sto      the pairing database hits (Protenix: pairing.a3m): rows paired
                              across the entry's protein chains by species (AF3 supplement 2.3)
        hmm_output.sto        template hits (hmmsearch vs PDB seqres); or pdb70_hits.hhr
    <data>/template_mmcifs/   the template structures the hits name (default: <data>/mmcifs/)

A chain's folder is looked up as ``<entry>_<author chain>``, then as the folder of another chain
of the same entry with the same sequence (OpenFold's test data keeps one folder per homomer), then
as :func:`sequence_key` of its one-letter sequence, then through ``seq_to_pdb_index.json``.
Ligands have no alignments; a protein or RNA chain without a folder (DNA has no MSA in AF3) is
*reported* (:attr:`EntryAlignments.notes`): its MSA is its query row alone, never a silent hole.
Protenix's template hits, ``hmmsearch.a3m``, are A3M rows without the hits' PDB residue numbers,
which the template featurizer needs: they are reported, not read (give ``hmm_output.sto``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from fold_data.dataset import PAIRING_MSA, _alignment_files
from fold_data.errors import InputError

from .parse import Entry

__all__ = ["ALIGNED_TYPES", "PAIRING_FILES", "ChainAlignments", "EntryAlignments",
           "entry_alignments", "sequence_key", "template_mmcif_dirs"]

# Molecule types whose chains get alignments in AF3 (supplement 2.3: protein and RNA MSAs;
# DNA chains are their query row).
ALIGNED_TYPES = ("protein", "rna")


def sequence_key(sequence: str) -> str:
    """The folder name of a sequence-keyed alignment: sha256 hex digest of the one-letter
    sequence (upper case, ASCII)."""
    return hashlib.sha256(sequence.upper().encode("ascii")).hexdigest()


@dataclass(frozen=True)
class ChainAlignments:
    """The alignment files of one polymer chain (author chain ID ``chain_id``)."""

    chain_id: str
    folder: Path | None
    msa_paths: tuple[Path, ...] = ()  # unpaired MSAs, AF2 concatenation order
    pairing: Path | None = None  # uniprot_hits.sto: paired by species across chains
    template_hits: Path | None = None


@dataclass
class EntryAlignments:
    """What :func:`entry_alignments` found for one entry, in the arguments
    :func:`fold_data.af3.make_features` takes; ``notes``: one line per chain left with its
    query row alone (for the cache report)."""

    chains: dict[str, ChainAlignments] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def msa_paths(self) -> dict[str, list[Path]]:
        return {c: list(a.msa_paths) for c, a in self.chains.items() if a.msa_paths}

    @property
    def pairing_paths(self) -> dict[str, Path]:
        return {c: a.pairing for c, a in self.chains.items() if a.pairing is not None}

    @property
    def template_hits(self) -> dict[str, Path]:
        return {c: a.template_hits for c, a in self.chains.items() if a.template_hits is not None}


PAIRING_FILES = (PAIRING_MSA, "pairing.a3m")  # OpenFold's UniProt hits; Protenix's
UNREAD_TEMPLATE_HITS = "hmmsearch.a3m"  # Protenix's template hits as A3M (module docstring)
PROTENIX_INDEX = "seq_to_pdb_index.json"


def _folder_files(folder: Path) -> tuple[tuple[Path, ...], Path | None, Path | None]:
    msas, hits = _alignment_files(folder)
    pairing = [folder / n for n in PAIRING_FILES if (folder / n).is_file()]
    if len(pairing) > 1:
        raise InputError(folder, None, f"expected one pairing file, found "
                                       f"{', '.join(p.name for p in pairing)}")
    msas = tuple(p for p in msas if p.name not in (*PAIRING_FILES, UNREAD_TEMPLATE_HITS))
    return msas, (pairing[0] if pairing else None), hits


def _protenix_index(root: Path) -> dict[str, str]:
    path = root / PROTENIX_INDEX
    if not path.is_file():
        return {}
    import json

    try:
        doc = json.loads(path.read_text())
        return {str(seq).upper(): str(folder) for seq, folder in dict(doc).items()}
    except (ValueError, TypeError) as e:
        raise InputError(path, None, f"expected a JSON object sequence -> folder ({e})") from None


def entry_alignments(entry: Entry, align_root: str | os.PathLike | None,
                     name: str | None = None) -> EntryAlignments:
    """The alignment files of every protein / RNA chain of ``entry`` under ``align_root``
    (``<data>/alignments``; None or missing: no chain has any). ``name``: the entry's name in
    folder names (default ``entry.name``, the mmCIF's ``_entry.id`` in lower case)."""
    root = Path(align_root) if align_root is not None else None
    name = name or entry.name
    out = EntryAlignments()
    by_sequence: dict[str, Path] = {}
    polymers = [c for c in entry.chains if c.mol_type in ALIGNED_TYPES]
    # First pass: the chains that have a folder of their own, so homomer copies can share it.
    own = {}
    for chain in polymers:
        folder = root / f"{name}_{chain.author_id}" if root is not None else None
        if folder is not None and folder.is_dir():
            own[chain.author_id] = folder
            by_sequence.setdefault(chain.sequence, folder)
    index = _protenix_index(root) if root is not None else {}
    for chain in polymers:
        folder = own.get(chain.author_id) or by_sequence.get(chain.sequence)
        if folder is None and root is not None:
            hashed = root / sequence_key(chain.sequence)
            folder = hashed if hashed.is_dir() else None
        if folder is None and chain.sequence.upper() in index:
            mapped = root / index[chain.sequence.upper()]
            if not mapped.is_dir():
                raise InputError(root / PROTENIX_INDEX, f"{name} chain {chain.author_id}",
                                 f"the sequence's folder {mapped.name}/ does not exist")
            folder = mapped
        if folder is None:
            where = (f"no folder {name}_{chain.author_id}/ or {sequence_key(chain.sequence)[:12]}"
                     f".../ in {root}" if root is not None else "no alignments directory")
            out.notes.append(f"{name} chain {chain.author_id} ({chain.mol_type}, "
                             f"{len(chain.sequence)} residues): {where}; MSA is the query row "
                             "alone, no templates")
            continue
        msas, pairing, hits = _folder_files(folder)
        if chain.mol_type != "protein":  # AF3 pairs and templates protein chains only
            pairing = hits = None
        elif hits is None and (folder / UNREAD_TEMPLATE_HITS).is_file():
            out.notes.append(f"{name} chain {chain.author_id}: {folder / UNREAD_TEMPLATE_HITS} "
                             "(template hits as A3M) is not read; no templates (give "
                             "hmm_output.sto or an .hhr)")
        if not msas:
            out.notes.append(f"{name} chain {chain.author_id} ({chain.mol_type}): {folder} holds "
                             "no unpaired MSA file (*.a3m, *.sto); MSA is the query row alone")
        if not msas and pairing is None and hits is None:
            continue
        out.chains[chain.author_id] = ChainAlignments(chain.author_id, folder, msas, pairing, hits)
    return out


def template_mmcif_dirs(data_dir: str | os.PathLike) -> list[Path]:
    """Where a training directory's template structures are looked up, in order:
    ``template_mmcifs/`` (when present), then ``mmcifs/``."""
    data = Path(data_dir)
    dirs = [data / sub for sub in ("template_mmcifs", "mmcifs") if (data / sub).is_dir()]
    if not dirs:
        raise InputError(data, None, "expected mmcifs/ (or template_mmcifs/) for the template "
                                     "hits")
    return dirs
