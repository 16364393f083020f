"""AF2 inputs: one protein chain of an mmCIF (training, with its ground truth) or a query
sequence (prediction). A chain's MSAs and template hits are read by the shared
:mod:`fold_data.msa` and :mod:`fold_data.templates`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fold_data.errors import InputError

if TYPE_CHECKING:  # gemmi is imported only to read an mmCIF: a query sequence needs none
    from fold_data.mmcif import MmcifChain, MmcifStructure

__all__ = ["QUERY_LETTERS", "parse_protein_chain", "parse_query_sequence"]

QUERY_LETTERS = "ACDEFGHIKLMNPQRSTVWXY"  # 20 amino acids and X


def parse_protein_chain(
    mmcif_path: str | os.PathLike, chain_id: str
) -> tuple[MmcifStructure, MmcifChain]:
    """The structure of ``mmcif_path`` and its chain ``chain_id`` (author or label ID), which
    must be a protein chain (:class:`InputError` naming the file and chain otherwise)."""
    from fold_data.mmcif import parse_mmcif

    structure = parse_mmcif(mmcif_path)
    chain = structure.get_chain(chain_id)
    if chain.polymer_type != "protein":
        raise InputError(
            mmcif_path, f"chain {chain_id}", f"is {chain.polymer_type}; expected a protein chain"
        )
    return structure, chain


def parse_query_sequence(sequence: str) -> str:
    """``sequence`` stripped and upper-cased; :class:`InputError` when it is empty or has a
    letter outside :data:`QUERY_LETTERS`."""
    sequence = sequence.strip().upper()
    # B/J/O/U/Z are refused as the AF3 path does, not silently turned into UNK
    bad = sorted(set(sequence) - set(QUERY_LETTERS))
    if not sequence or bad:
        raise InputError(
            None, "query sequence",
            f"got {bad or 'an empty sequence'}; expected the letters {QUERY_LETTERS} (20 amino "
            "acids, X for unknown)",
        )
    return sequence
