"""Pairing MSA rows across chains by species (AF-Multimer supplement 7.3.1; AF3 supplement 2.3).

Each chain's hits in the pairing database (UniProt) are grouped by species
(:func:`~fold_data.search.species.hit_species`). For every species found in at least two of the
chains, the ``k``-th hit of that species in each chain (hits in HMMER's order, best first) forms
one paired row, for ``k`` below the smallest count among the chains that have the species; a chain
without that species has a gap row there. Row 0 is every chain's query. Paired rows come in the
order AF-Multimer uses: rows covering more chains first, then by the best E-value of the row.
Identical chains (homomers) are not paired with each other: every entity is paired once and its
copies share its rows; a complex of one entity has only the query row.
"""

from __future__ import annotations

from collections import defaultdict

from .hits import A3mRow
from .species import hit_species

__all__ = ["pair_by_species"]


def pair_by_species(chains: dict[str, tuple[str, list[A3mRow]]],
                    max_rows: int | None = None) -> dict[str, list[A3mRow]]:
    """``chains``: chain ID -> (query sequence, pairing-database rows). Returns chain ID ->
    paired rows (the query row not included), all lists of one length; row ``i`` of every chain
    comes from one species (a gap row named ``gap`` where a chain lacks it)."""
    entities: dict[str, list[str]] = defaultdict(list)  # sequence -> chain IDs
    for cid, (query, _) in chains.items():
        entities[query].append(cid)
    if len(entities) < 2:
        return {cid: [] for cid in chains}
    rep = {seq: ids[0] for seq, ids in entities.items()}
    by_species: dict[str, dict[str, list[A3mRow]]] = {}  # entity sequence -> species -> rows
    for seq, cid in rep.items():
        groups: dict[str, list[A3mRow]] = defaultdict(list)
        for row in chains[cid][1]:
            species = hit_species(row.name.split("/")[0], row.description)
            if species:
                groups[species].append(row)
        by_species[seq] = groups
    combos: list[tuple[int, float, dict[str, A3mRow]]] = []
    all_species = sorted({s for groups in by_species.values() for s in groups})
    for species in all_species:
        having = [seq for seq in rep if species in by_species[seq]]
        if len(having) < 2:
            continue
        depth = min(len(by_species[seq][species]) for seq in having)
        for k in range(depth):
            picked = {seq: by_species[seq][species][k] for seq in having}
            combos.append((len(having), min(r.evalue for r in picked.values()), picked))
    combos.sort(key=lambda c: (-c[0], c[1]))
    if max_rows is not None:
        combos = combos[:max_rows]
    out: dict[str, list[A3mRow]] = {}
    for seq, ids in entities.items():
        gap = A3mRow("gap", "", "-" * len(seq), float("inf"))
        rows = [picked.get(seq, gap) for _, _, picked in combos]
        for cid in ids:
            out[cid] = rows
    return out
