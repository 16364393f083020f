"""RDKit molecules from CCD entries and from SMILES (AF3 supplement 2.8, reference conformers).

A CCD molecule is built atom by atom from the entry: element, formal charge, explicit
hydrogens (the CCD lists them, so RDKit adds none), bonds with the CCD's Kekule orders and
aromatic flags, then sanitized (valences, ring info, aromaticity perception). Atoms can be
left out (leaving atoms that a covalent bond replaces: ``OXT`` of a peptide-bonded residue,
``O1`` of a glycosidic sugar); hydrogens bonded to a left-out atom go with it.

Some CCD entries do not sanitize (metal complexes such as iridium hexammine, hypervalent
atoms); those are kept unsanitized except for ring perception, with ``sanitized`` False, and
their conformer generation usually falls back to the CCD coordinates (see :mod:`.conformers`).

RDKit is imported by the functions that need it (:func:`require_rdkit`), not at module import:
reading AF3 cache entries, cropping and ``make_sample`` run on machines without RDKit (the GPU
training image), and building molecules there raises :class:`RDKitUnavailable`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from fold_data.errors import InputError

from .ccd import ChemComp

if TYPE_CHECKING:
    from rdkit import Chem

__all__ = [
    "Molecule",
    "RDKitUnavailable",
    "element_symbol",
    "mol_from_ccd",
    "mol_from_smiles",
    "require_rdkit",
]


class RDKitUnavailable(ImportError):
    """RDKit is not importable and the named step needs it (molecules from the CCD or SMILES,
    reference conformers). Raised by :func:`require_rdkit`."""


def require_rdkit(what: str) -> tuple[ModuleType, ModuleType]:
    """``(rdkit.Chem, rdkit.Chem.AllChem)``, imported now; RDKit's own logging is turned off
    (errors are reported through :class:`InputError`). Raises :class:`RDKitUnavailable` naming
    ``what`` needed RDKit when it cannot be imported."""
    try:
        from rdkit import Chem, RDLogger
        from rdkit.Chem import AllChem
    except ImportError as err:
        raise RDKitUnavailable(
            f"{what} needs RDKit, which cannot be imported ({err}); install it "
            "(pip install rdkit) or build the AF3 feature cache on a machine that has it "
            "(reading cache entries, cropping and make_sample do not need RDKit)"
        ) from err
    RDLogger.DisableLog("rdApp.*")
    return Chem, AllChem


def element_symbol(ccd_symbol: str) -> str:
    """RDKit's spelling of a CCD element symbol ('CL' -> 'Cl', 'D' -> 'H')."""
    s = ccd_symbol.strip().capitalize()
    return "H" if s == "D" else s


@dataclass(frozen=True)
class Molecule:
    """An RDKit molecule (with hydrogens) and its heavy atoms' names and CCD coordinates.

    ``heavy_atoms`` [N_heavy] are the RDKit indices of the heavy atoms in output order;
    ``atom_names`` their names; ``ideal_positions`` / ``model_positions`` [N_heavy, 3] the CCD
    coordinates (NaN where absent; all NaN for SMILES).
    """

    mol: Chem.Mol  # rdkit.Chem.Mol
    heavy_atoms: tuple[int, ...]
    atom_names: tuple[str, ...]
    ideal_positions: np.ndarray
    model_positions: np.ndarray
    sanitized: bool

    @property
    def elements(self) -> np.ndarray:
        """[N_heavy] int32 atomic numbers."""
        return np.asarray([self.mol.GetAtomWithIdx(i).GetAtomicNum() for i in self.heavy_atoms],
                          dtype=np.int32)

    @property
    def charges(self) -> np.ndarray:
        """[N_heavy] int32 formal charges."""
        return np.asarray([self.mol.GetAtomWithIdx(i).GetFormalCharge() for i in self.heavy_atoms],
                          dtype=np.int32)

    def bonds(self) -> list[tuple[int, int, int]]:
        """Bonds between heavy atoms as (i, j, order) in output indices (order 4 = aromatic)."""
        pos = {a: k for k, a in enumerate(self.heavy_atoms)}
        out = []
        for b in self.mol.GetBonds():
            i, j = b.GetBeginAtomIdx(), b.GetEndAtomIdx()
            if i in pos and j in pos:
                order = 4 if b.GetIsAromatic() else int(round(b.GetBondTypeAsDouble()))
                out.append((pos[i], pos[j], order))
        return out


def mol_from_ccd(comp: ChemComp, remove: frozenset[str] = frozenset()) -> Molecule:
    """The RDKit molecule of a CCD component without the atoms named in ``remove``.

    Hydrogens bonded to a removed atom are removed too. Raises :class:`InputError` naming the
    component for a bond to an unknown element, :class:`RDKitUnavailable` without RDKit.
    """
    Chem, _ = require_rdkit(f"building the molecule of CCD component {comp.code}")
    bond_types = {1: Chem.BondType.SINGLE, 2: Chem.BondType.DOUBLE, 3: Chem.BondType.TRIPLE,
                  4: Chem.BondType.QUADRUPLE}
    drop = {i for i, n in enumerate(comp.atom_names) if n in remove}
    hydrogen = comp.is_hydrogen
    for i, j in comp.bonds:
        if i in drop and hydrogen[j]:
            drop.add(int(j))
        if j in drop and hydrogen[i]:
            drop.add(int(i))
    keep = [i for i in range(comp.num_atoms) if i not in drop]
    new_index = {old: new for new, old in enumerate(keep)}
    rw = Chem.RWMol()
    for old in keep:
        try:
            atom = Chem.Atom(element_symbol(comp.elements[old]))
        except RuntimeError:
            raise InputError(comp.source, f"component {comp.code}",
                             f"atom {comp.atom_names[old]} has unknown element "
                             f"{comp.elements[old]!r}") from None
        atom.SetFormalCharge(int(comp.charges[old]))
        atom.SetNoImplicit(True)  # the CCD lists every hydrogen
        atom.SetProp("name", comp.atom_names[old])
        rw.AddAtom(atom)
    # Kekule orders from the CCD; sanitization perceives aromaticity (the CCD flags agree).
    for (i, j), order in zip(comp.bonds, comp.bond_orders):
        if i in new_index and j in new_index:
            bond_type = bond_types.get(int(order), Chem.BondType.SINGLE)
            rw.AddBond(new_index[int(i)], new_index[int(j)], bond_type)
    mol = rw.GetMol()
    sanitized = True
    try:
        Chem.SanitizeMol(mol)
    except Exception:  # RDKit raises several exception types for valence/kekulization problems
        sanitized = False
        mol = rw.GetMol()
        mol.UpdatePropertyCache(strict=False)
        Chem.FastFindRings(mol)
    heavy = tuple(new_index[o] for o in keep if not hydrogen[o])
    kept_heavy = [o for o in keep if not hydrogen[o]]
    return Molecule(
        mol=mol,
        heavy_atoms=heavy,
        atom_names=tuple(comp.atom_names[o] for o in kept_heavy),
        ideal_positions=comp.ideal_positions[kept_heavy],
        model_positions=comp.model_positions[kept_heavy],
        sanitized=sanitized,
    )


def mol_from_smiles(
    smiles: str, *, path: str | os.PathLike | None = None, record: str = "ligand"
) -> Molecule:
    """The molecule of a SMILES string, hydrogens added; heavy atoms named element + count
    (``C1``, ``C2``, ``O1``, ...) in SMILES order.

    Raises :class:`InputError` naming ``record`` and the ``smiles`` field when RDKit cannot parse
    or sanitize it, :class:`RDKitUnavailable` without RDKit.
    """
    if not isinstance(smiles, str) or not smiles.strip():
        raise InputError(path, record, "field 'smiles': expected a non-empty SMILES string")
    where = f" in {os.fspath(path)}" if path is not None else ""
    Chem, _ = require_rdkit(f"parsing the SMILES of {record}{where}")
    mol = Chem.MolFromSmiles(smiles, sanitize=False)
    if mol is None:
        raise InputError(path, record, f"field 'smiles': RDKit cannot parse {smiles!r}")
    try:
        Chem.SanitizeMol(mol)
    except Exception as err:
        raise InputError(path, record,
                         f"field 'smiles': RDKit cannot sanitize {smiles!r}: {err}") from None
    mol = Chem.AddHs(mol)
    counts: dict[str, int] = {}
    heavy, names = [], []
    for atom in mol.GetAtoms():
        if atom.GetAtomicNum() == 1:
            continue
        sym = atom.GetSymbol().upper()
        counts[sym] = counts.get(sym, 0) + 1
        heavy.append(atom.GetIdx())
        names.append(f"{sym}{counts[sym]}")
    nan = np.full((len(heavy), 3), np.nan)
    return Molecule(mol, tuple(heavy), tuple(names), nan, nan.copy(), True)
