"""Which training entry, chain or interface each AF3 sample is made from (AF3 supplement 2.5).

AF3 does not draw entries uniformly: it draws *units*, chains and interfaces of the training
structures, each with a weight (supplement 2.5.1, equation 1)::

    w = beta_kind / N_clust * (alpha_prot * n_prot + alpha_nuc * n_nuc + alpha_ligand * n_ligand)

``beta_chain`` = 0.5, ``beta_interface`` = 1; ``alpha_prot`` = ``alpha_nuc`` = 3,
``alpha_ligand`` = 1; ``n_*`` counts the unit's chains of each molecule type (one for a chain,
two for an interface); ``N_clust`` is the number of units in the unit's cluster. Clusters
(2.5.3): protein chains at 40% sequence identity, peptides (< 10 residues) and nucleic acids at
100% identity, ligands by their CCD code(s); an interface's cluster is the unordered pair of its
chains' clusters. An interface is a pair of chains with resolved heavy atoms closer than 5
Angstrom. The sample is then cropped around the drawn unit (its tokens are where the spatial
crops start: :func:`fold_data.af3.transforms.make_sample`'s ``focus``).

Filters (2.5.4, as OpenFold3 applies them to the training set): resolution at most 9 Angstrom
(0, NMR: no resolution, kept), released on or before 2021-09-30, at most 300 polymer chains
(:class:`EntryFilter`; the AF3 training preset's values).

The constants are AF3's (supplement 2.5, Abramson et al. 2024; the supplement is not among the
project's papers: checked against Boltz's cluster sampler and OpenFold3's dataset cache, which
implement the same values). :class:`EntryInfo` holds what the weights and filters need of one
entry; the AF3 cache keeps one per entry (fold-train's ``sampling_index.json``).
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .clustering import cluster_sequences

__all__ = ["ALPHA", "BETA", "INTERFACE_CUTOFF", "ChainInfo", "EntryFilter", "EntryInfo",
           "SamplingUnit", "WeightedSampler", "chain_clusters", "entry_info", "find_interfaces",
           "sampling_units"]

BETA = {"chain": 0.5, "interface": 1.0}
ALPHA = {"protein": 3.0, "nucleic": 3.0, "ligand": 1.0}
INTERFACE_CUTOFF = 5.0  # Angstrom, minimum heavy-atom distance of an interface
PROTEIN_IDENTITY = 0.4  # protein chains cluster at 40% sequence identity
PEPTIDE_LENGTH = 10  # shorter protein chains are peptides (100% identity clusters)
_CLASS = {"protein": "protein", "rna": "nucleic", "dna": "nucleic", "ligand": "ligand"}


@dataclass(frozen=True)
class ChainInfo:
    """One chain: ``asym`` its ``asym_id`` in the features, ``mol_type`` protein / rna / dna /
    ligand, ``sequence`` one letter per residue (ligands: CCD codes joined by ``-``)."""

    asym: int
    chain_id: str
    mol_type: str
    sequence: str


@dataclass(frozen=True)
class EntryInfo:
    """What sampling and filtering need of one training entry."""

    name: str
    resolution: float  # Angstrom; 0: none given (NMR)
    release_date: str | None  # YYYY-MM-DD
    chains: tuple[ChainInfo, ...]
    interfaces: tuple[tuple[int, int], ...]  # asym_id pairs (a < b)

    @property
    def n_polymer_chains(self) -> int:
        return sum(c.mol_type != "ligand" for c in self.chains)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EntryInfo:
        return cls(d["name"], float(d["resolution"]), d["release_date"],
                   tuple(ChainInfo(**c) for c in d["chains"]),
                   tuple((int(a), int(b)) for a, b in d["interfaces"]))


def find_interfaces(raw: dict[str, np.ndarray], cutoff: float = INTERFACE_CUTOFF
                    ) -> list[tuple[int, int]]:
    """asym_id pairs ``(a, b)``, ``a < b``, with resolved atoms closer than ``cutoff``."""
    asym_of_atom = raw["asym_id"][raw["atom_to_token"]]  # [N_atom]
    resolved = raw["atom_resolved"] > 0
    pos = raw["atom_positions"].astype(np.float64)
    chains = {int(a): pos[resolved & (asym_of_atom == a)] for a in np.unique(asym_of_atom)}
    chains = {a: p for a, p in chains.items() if len(p)}
    boxes = {a: (p.min(0) - cutoff, p.max(0) + cutoff) for a, p in chains.items()}
    out = []
    names = sorted(chains)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lo, hi = boxes[a]
            pb = chains[b]
            pb = pb[((pb >= lo) & (pb <= hi)).all(1)]  # only b's atoms near a's box
            if not len(pb):
                continue
            pa = chains[a]
            for start in range(0, len(pa), 1024):  # [1024, N_b] distances at a time
                d2 = ((pa[start:start + 1024, None] - pb[None]) ** 2).sum(-1)
                if (d2 < cutoff * cutoff).any():
                    out.append((a, b))
                    break
    return out


def entry_info(name: str, entry, raw: dict[str, np.ndarray]) -> EntryInfo:
    """The :class:`EntryInfo` of a parsed entry (:class:`fold_data.af3.Entry`) and its raw
    features (``asym_id`` ``a`` is ``entry.chains[a]``)."""
    chains = tuple(
        ChainInfo(a, c.chain_id, c.mol_type,
                  c.sequence if c.is_polymer else "-".join(c.residues) or (c.smiles or ""))
        for a, c in enumerate(entry.chains))
    return EntryInfo(name, float(entry.resolution or 0.0), entry.release_date, chains,
                     tuple(find_interfaces(raw)))


@dataclass(frozen=True)
class EntryFilter:
    """Training-set filters (AF3 supplement 2.5.4); None: that filter off."""

    max_resolution: float | None = 9.0
    max_release_date: str | None = "2021-09-30"
    max_polymer_chains: int | None = 300

    def __post_init__(self) -> None:
        if self.max_release_date is not None:
            try:
                datetime.date.fromisoformat(self.max_release_date)
            except ValueError:
                raise ValueError(f"max_release_date: expected YYYY-MM-DD, got "
                                 f"{self.max_release_date!r}") from None

    def reason(self, info: EntryInfo) -> str | None:
        """Why ``info`` is filtered out, or None when it is kept."""
        if self.max_resolution is not None and info.resolution > self.max_resolution:
            return f"resolution {info.resolution} A > {self.max_resolution} A"
        if self.max_release_date is not None:
            if info.release_date is None:
                return "no release date to compare with " + self.max_release_date
            if info.release_date > self.max_release_date:  # ISO dates compare as strings
                return f"released {info.release_date} after {self.max_release_date}"
        if self.max_polymer_chains is not None and info.n_polymer_chains > self.max_polymer_chains:
            return f"{info.n_polymer_chains} polymer chains > {self.max_polymer_chains}"
        return None


def chain_clusters(infos: Sequence[EntryInfo], *, method: str = "auto"
                   ) -> dict[tuple[str, int], str]:
    """The cluster label of every chain ``(entry name, asym_id)`` (module docstring)."""
    proteins = sorted({c.sequence for i in infos for c in i.chains
                       if c.mol_type == "protein" and len(c.sequence) >= PEPTIDE_LENGTH})
    labels = dict(zip(proteins, cluster_sequences(proteins, PROTEIN_IDENTITY, method=method)))
    out = {}
    for info in infos:
        for c in info.chains:
            if c.mol_type == "protein" and c.sequence in labels:
                out[info.name, c.asym] = f"protein:{labels[c.sequence]}"
            elif c.mol_type == "protein":
                out[info.name, c.asym] = f"peptide:{c.sequence}"
            else:  # nucleic acids: identical sequences; ligands: identical CCD codes
                out[info.name, c.asym] = f"{c.mol_type}:{c.sequence}"
    return out


@dataclass(frozen=True)
class SamplingUnit:
    """A chain (``asyms`` of one) or an interface (two) of entry ``entry``, its cluster and
    its sampling weight."""

    entry: str
    kind: str  # "chain" | "interface"
    asyms: tuple[int, ...]
    cluster: str
    weight: float = 0.0


def sampling_units(infos: Sequence[EntryInfo], clusters: dict[tuple[str, int], str]
                   ) -> list[SamplingUnit]:
    """Every chain and interface of ``infos`` with its AF3 weight (module docstring)."""
    units = []
    for info in infos:
        types = {c.asym: _CLASS[c.mol_type] for c in info.chains}
        for c in info.chains:
            units.append((info.name, "chain", (c.asym,), clusters[info.name, c.asym],
                          [types[c.asym]]))
        for a, b in info.interfaces:
            pair = "|".join(sorted((clusters[info.name, a], clusters[info.name, b])))
            units.append((info.name, "interface", (a, b), pair, [types[a], types[b]]))
    size = Counter((kind, cluster) for _, kind, _, cluster, _ in units)
    return [SamplingUnit(name, kind, asyms, cluster,
                         BETA[kind] / size[kind, cluster] * sum(ALPHA[t] for t in classes))
            for name, kind, asyms, cluster, classes in units]


@dataclass
class WeightedSampler:
    """Draws units with probability proportional to their weights (with replacement)."""

    units: list[SamplingUnit]
    _cum: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.units:
            raise ValueError("WeightedSampler needs at least one unit")
        w = np.asarray([u.weight for u in self.units], dtype=np.float64)
        if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError("sampling weights must be finite, >= 0 and not all 0")
        self._cum = np.cumsum(w / w.sum())

    @property
    def probabilities(self) -> np.ndarray:
        """[N_units] the probability of each unit."""
        return np.diff(self._cum, prepend=0.0)

    def draw(self, rng: np.random.Generator) -> SamplingUnit:
        i = int(np.searchsorted(self._cum, rng.random(), side="right"))
        return self.units[min(i, len(self.units) - 1)]
