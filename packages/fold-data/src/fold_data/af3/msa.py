"""AF3 MSA features per token (AF3 supplement 2.3 and Table 5), from per-chain MSAs.

Each polymer chain has its own alignment (files ``.a3m`` / ``.sto`` read by
:func:`fold_data.msa.load_msa` for proteins, A3M text from the AF3 JSON's
``unpairedMsa``, or only the query). The entry's MSA stacks them side by side: row 0 is every
chain's query; row ``r > 0`` holds row ``r`` of each chain's own alignment, gaps where a chain has
fewer rows (AF3's unpaired MSA layout; rows are not paired by species here). Ligand tokens have
their ``restype`` in row 0 and gaps below; the tokens of an atomized (modified) residue repeat
that residue's column.

``profile`` [N_token, 32] and ``deletion_mean`` [N_token] are over each chain's own rows (gap rows
added only to line chains up do not count), so they do not depend on the other chains.

Paired rows (AF3 supplement 2.3; :mod:`fold_data.search` writes them): with ``paired_paths``,
each protein chain's A3M of rows paired by species (row ``i`` of every chain's file from one
species, query first) is placed right after row 0, side by side, gaps for chains without one;
the unpaired rows follow. Paired rows are read as they are (no deduplication: gap rows are part
of the pairing) and do not enter ``profile`` / ``deletion_mean``.

Species pairing of training data: with ``pairing_paths`` (per protein chain the hits of the
pairing database, UniProt: ``uniprot_hits.sto`` of the training layout,
:mod:`fold_data.af3.alignments`) the paired rows are made here by
:func:`fold_data.search.pairing.pair_by_species`, the rule the search path uses (AF-Multimer
7.3.1: row ``k`` of every chain from one species, rows covering more chains first; homomer copies
share their entity's rows), and placed as the ``paired_paths`` rows are.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from fold_data.errors import InputError
from fold_data.msa import Msa, check_query, load_msa, parse_a3m
from fold_data.msa import make_msa_features as protein_msa_features

from .parse import Chain, Entry
from .tokenizer import GAP, NUM_RESTYPES, restype_of

__all__ = ["make_msa_features", "chain_msa", "paired_chain_msa", "species_paired_msas"]

_PROTEIN_GAP = 21  # fold_data.msa's gap code


def _a3m_text(text: str) -> Msa:
    """Parse A3M text with :func:`fold_data.msa.parse_a3m` (which reads files)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "unpairedMsa.a3m"
        path.write_text(text)
        msa = parse_a3m(path)
    return Msa(msa.sequences, msa.deletion_matrix, msa.descriptions, "unpairedMsa")


def chain_msa(
    chain: Chain, msa_paths: list[str | os.PathLike] | tuple = (), *, max_rows: int | None = None,
    source: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One polymer chain's MSA in the 32-class alphabet: ``msa`` [N_rows, N_res] int32 and
    ``deletions`` [N_rows, N_res] float32 (counts). Row 0 is the chain's own residues."""
    n_res = len(chain.residues)
    query = np.asarray([restype_of(c, chain.mol_type) for c in chain.residues], np.int32)
    record = f"{chain.mol_type} {chain.chain_id}"
    if chain.mol_type == "protein":
        if chain.unpaired_msa and not msa_paths:
            msa = _a3m_text(chain.unpaired_msa)
            check_query(msa, chain.sequence, path=source)
            feats = protein_msa_features(msa)
        else:
            feats = load_msa(chain.sequence, list(msa_paths))
        codes = feats["msa"].copy()
        codes[codes == _PROTEIN_GAP] = GAP
        deletions = feats["deletion_matrix"].astype(np.float32)
    elif chain.mol_type in ("rna", "dna") and (chain.unpaired_msa or msa_paths):
        if msa_paths:  # A3M or Stockholm (nhmmer), by suffix; merged as the protein files
            from fold_data.msa import merge_msas
            from fold_data.readers import reader

            files = [reader(p, "msa")(p) for p in msa_paths]
            for path, one in zip(msa_paths, files):  # each file's query is this chain
                check_query(one, chain.sequence, path=path)
            msa = merge_msas(files)
        else:
            msa = _a3m_text(chain.unpaired_msa or "")
        if len(msa) == 0 or msa.num_res != n_res:
            raise InputError(source, record, f"field 'unpairedMsa': the alignment has "
                             f"{msa.num_res} columns; expected {n_res} (the chain's length)")
        table = {c: restype_of(code, chain.mol_type) for c, code in
                 zip("ACGUT", ["A", "C", "G", "U", "DT"] if chain.mol_type == "rna"
                     else ["DA", "DC", "DG", "DU", "DT"])}
        table["-"] = GAP
        unknown = restype_of("N" if chain.mol_type == "rna" else "DN", chain.mol_type)
        codes = np.asarray([[table.get(ch, unknown) for ch in row] for row in msa.sequences],
                           dtype=np.int32)
        deletions = np.asarray(msa.deletion_matrix, dtype=np.float32)
    else:
        codes, deletions = query[None], np.zeros((1, n_res), np.float32)
    codes[0] = query  # modified residues keep their parent's type, as in the tokens
    if max_rows is not None:
        codes, deletions = codes[:max_rows], deletions[:max_rows]
    return codes.astype(np.int32), deletions


def paired_chain_msa(chain: Chain, path: str | os.PathLike | Msa
                     ) -> tuple[np.ndarray, np.ndarray]:
    """A protein chain's paired rows (query first) in the 32-class alphabet, not deduplicated:
    ``msa`` [N_paired + 1, N_res] int32 and ``deletions`` float32. ``path``: an A3M file, or the
    rows already paired (:func:`species_paired_msas`)."""
    where = path.source if isinstance(path, Msa) else path
    if chain.mol_type != "protein":
        raise InputError(where, f"{chain.mol_type} {chain.chain_id}", "paired MSA for a "
                         f"{chain.mol_type} chain; expected protein chains only")
    msa = path if isinstance(path, Msa) else parse_a3m(path)
    check_query(msa, chain.sequence, path=where)
    feats = protein_msa_features(msa)
    codes = feats["msa"].copy()
    codes[codes == _PROTEIN_GAP] = GAP
    codes[0] = [restype_of(c, chain.mol_type) for c in chain.residues]
    return codes.astype(np.int32), feats["deletion_matrix"].astype(np.float32)


def species_paired_msas(entry: Entry, pairing_paths: dict[str, str | os.PathLike]
                        ) -> dict[str, Msa]:
    """Per protein chain (author ID) with a pairing file: its query and the rows paired by
    species with the other chains' (:func:`fold_data.search.pairing.pair_by_species`; all of one
    length, gap rows where a chain lacks the species). A file's rows keep their order (HMMER's,
    best first), which stands in for the E-value that orders paired rows."""
    from fold_data.readers import reader
    from fold_data.search.hits import A3mRow
    from fold_data.search.pairing import pair_by_species

    chains, deletions = {}, {}
    for chain in entry.chains:
        path = pairing_paths.get(chain.author_id)
        if path is None or chain.mol_type != "protein":
            continue
        msa = reader(path, "msa")(path)
        check_query(msa, chain.sequence, path=path)
        rows = []
        for rank, (seq, dels, desc) in enumerate(zip(msa.sequences[1:], msa.deletion_matrix[1:],
                                                     msa.descriptions[1:])):
            name, _, text = desc.partition(" ")
            row = A3mRow(name, text, seq, float(rank))
            deletions[id(row)] = dels
            rows.append(row)
        chains[chain.author_id] = (chain.sequence, rows)
    if len({q for q, _ in chains.values()}) < 2:  # one entity: nothing to pair with
        return {}
    paired = pair_by_species(chains)
    out = {}
    for cid, rows in paired.items():
        query = chains[cid][0]
        out[cid] = Msa([query] + [r.row for r in rows],
                       [[0] * len(query)] + [deletions.get(id(r), [0] * len(query))
                                             for r in rows],
                       [f"{cid} query"] + [f"{r.name} {r.description}".strip() for r in rows],
                       os.fspath(pairing_paths[cid]))
    return out


def _paired_block(entry: Entry, asym, res_index, paired_paths, n_token):
    """Rows 1..P of the entry MSA from the chains' paired files (None without any)."""
    blocks = {a: paired_chain_msa(c, paired_paths[c.author_id]) for a, c in
              enumerate(entry.chains) if c.is_polymer and paired_paths.get(c.author_id)}
    if not blocks:
        return None
    depths = {len(codes) - 1 for codes, _ in blocks.values()}
    if len(depths) != 1:
        names = ", ".join(f"{entry.chains[a].author_id}: {len(c) - 1}"
                          for a, (c, _) in blocks.items())
        raise InputError(entry.source or None, "paired MSAs", f"paired row counts differ "
                         f"({names}); expected one count (row i of each chain pairs up)")
    depth = depths.pop()
    msa = np.full((depth, n_token), GAP, dtype=np.int32)
    deletion = np.zeros((depth, n_token), dtype=np.float32)
    for a, (codes, dels) in blocks.items():
        cols = np.flatnonzero(asym == a)
        msa[:, cols] = codes[1:, res_index[cols]]
        deletion[:, cols] = dels[1:, res_index[cols]]
    return msa, deletion


def make_msa_features(
    entry: Entry,
    tokens: dict[str, np.ndarray],
    msa_paths: dict[str, list] | None = None,
    *,
    max_rows: int | None = 16384,
    paired_paths: dict[str, str | os.PathLike] | None = None,
    pairing_paths: dict[str, str | os.PathLike] | None = None,
) -> dict[str, np.ndarray]:
    """``msa`` [N_msa, N_token] int32 (0-31), ``deletion_matrix`` [N_msa, N_token] float32,
    ``profile`` [N_token, 32] float32, ``deletion_mean`` [N_token] float32.

    ``msa_paths``: per author chain ID (the JSON's ``id``; mmCIF ``auth_asym_id``, which
    names polymer chains uniquely) the alignment files; ``max_rows`` (AF3:
    16384) limits each chain's rows. ``paired_paths``: per author chain ID the A3M of paired
    rows (module docstring); with them, ``max_rows`` also limits the whole MSA, paired rows
    first. ``pairing_paths``: per author chain ID the pairing database hits, paired here by
    species (:func:`species_paired_msas`) instead of read paired.
    """
    if paired_paths and pairing_paths:
        raise InputError(entry.source or None, "paired MSAs", "both paired A3Ms and pairing "
                         "database hits were given; expected one source of paired rows")
    if pairing_paths:
        paired_paths = species_paired_msas(entry, pairing_paths)
    msa_paths = msa_paths or {}
    asym, res_index = tokens["asym_id"], tokens["residue_index"]
    n_token = len(asym)
    per_chain: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for a, chain in enumerate(entry.chains):
        if not chain.is_polymer:
            continue
        paths = msa_paths.get(chain.author_id) or ()
        key = (tuple(chain.residues), chain.unpaired_msa, tuple(map(str, paths)))
        if key not in cache:  # homomer copies share one alignment
            cache[key] = chain_msa(chain, paths, max_rows=max_rows, source=entry.source or None)
        per_chain[a] = cache[key]
    depth = max([m.shape[0] for m, _ in per_chain.values()], default=1)
    msa = np.full((depth, n_token), GAP, dtype=np.int32)
    deletion = np.zeros((depth, n_token), dtype=np.float32)
    profile = np.zeros((n_token, NUM_RESTYPES), dtype=np.float32)
    deletion_mean = np.zeros(n_token, dtype=np.float32)
    msa[0] = tokens["restype"]
    for a, (codes, dels) in per_chain.items():
        cols = np.flatnonzero(asym == a)
        res = res_index[cols]
        rows = codes.shape[0]
        msa[1:rows, cols] = codes[1:, res]
        deletion[:rows, cols] = dels[:, res]
        counts = np.zeros((codes.shape[1], NUM_RESTYPES), dtype=np.float32)
        np.add.at(counts, (np.broadcast_to(np.arange(codes.shape[1]), codes.shape), codes), 1.0)
        profile[cols] = counts[res] / rows
        deletion_mean[cols] = dels.mean(axis=0)[res]
    ligand = tokens["is_ligand"].astype(bool)
    profile[ligand, tokens["restype"][ligand]] = 1.0  # a ligand column is its query row alone
    paired = _paired_block(entry, asym, res_index, paired_paths or {}, n_token)
    if paired is not None:
        msa = np.concatenate([msa[:1], paired[0], msa[1:]])[:max_rows]
        deletion = np.concatenate([deletion[:1], paired[1], deletion[1:]])[:max_rows]
    return {"msa": msa, "deletion_matrix": deletion, "profile": profile,
            "deletion_mean": deletion_mean}
