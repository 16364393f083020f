"""AF3's per-chain filters of training structures (AF3 supplement 2.5.4), on a parsed mmCIF.

:func:`filter_chains` returns the :class:`~fold_data.af3.parse.Entry` without the chains that
AF3 removes from its training bioassemblies, and one :class:`Removal` per removed chain:

* ``too_few_resolved``: a polymer chain with fewer than 4 resolved residues (a residue with at
  least one heavy atom in the structure);
* ``all_unknown``: a polymer chain whose residues are all unknown (``UNK``, RNA ``N``, DNA
  ``DN``);
* ``clashing``: of two chains with more than 30% of either's resolved heavy atoms within 1.7 A
  of the other's, the one with the larger clashing fraction (then: fewer atoms; then: the larger
  chain ID); chains bonded to each other (a ``_struct_conn`` covalent bond) never clash, as in
  Protenix (a covalent ligand's bonded atom sits ~1.5 A from its partner);
* ``ca_gap``: a protein chain with two sequence-consecutive resolved CA atoms more than 10 A
  apart;
* ``crystallization_aid``: a ligand chain made only of the crystallization aids of Table 9,
  when the entry's ``_exptl.method`` is a crystallographic one (AF3's
  ``mmcif_names.CRYSTALLIZATION_METHODS``);
* ``attached_to_removed``: a ligand chain covalently bonded to a removed chain (a glycan on a
  removed protein; OpenFold3 removes them alike).

Two more of 2.5.4's filters act on atoms and are done by the tokenizer for every input
(:mod:`fold_data.af3.tokenizer`): atoms outside the residue's CCD atom names are never
featurised, and leaving atoms of bonded residues (covalent ligands, polymer links) are removed.
:func:`filter_chains` counts the resolved atoms each drops (``outside_ccd`` and
``leaving``) so the cache report can say so.

Not here: the target filters (resolution, release date, polymer chain count:
:class:`fold_data.af3.sampling.EntryFilter`, applied when training starts), hydrogens and
waters (dropped by the parser), MSE -> MET (the parser), and the 20-chain subset of large
bioassemblies around a random interface token (a per-sample choice, not a property of the
cached entry: fold crops every sample to the token budget around the drawn chain or interface
instead).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fold_data.errors import InputError

from .ccd import Ccd, default_ccd
from .parse import Chain, Entry

__all__ = ["CRYSTALLIZATION_AIDS", "CRYSTALLOGRAPHY_METHODS", "CHAIN_FILTERS", "ATOM_FILTERS",
           "ChainFilters", "FilterResult", "Removal", "filter_chains"]

# AF3 supplement Table 9 (AF3's chemical_component_sets.COMMON_CRYSTALLIZATION_AIDS)
CRYSTALLIZATION_AIDS = frozenset({"SO4", "GOL", "EDO", "PO4", "ACT", "PEG", "DMS", "TRS", "PGE",
                                  "PG4", "FMT", "EPE", "MPD", "MES", "CD", "IOD"})
# _exptl.method values that involve crystals (AF3's mmcif_names.CRYSTALLIZATION_METHODS)
CRYSTALLOGRAPHY_METHODS = frozenset({"X-RAY DIFFRACTION", "NEUTRON DIFFRACTION",
                                     "ELECTRON CRYSTALLOGRAPHY", "POWDER CRYSTALLOGRAPHY",
                                     "FIBER DIFFRACTION"})
UNKNOWN_RESIDUES = frozenset({"UNK", "N", "DN"})
# Report order: the chain filters, then the atom counts.
CHAIN_FILTERS = ("too_few_resolved", "all_unknown", "clashing", "ca_gap", "crystallization_aid",
                 "attached_to_removed")
ATOM_FILTERS = ("outside_ccd", "leaving")


@dataclass(frozen=True)
class ChainFilters:
    """Settings of :func:`filter_chains` (AF3's values); None / False: that filter off."""

    min_resolved_residues: int | None = 4
    remove_all_unknown: bool = True
    clash_distance: float | None = 1.7  # Angstrom
    clash_fraction: float = 0.3
    max_ca_distance: float | None = 10.0  # Angstrom
    remove_crystallization_aids: bool = True

    def params(self) -> dict:
        """The settings as a JSON-serialisable dict (part of the AF3 cache key)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Removal:
    """One chain removed by filter ``filter`` (one of :data:`CHAIN_FILTERS`)."""

    filter: str
    chain_id: str  # label_asym_id
    author_id: str
    detail: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FilterResult:
    """The filtered entry, its removed chains, and per atom filter the resolved atoms dropped."""

    entry: Entry
    removed: tuple[Removal, ...]
    atoms: dict[str, int]

    def report(self) -> dict:
        """``{filter: [chain records]}`` for every chain filter and ``{filter: atom count}``
        for the atom filters: one line per filter, empty ones included."""
        out: dict = {f: [r.to_dict() for r in self.removed if r.filter == f]
                     for f in CHAIN_FILTERS}
        out.update({f: self.atoms.get(f, 0) for f in ATOM_FILTERS})
        return out


def _resolved(chain: Chain) -> list[dict[str, np.ndarray]]:
    """Per residue its modelled heavy atoms (``{}`` where none)."""
    if chain.positions is None:
        return [{} for _ in chain.residues]
    return [p or {} for p in chain.positions]


def _too_few_resolved(chain: Chain, n_min: int) -> str | None:
    n = sum(bool(p) for p in _resolved(chain))
    return f"{n} resolved residues < {n_min}" if n < n_min else None


def _all_unknown(chain: Chain) -> str | None:
    if chain.residues and all(r in UNKNOWN_RESIDUES for r in chain.residues):
        return f"all {len(chain.residues)} residues unknown ({chain.residues[0]})"
    return None


def _ca_gap(chain: Chain, max_distance: float) -> str | None:
    res = _resolved(chain)
    for k in range(len(res) - 1):
        a, b = res[k].get("CA"), res[k + 1].get("CA")
        if a is not None and b is not None:
            d = float(np.linalg.norm(a.astype(np.float64) - b.astype(np.float64)))
            if d > max_distance:
                return f"CA of residues {k + 1} and {k + 2} {d:.1f} A apart > {max_distance} A"
    return None


def _chain_atoms(chain: Chain) -> np.ndarray:
    """[n, 3] float64 resolved heavy atoms of a chain."""
    xyz = [x for p in _resolved(chain) for x in p.values()]
    return np.asarray(xyz, dtype=np.float64).reshape(-1, 3)


def _near_count(a: np.ndarray, b: np.ndarray, cutoff: float) -> int:
    """How many atoms of ``a [n, 3]`` lie within ``cutoff`` of an atom of ``b [m, 3]``."""
    lo, hi = b.min(0) - cutoff, b.max(0) + cutoff
    cand = np.flatnonzero(((a >= lo) & (a <= hi)).all(1))  # only a's atoms near b's box
    if not len(cand):
        return 0
    bb = b[((b >= a[cand].min(0) - cutoff) & (b <= a[cand].max(0) + cutoff)).all(1)]
    n = 0
    for start in range(0, len(cand), 512):  # [512, m'] distances at a time
        rows = a[cand[start:start + 512]]
        d2 = ((rows[:, None] - bb[None]) ** 2).sum(-1)
        n += int((d2 < cutoff * cutoff).any(1).sum())
    return n


def _clashing(chains: list[Chain], bonded: set[frozenset[str]], cutoff: float,
              fraction: float) -> dict[str, str]:
    """``{chain ID: detail}`` of the chains removed as clashing (module docstring): pairs
    taken in chain order, a removed chain no longer clashes with later ones."""
    atoms = {c.chain_id: _chain_atoms(c) for c in chains}
    ids = [c.chain_id for c in chains if len(atoms[c.chain_id])]
    box = {c: (atoms[c].min(0) - cutoff, atoms[c].max(0) + cutoff) for c in ids}
    removed: dict[str, str] = {}
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            if a in removed:
                break
            if b in removed or frozenset((a, b)) in bonded:
                continue
            if (box[a][0] > box[b][1]).any() or (box[b][0] > box[a][1]).any():
                continue  # boxes apart: no atom pair within the cutoff
            xa, xb = atoms[a], atoms[b]
            fa = _near_count(xa, xb, cutoff) / len(xa)
            fb = _near_count(xb, xa, cutoff) / len(xb)
            if fa <= fraction and fb <= fraction:
                continue
            if fa != fb:
                loser, other = (a, b) if fa > fb else (b, a)
            elif len(xa) != len(xb):
                loser, other = (a, b) if len(xa) < len(xb) else (b, a)
            else:
                loser, other = (max(a, b), min(a, b))
            f = max(fa, fb)
            removed[loser] = (f"{f:.0%} of its {len(atoms[loser])} resolved atoms within "
                              f"{cutoff} A of chain {other}")
    return removed


def _crystallization_aid(chain: Chain) -> str | None:
    if chain.mol_type == "ligand" and chain.residues and all(
            r in CRYSTALLIZATION_AIDS for r in chain.residues):
        return f"crystallization aid {'-'.join(chain.residues)}"
    return None


def _atom_counts(entry: Entry, ccd: Ccd) -> dict[str, int]:
    """Resolved atoms outside their residue's CCD atoms, and resolved leaving atoms that the
    tokenizer removes (:func:`fold_data.af3.tokenizer.leaving_atoms`)."""
    from .tokenizer import leaving_atoms

    leaving = leaving_atoms(entry, ccd)
    outside = gone = 0
    for chain in entry.chains:
        if chain.smiles is not None:
            continue
        for k, (code, atoms) in enumerate(zip(chain.residues, _resolved(chain))):
            comp = ccd.get(code)
            names = set(comp.atom_names) if comp else set()
            outside += sum(n not in names for n in atoms)
            gone += len(leaving.get((chain.chain_id, k), set()) & set(atoms))
    return {"outside_ccd": outside, "leaving": gone}


def filter_chains(entry: Entry, filters: ChainFilters | None = None, ccd: Ccd | None = None
                  ) -> FilterResult:
    """``entry`` without the chains AF3's training filters remove (module docstring), in the
    order of the supplement; bonds to removed chains are dropped and entity numbers made
    consecutive again. Applying it twice removes nothing more. Raises :class:`InputError`
    naming the file when no chain is left."""
    filters = filters or ChainFilters()
    ccd = (ccd or default_ccd()).with_text(entry.user_ccd)
    removed: dict[str, Removal] = {}
    chains = list(entry.chains)

    def drop(name: str, reasons: dict[str, str]) -> None:
        nonlocal chains
        for c in chains:
            if c.chain_id in reasons:
                removed[c.chain_id] = Removal(name, c.chain_id, c.author_id, reasons[c.chain_id])
        chains = [c for c in chains if c.chain_id not in reasons]

    def per_chain(name: str, test, polymer_only: bool = True) -> None:
        drop(name, {c.chain_id: why for c in chains
                    if (c.is_polymer or not polymer_only) and (why := test(c)) is not None})

    if filters.min_resolved_residues is not None:
        per_chain("too_few_resolved", lambda c: _too_few_resolved(c, filters.min_resolved_residues))
    if filters.remove_all_unknown:
        per_chain("all_unknown", _all_unknown)
    if filters.clash_distance is not None:
        bonded = {frozenset((b.a[0], b.b[0])) for b in entry.bonds if b.a[0] != b.b[0]}
        drop("clashing", _clashing(chains, bonded, filters.clash_distance,
                                   filters.clash_fraction))
    if filters.max_ca_distance is not None:
        per_chain("ca_gap", lambda c: (_ca_gap(c, filters.max_ca_distance)
                                       if c.mol_type == "protein" else None))
    if filters.remove_crystallization_aids and CRYSTALLOGRAPHY_METHODS & set(entry.methods):
        per_chain("crystallization_aid", _crystallization_aid, polymer_only=False)
    while True:  # ligands bonded to a removed chain go with it (a glycan with its protein)
        kept = {c.chain_id for c in chains}
        attached = {}
        for b in entry.bonds:
            for mine, theirs in ((b.a[0], b.b[0]), (b.b[0], b.a[0])):
                if mine in kept and theirs in removed and entry.chain(mine).mol_type == "ligand":
                    attached[mine] = f"covalently bonded to removed chain {theirs}"
        if not attached:
            break
        drop("attached_to_removed", attached)
    if not chains:
        why = "; ".join(f"{r.chain_id}: {r.filter} ({r.detail})" for r in removed.values())
        raise InputError(entry.source or None, entry.name,
                         f"every chain removed by the AF3 training filters: {why}")
    if removed:
        kept = {c.chain_id for c in chains}
        renumber: dict[int, int] = {}
        chains = [dataclasses.replace(c, entity_id=renumber.setdefault(c.entity_id,
                                                                       len(renumber) + 1))
                  for c in chains]
        bonds = [b for b in entry.bonds if b.a[0] in kept and b.b[0] in kept]
        entry = dataclasses.replace(entry, chains=chains, bonds=bonds)
    return FilterResult(entry, tuple(removed.values()), _atom_counts(entry, ccd))

