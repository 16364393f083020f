"""Reference conformers (AF3 supplement 2.8, ``ref_pos``): RDKit ETKDGv3, seeded, with fallbacks.

For each molecule, in order until one works:

1. ETKDGv3 embedding with the given seed (hydrogens included, so the geometry is chemical);
2. ETKDGv3 again from random starting coordinates (helps large flexible or strained molecules);
3. the CCD ideal coordinates (when every kept heavy atom has one);
4. the CCD model coordinates (idem);
5. nothing: zeros with ``ref_mask`` 0.

The source is returned (and stored as the ``ref_pos_source`` feature), so a model or a user can
tell a computed conformer from a fallback. Results are deterministic for a seed; they are memoized
per process by (component, removed atoms, seed), since polymers repeat the same few residues.
This is the expensive, deterministic step that the ahead-of-time cache stores (MegaFold IV-A).
RDKit is imported when a conformer is computed (:func:`.molecules.require_rdkit`), so reading the
cache needs no RDKit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ccd import ChemComp
from .molecules import Molecule, mol_from_ccd, require_rdkit

__all__ = [
    "Conformer",
    "SOURCE_RDKIT",
    "SOURCE_CCD_IDEAL",
    "SOURCE_CCD_MODEL",
    "SOURCE_NONE",
    "ccd_conformer",
    "clear_conformer_memo",
    "embed_conformer",
]

SOURCE_RDKIT, SOURCE_CCD_IDEAL, SOURCE_CCD_MODEL, SOURCE_NONE = 0, 1, 2, 3
SOURCE_NAMES = {SOURCE_RDKIT: "rdkit-etkdgv3", SOURCE_CCD_IDEAL: "ccd-ideal",
                SOURCE_CCD_MODEL: "ccd-model", SOURCE_NONE: "none"}


@dataclass(frozen=True)
class Conformer:
    """Heavy-atom reference conformer of one molecule.

    ``positions`` [N_heavy, 3] float32 (Angstrom, centred on the mean), ``mask`` [N_heavy] bool,
    ``source`` one of the ``SOURCE_*`` codes, plus the molecule's names, elements, charges and
    heavy-atom bonds.
    """

    atom_names: tuple[str, ...]
    elements: np.ndarray  # [N_heavy] int32 atomic numbers
    charges: np.ndarray  # [N_heavy] int32
    positions: np.ndarray
    mask: np.ndarray
    source: int
    bonds: tuple[tuple[int, int, int], ...]  # (i, j, order) heavy-atom bonds, order 4 aromatic


def _centre(pos: np.ndarray) -> np.ndarray:
    return (pos - pos.mean(axis=0, keepdims=True)).astype(np.float32) if len(pos) else pos


def embed_conformer(molecule: Molecule, seed: int, *, max_attempts: int = 200) -> Conformer:
    """The reference conformer of ``molecule`` by the fallback order in the module docstring."""
    n = len(molecule.heavy_atoms)
    positions, source = None, SOURCE_NONE
    if n == 1 and molecule.mol.GetNumAtoms() == 1:
        positions, source = np.zeros((1, 3)), SOURCE_RDKIT  # a bare ion: nothing to embed
    elif molecule.sanitized and n:
        Chem, AllChem = require_rdkit("embed_conformer (ETKDGv3 reference conformers)")
        mol = Chem.Mol(molecule.mol)
        for random_coords in (False, True):
            params = AllChem.ETKDGv3()
            params.randomSeed = int(seed)
            params.useRandomCoords = random_coords
            params.maxIterations = max_attempts
            params.numThreads = 1
            try:
                conf_id = AllChem.EmbedMolecule(mol, params)
            except (RuntimeError, ValueError):
                conf_id = -1
            if conf_id >= 0:
                xyz = mol.GetConformer(conf_id).GetPositions()
                positions, source = xyz[list(molecule.heavy_atoms)], SOURCE_RDKIT
                break
    if positions is None:
        for coords, src in ((molecule.ideal_positions, SOURCE_CCD_IDEAL),
                            (molecule.model_positions, SOURCE_CCD_MODEL)):
            if n and np.isfinite(coords).all():
                positions, source = coords, src
                break
    if positions is None:
        positions, mask = np.zeros((n, 3)), np.zeros(n, dtype=bool)
    else:
        mask = np.ones(n, dtype=bool)
    return Conformer(
        atom_names=molecule.atom_names,
        elements=molecule.elements,
        charges=molecule.charges,
        positions=_centre(np.asarray(positions, dtype=np.float64)),
        mask=mask,
        source=source,
        bonds=tuple(molecule.bonds()),
    )


_MEMO: dict[tuple, Conformer] = {}


def clear_conformer_memo() -> None:
    """Forget the memoized conformers (benchmarks measure preparation from scratch with this)."""
    _MEMO.clear()


def ccd_conformer(
    comp: ChemComp, remove: frozenset[str] = frozenset(), *, seed: int = 0, max_attempts: int = 200
) -> Conformer:
    """The (memoized) reference conformer of CCD component ``comp`` without atoms ``remove``."""
    key = (comp.code, comp.source, remove, seed, max_attempts)
    conf = _MEMO.get(key)
    if conf is None:
        conf = embed_conformer(mol_from_ccd(comp, remove), seed, max_attempts=max_attempts)
        _MEMO[key] = conf
    return conf
