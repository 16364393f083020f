"""The chains to search: from a FASTA, an AlphaFold3 input JSON or an mmCIF.

FASTA records are protein chains named A, B, ... unless the header says ``mol:rna`` or
``mol:dna`` (the PDB SEQRES convention). An AlphaFold3 input JSON gives its ``protein`` /
``rna`` / ``dna`` sequences (every ID of a multi-copy entry; ligands are not searched, and
modifications do not change the searched sequence, as in AF3). An mmCIF gives its polymer chains
(fold-data's mmCIF reader: full ``_entity_poly_seq``, modified residues as their parents), keyed
by author chain ID. No CCD is needed to search.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError

__all__ = ["SearchChain", "read_chains"]

_LETTERS = {"protein": set("ACDEFGHIKLMNPQRSTVWYX"), "rna": set("ACGUTN"), "dna": set("ACGTUN")}
_SAFE = re.compile(r"^[A-Za-z0-9]+$")


@dataclass(frozen=True)
class SearchChain:
    chain_id: str
    molecule: str   # 'protein' | 'rna' | 'dna'
    sequence: str


def check_chain(chain: SearchChain, source: str | None) -> SearchChain:
    record = f"chain {chain.chain_id}"
    if not _SAFE.match(chain.chain_id):
        raise InputError(source, record, "chain ID; expected letters and digits only (it names "
                         "the chain's output folder)")
    if chain.molecule not in _LETTERS:
        raise InputError(source, record, f"molecule {chain.molecule!r}; expected protein, rna "
                         "or dna")
    seq = chain.sequence.upper()
    if not seq:
        raise InputError(source, record, "empty query sequence; expected at least one residue")
    bad = sorted(set(seq) - _LETTERS[chain.molecule])
    if bad:
        raise InputError(source, record, f"letters {bad} in the {chain.molecule} query; expected "
                         f"{''.join(sorted(_LETTERS[chain.molecule]))}")
    return SearchChain(chain.chain_id, chain.molecule, seq)


def _fasta_chains(path: Path) -> list[SearchChain]:
    from fold_data.af3.parse import _chain_letter
    from fold_data.msa import parse_fasta

    chains = []
    for i, (desc, seq) in enumerate(parse_fasta(path)):
        mol = re.search(r"\bmol:(protein|rna|dna)\b", desc)
        chains.append(SearchChain(_chain_letter(i), mol.group(1) if mol else "protein",
                                  seq.replace("-", "").replace(".", "")))
    return chains


def _json_chains(path: Path) -> tuple[str, list[SearchChain]]:
    import json

    src = os.fspath(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(src, None, f"not a readable JSON file: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sequences"), list):
        raise InputError(src, "sequences", "expected an AlphaFold3 input JSON with a "
                         "'sequences' list")
    chains = []
    for i, item in enumerate(doc["sequences"]):
        record = f"sequences[{i}]"
        if not isinstance(item, dict) or len(item) != 1:
            raise InputError(src, record, "expected one of {'protein': ...}, {'rna': ...}, "
                             "{'dna': ...}, {'ligand': ...}")
        (kind, body), = item.items()
        if kind not in _LETTERS:
            continue  # ligands are not searched
        if not isinstance(body, dict) or not isinstance(body.get("sequence"), str):
            raise InputError(src, record, f"field '{kind}.sequence': expected a string")
        ids = body.get("id")
        ids = [ids] if isinstance(ids, str) else ids
        if not isinstance(ids, list) or not ids or not all(isinstance(x, str) for x in ids):
            raise InputError(src, record, f"field '{kind}.id': expected a chain ID or a list")
        chains += [SearchChain(cid, kind, body["sequence"]) for cid in ids]
    return str(doc.get("name") or path.stem), chains


def read_chains(path: str | os.PathLike) -> tuple[str, list[SearchChain]]:
    """``(entry name, polymer chains)`` of a ``.fasta``/``.fa``, ``.json`` or ``.cif`` file."""
    path = Path(path)
    src = os.fspath(path)
    if not path.is_file():
        raise InputError(src, None, "input not found; expected a FASTA, AF3 JSON or mmCIF file")
    suffix = path.suffix.lower()
    if suffix in (".fasta", ".fa", ".faa", ".fna"):
        name, chains = path.stem, _fasta_chains(path)
    elif suffix == ".json":
        name, chains = _json_chains(path)
    elif suffix in (".cif", ".mmcif") or path.name.endswith(".cif.gz"):
        from fold_data.mmcif import parse_mmcif

        structure = parse_mmcif(path)
        name = structure.pdb_id or path.name.split(".")[0]
        chains = [SearchChain(cid, c.polymer_type, c.sequence)
                  for cid, c in structure.chains.items() if c.polymer_type in _LETTERS]
    else:
        raise InputError(src, None, f"unknown input format {suffix!r}; expected .fasta, .json "
                         "(AlphaFold3 input) or .cif (mmCIF)")
    if not chains:
        raise InputError(src, None, "no polymer chains to search")
    name = re.sub(r"[^A-Za-z0-9]", "", name) or "query"
    return name, [check_chain(c, src) for c in chains]
