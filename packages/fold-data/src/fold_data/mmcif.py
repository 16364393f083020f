"""mmCIF parsing (gemmi) into per-chain sequences and atom37 coordinates.

gemmi does the parsing; this module picks what AF2 training needs and validates it:

* the first model only (NMR ensembles);
* polymer chains keyed by their **author** chain ID (``auth_asym_id``), each with its label ID
  (``label_asym_id``) and entity; :meth:`MmcifStructure.get_chain` also accepts a label ID;
* the full sequence from ``_entity_poly_seq`` (not only the modelled residues), with modified
  residues mapped to their standard parent (MSE -> M, SEP -> S, ...) and unknown ones to ``X``;
  microheterogeneity (several monomers at one position) keeps the first;
* modelled residues mapped onto the sequence by ``label_seq_id``;
* alternate locations: per residue the conformer with the highest mean occupancy (ties: the
  first in the file), together with the atoms that have no altloc;
* hydrogens dropped; selenomethionine's SE stored as MET's SD; ``OXT`` kept; a modified residue
  keeps only the atoms its parent has (so masks stay inside ``restype_atom37_mask``), an unknown
  residue (``X``) only its backbone (N, CA, C, O, CB, OXT).

Unknown residue names in protein chains become ``X`` and are listed in
``MmcifChain.unknown_residues``; asking for a protein chain made only of unknown residues raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import gemmi
import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.limits import check_mmcif
from fold_data.mmcif_truncation import warn_if_truncated

__all__ = ["MmcifChain", "MmcifStructure", "parse_mmcif", "residue_one_letter"]

_POLYMER_TYPES = {
    gemmi.PolymerType.PeptideL: "protein",
    gemmi.PolymerType.PeptideD: "protein",
    gemmi.PolymerType.Dna: "dna",
    gemmi.PolymerType.Rna: "rna",
}
_UNKNOWN_RESIDUE_ATOMS = frozenset({"N", "CA", "C", "O", "CB", "OXT"})
# Atoms kept per standard residue: its heavy atoms plus the C-terminal OXT.
_PROTEIN_ATOMS = {name: frozenset(atoms) | {"OXT"} for name, atoms in rc.residue_atoms.items()}
_NUCLEOTIDE_CODES = frozenset("ACGUTI")


@dataclass(frozen=True)
class MmcifChain:
    """One polymer chain of the first model.

    ``atom37_positions`` [N_res, 37, 3] float32 and ``atom37_mask`` [N_res, 37] float32 are filled
    for protein chains (all zero for nucleic acids, whose atoms have no atom37 slots).
    """

    author_chain_id: str
    label_chain_id: str
    entity_id: str
    polymer_type: str  # 'protein' | 'dna' | 'rna' | 'other'
    sequence: str  # one letter per _entity_poly_seq position, parents for modified, X unknown
    residue_names: tuple[str, ...]  # three-letter names as in _entity_poly_seq
    modelled: np.ndarray  # [N_res] bool: the residue has heavy atoms in the first model
    atom37_positions: np.ndarray  # [N_res, 37, 3] float32, Angstrom
    atom37_mask: np.ndarray  # [N_res, 37] float32
    author_residue_numbers: np.ndarray  # [N_res] int32 auth_seq_id, -1 where not modelled
    unknown_residues: tuple[tuple[int, str], ...] = ()  # (index, name) of residues mapped to X

    @property
    def num_res(self) -> int:
        return len(self.sequence)

    @property
    def aatype(self) -> np.ndarray:
        """[N_res] int32 residue type codes (0-19, 20 for X)."""
        return rc.sequence_to_aatype(self.sequence)


@dataclass(frozen=True)
class MmcifStructure:
    """What one mmCIF file holds for training: header facts and the polymer chains."""

    path: str
    pdb_id: str
    method: str  # _exptl.method, e.g. 'X-RAY DIFFRACTION'; several joined by ', '
    resolution: float  # Angstrom, 0.0 when the file gives none (NMR)
    release_date: str | None  # earliest _pdbx_audit_revision_history.revision_date (YYYY-MM-DD)
    chains: dict[str, MmcifChain] = field(default_factory=dict)  # by author chain ID

    def get_chain(self, chain_id: str) -> MmcifChain:
        """The chain with this author ID or, failing that, this label ID.

        Raises :class:`InputError` naming the file and the available chains when there is
        none, or when a protein chain consists only of unknown residues.
        """
        chain = self.chains.get(chain_id)
        if chain is None:
            chain = next((c for c in self.chains.values() if c.label_chain_id == chain_id), None)
        if chain is None:
            available = ", ".join(
                f"{c.author_chain_id} (label {c.label_chain_id})" for c in self.chains.values()
            )
            raise InputError(
                self.path,
                f"chain {chain_id}",
                f"no polymer chain with this author or label ID; available chains: {available}",
            )
        if chain.polymer_type == "protein" and len(chain.unknown_residues) == chain.num_res:
            raise InputError(
                self.path,
                f"chain {chain_id}",
                "every residue has an unknown name "
                f"({', '.join(sorted({n for _, n in chain.unknown_residues}))}); "
                "expected standard or modified amino acids",
            )
        return chain


def residue_one_letter(name: str, polymer_type: str = "protein") -> str:
    """One-letter code of a residue name, modified residues mapped to their parent; else 'X'.

    Protein: the 20 standard names, then ``residue_constants.MODIFIED_RESIDUE_PARENTS``, then
    gemmi's table of chemical components (its lower-case codes mark modified residues).
    Nucleic acids: A, C, G, U, T, I from gemmi's table; anything else 'X'.
    """
    if polymer_type == "protein":
        parent = rc.MODIFIED_RESIDUE_PARENTS.get(name, name)
        if parent in rc.restype_3to1:
            return rc.restype_3to1[parent]
        info = gemmi.find_tabulated_residue(name)
        if info is not None and info.is_amino_acid():
            code = info.one_letter_code.upper()
            if code in rc.restype_order:
                return code
        return "X"
    info = gemmi.find_tabulated_residue(name)
    if info is not None and info.is_nucleic_acid():
        code = info.one_letter_code.upper()
        if code in _NUCLEOTIDE_CODES:
            return code
    return "X"


def _read_block(path: Path) -> gemmi.cif.Block:
    if not path.is_file():
        raise InputError(path, None, "mmCIF file not found")
    try:
        doc = gemmi.cif.read(str(path))
        if len(doc) == 0:  # sole_block() of an empty file is an IndexError from C++
            raise InputError(path, None, "empty file: expected an mmCIF data block")
        block = doc.sole_block()
    except (RuntimeError, ValueError, OSError) as err:  # gemmi reports syntax errors so
        if isinstance(err, InputError):
            raise
        raise InputError(path, None, f"not a readable mmCIF file: {err}") from None
    for category, why in (
        ("_atom_site.", "coordinates"),
        ("_entity_poly_seq.", "the full polymer sequences"),
    ):
        if not block.find_mmcif_category(category):
            raise InputError(
                path, category.rstrip("."), f"missing category (expected {why}; truncated file?)"
            )
    return block


def _header(block: gemmi.cif.Block, path: Path) -> tuple[str, str, str | None]:
    entry = block.find_value("_entry.id")
    pdb_id = (gemmi.cif.as_string(entry) if entry else block.name).lower()
    methods = [gemmi.cif.as_string(m) for m in block.find_values("_exptl.method")]
    method = ", ".join(m.upper() for m in methods if m)
    raw_dates = block.find_values("_pdbx_audit_revision_history.revision_date")
    dates = sorted(d for d in map(gemmi.cif.as_string, raw_dates) if d and d not in ("?", "."))
    for d in dates:
        if len(d) != 10 or d[4] != "-" or d[7] != "-":
            raise InputError(
                path, "_pdbx_audit_revision_history", f"expected a YYYY-MM-DD date, got {d!r}"
            )
    return pdb_id, method, (dates[0] if dates else None)


def _choose_altloc(atoms: list[gemmi.Atom]) -> str:
    """The altloc with the highest mean occupancy ('\\0' when there is none); ties: first seen."""
    occ: dict[str, list[float]] = {}
    for atom in atoms:
        if atom.altloc != "\0":
            occ.setdefault(atom.altloc, []).append(atom.occ)
    best, best_occ = "\0", -1.0
    for altloc, values in occ.items():  # dicts keep file order, so ties go to the first
        mean = sum(values) / len(values)
        if mean > best_occ:
            best, best_occ = altloc, mean
    return best


def _fill_atoms(
    residue: gemmi.Residue, allowed: frozenset[str], positions: np.ndarray, mask: np.ndarray
) -> bool:
    """Write the residue's chosen heavy atoms into atom37 rows; True if it has heavy atoms."""
    heavy = [a for a in residue if not a.is_hydrogen()]
    if not heavy:
        return False
    altloc = _choose_altloc(heavy)
    is_mse = residue.name == "MSE"
    for atom in heavy:
        if atom.altloc != "\0" and atom.altloc != altloc:
            continue
        name = "SD" if is_mse and atom.name == "SE" else atom.name
        if name not in allowed:
            continue
        idx = rc.atom_order[name]
        if mask[idx]:  # duplicate atom name: keep the first
            continue
        p = atom.pos
        positions[idx] = (p.x, p.y, p.z)
        mask[idx] = 1.0
    return True


def _pick_residue(candidates: list[gemmi.Residue], first_mon: str) -> gemmi.Residue:
    """Microheterogeneity: prefer the monomer _entity_poly_seq lists first."""
    for res in candidates:
        if res.name == first_mon:
            return res
    return candidates[0]


def _build_chain(
    path: Path,
    author_id: str,
    label_id: str,
    entity: gemmi.Entity,
    residues: list[gemmi.Residue],
) -> MmcifChain:
    polymer_type = _POLYMER_TYPES.get(entity.polymer_type, "other")
    if not entity.full_sequence:
        raise InputError(
            path, f"entity {entity.name}", "polymer entity has no _entity_poly_seq rows"
        )
    names = tuple(gemmi.Entity.first_mon(item) for item in entity.full_sequence)
    num_res = len(names)
    letters = [residue_one_letter(n, polymer_type) for n in names]
    unknown = tuple((i, n) for i, n in enumerate(names) if letters[i] == "X")

    by_position: dict[int, list[gemmi.Residue]] = {}
    for res in residues:
        seq = res.label_seq
        if seq is None or not 1 <= seq <= num_res:
            raise InputError(
                path,
                f"chain {author_id} residue {res.name} {res.seqid}",
                f"label_seq_id {seq} outside the entity's sequence 1..{num_res}",
            )
        by_position.setdefault(seq - 1, []).append(res)

    positions = np.zeros((num_res, rc.atom_type_num, 3), dtype=np.float32)
    mask = np.zeros((num_res, rc.atom_type_num), dtype=np.float32)
    modelled = np.zeros(num_res, dtype=bool)
    author_numbers = np.full(num_res, -1, dtype=np.int32)
    for i, candidates in by_position.items():
        res = _pick_residue(candidates, names[i])
        if polymer_type == "protein":
            parent = rc.restype_1to3.get(letters[i])
            allowed = _PROTEIN_ATOMS[parent] if parent else _UNKNOWN_RESIDUE_ATOMS
        else:
            allowed = frozenset()
        modelled[i] = _fill_atoms(res, allowed, positions[i], mask[i])
        author_numbers[i] = res.seqid.num
    return MmcifChain(
        author_chain_id=author_id,
        label_chain_id=label_id,
        entity_id=entity.name,
        polymer_type=polymer_type,
        sequence="".join(letters),
        residue_names=names,
        modelled=modelled,
        atom37_positions=positions,
        atom37_mask=mask,
        author_residue_numbers=author_numbers,
        unknown_residues=unknown,
    )


def parse_mmcif(path: str | os.PathLike) -> MmcifStructure:
    """Parse an mmCIF file (optionally gzipped) into header facts and polymer chains.

    Raises :class:`InputError` naming the file for a missing, unreadable, malformed or truncated
    file, and for a file without polymer chains in its first model. A file cut at a line
    boundary inside ``_atom_site`` parses, with a ``TruncatedMmcifWarning``
    (:mod:`fold_data.mmcif_truncation`). A file over the size limits in force
    (:mod:`fold_data.limits`) is refused before it is parsed (``InputTooLarge``).
    """
    path = Path(path)
    if path.is_file():
        check_mmcif(path)  # size limits (fold_data.limits) before gemmi reads it: InputTooLarge
    block = _read_block(path)
    warn_if_truncated(path, block)  # a file cut inside _atom_site: TruncatedMmcifWarning
    pdb_id, method, release_date = _header(block, path)
    try:
        structure = gemmi.make_structure_from_block(block)
    except (RuntimeError, ValueError) as err:
        raise InputError(path, None, f"cannot build a structure from the mmCIF: {err}") from None
    if len(structure) == 0:
        raise InputError(path, "_atom_site", "no models (expected at least one)")
    entity_of_label = {
        sub: ent
        for ent in structure.entities
        if ent.entity_type == gemmi.EntityType.Polymer
        for sub in ent.subchains
    }

    # Group the first model's polymer residues by label chain (an author chain can be split
    # into several gemmi Chain objects, e.g. when ligands sit between its parts).
    residues_of_label: dict[str, list[gemmi.Residue]] = {}
    author_of_label: dict[str, str] = {}
    for chain in structure[0]:
        for res in chain:
            if res.subchain in entity_of_label:
                residues_of_label.setdefault(res.subchain, []).append(res)
                author_of_label.setdefault(res.subchain, chain.name)

    chains: dict[str, MmcifChain] = {}
    for label_id, residues in residues_of_label.items():
        author_id = author_of_label[label_id]
        if author_id in chains:
            raise InputError(
                path,
                f"chain {author_id}",
                f"author chain holds two polymers (labels {chains[author_id].label_chain_id}, "
                f"{label_id}); expected one polymer per auth_asym_id",
            )
        chains[author_id] = _build_chain(
            path, author_id, label_id, entity_of_label[label_id], residues
        )
    if not chains:
        raise InputError(path, None, "no polymer chains in the first model")
    return MmcifStructure(
        path=str(path),
        pdb_id=pdb_id,
        method=method,
        resolution=float(structure.resolution or 0.0),
        release_date=release_date,
        chains=chains,
    )
