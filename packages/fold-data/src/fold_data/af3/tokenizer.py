"""AF3 tokenization and per-token / per-atom reference features (AF3 supplement 2.6 and 2.8).

* One token per standard residue: the 20 amino acids and ``UNK``, RNA ``A C G U N``, DNA
  ``DA DC DG DT DN``; its atoms are the residue's heavy atoms; its centre atom is CA (protein)
  or C1' (nucleic acids); its representative ("pseudo-beta") atom, whose distances the
  distogram and the confidence head's PDE and distance embedding use (supplement 4.3-4.4), is
  CB (CA for glycine), C4 for purines, C2 for pyrimidines, C1' for ``N`` / ``DN``.
* One token per heavy atom for everything else: ligands (CCD or SMILES), ions, glycans and
  modified polymer residues (``5CM``, ``A23``, ``SEP``, ...); the atom is its own centre and
  its own representative atom.

Atoms come from the CCD entry of each residue (hydrogens dropped, CCD order), not from the
structure: unresolved atoms are still there, with ``atom_resolved`` 0. A leaving atom is removed
when the atom it hangs on forms an inter-residue bond (``OXT`` of every residue but the
C-terminal one, ``OP3`` of every nucleotide but the 5' one, ``O1`` of a glycosylated sugar);
bonds are the polymer backbone links (C-N, O3'-P), the entry's covalent bonds (JSON
``bondedAtomPairs``, mmCIF ``_struct_conn``) and every component's own bonds.

Residue types (``restype``, 32 classes, AF3 Table 5): 0-19 the amino acids in AF2 order, 20
unknown amino acid (also every ligand token), 21-24 RNA A G C U, 25 unknown RNA, 26-29 DNA
A G C T, 30 unknown DNA, 31 gap. A modified residue's atom tokens take its parent's type.
"""

from __future__ import annotations

import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError

from .ccd import Ccd, default_ccd
from .conformers import Conformer, ccd_conformer, embed_conformer
from .molecules import mol_from_smiles
from .parse import Bond, Chain, Entry
from .schema import GAP

__all__ = [
    "GAP",
    "NUM_RESTYPES",
    "STANDARD_RESIDUES",
    "MAX_BOND_DISTANCE",
    "atom_name_from_chars",
    "leaving_atoms",
    "pseudo_beta_atom_name",
    "tokenize",
    "restype_of",
]

NUM_RESTYPES = 32
UNK_PROTEIN, UNK_RNA, UNK_DNA = 20, 25, 30
_RNA_TYPES = {"A": 21, "G": 22, "C": 23, "U": 24, "N": UNK_RNA}
_DNA_TYPES = {"DA": 26, "DG": 27, "DC": 28, "DT": 29, "DN": UNK_DNA}
_PROTEIN_TYPES = {**{rc.restype_1to3[a]: i for a, i in rc.restype_order.items()}, "UNK": 20}
STANDARD_RESIDUES = {"protein": _PROTEIN_TYPES, "rna": _RNA_TYPES, "dna": _DNA_TYPES}
_UNKNOWN = {"protein": UNK_PROTEIN, "rna": UNK_RNA, "dna": UNK_DNA}
_CENTRE = {"protein": "CA", "rna": "C1'", "dna": "C1'"}
_PURINES = frozenset({"A", "G", "DA", "DG"})
_LINK = {"protein": ("C", "N"), "rna": ("O3'", "P"), "dna": ("O3'", "P")}
MAX_BOND_DISTANCE = 2.4  # structure bonds longer than this are dropped (AF3 2.8, token_bonds)


def restype_of(code: str, mol_type: str, parent: str | None = None) -> int:
    """The 32-class residue type of a CCD code in a chain of ``mol_type`` (parent as fallback)."""
    if mol_type == "ligand":
        return UNK_PROTEIN
    table = STANDARD_RESIDUES[mol_type]
    for name in (code, parent):
        if name in table:
            return table[name]
    return _UNKNOWN[mol_type]


def pseudo_beta_atom_name(code: str, mol_type: str, atom_names) -> str:
    """The representative atom of a standard residue token (AF3's code,
    ``features.PseudoBetaInfo``; Protenix's ``distogram_rep_atom_mask``): CB, or CA where the
    residue has no CB (glycine); C4 for the purines ``A G DA DG``, C2 for the pyrimidines
    ``C U DC DT``. The unknown nucleotides ``N`` / ``DN`` have no base: C1' as Protenix (AF3's
    code logs a warning and takes the token's first atom)."""
    if mol_type == "protein":
        return "CB" if "CB" in atom_names else "CA"
    if code in ("N", "DN"):
        return "C1'"
    return "C4" if code in _PURINES else "C2"


def _name_chars(name: str) -> list[int]:
    """AF3 ``ref_atom_name_chars``: 4 characters, each ``ord(c) - 32`` (0-63), space padded."""
    padded = name.upper()[:4].ljust(4)
    return [min(max(ord(c) - 32, 0), 63) for c in padded]


def atom_name_from_chars(chars) -> str:
    """The atom name of one ``ref_atom_name_chars`` row (the inverse of the encoding above)."""
    return "".join(chr(int(c) + 32) for c in chars).strip()


def _residue_bonds(entry: Entry, ccd: Ccd) -> list[Bond]:
    """Backbone links between consecutive polymer residues (both atoms in the CCD entries)."""
    links = []
    for chain in entry.chains:
        if not chain.is_polymer:
            continue
        a_name, b_name = _LINK[chain.mol_type]
        for k in range(len(chain.residues) - 1):
            a, b = ccd.get(chain.residues[k]), ccd.get(chain.residues[k + 1])
            if a and b and a.atom_index(a_name) is not None and b.atom_index(b_name) is not None:
                links.append(Bond((chain.chain_id, k, a_name), (chain.chain_id, k + 1, b_name)))
    return links


def _leaving_atoms(bonds: list[Bond], entry: Entry, ccd: Ccd) -> dict[tuple[str, int], set[str]]:
    """Per (chain, residue): heavy leaving atoms bonded to an atom that forms a bond."""
    out: dict[tuple[str, int], set[str]] = {}
    for bond in bonds:
        for cid, res, name in (bond.a, bond.b):
            chain = entry.chain(cid)
            if chain.smiles is not None:
                continue
            comp = ccd.get(chain.residues[res])
            idx = comp.atom_index(name) if comp else None
            if idx is None:
                continue
            for nb in comp.neighbours(idx):
                if comp.leaving[nb] and not comp.is_hydrogen[nb]:
                    out.setdefault((cid, res), set()).add(comp.atom_names[nb])
    return out


def leaving_atoms(entry: Entry, ccd: Ccd | None = None) -> dict[tuple[str, int], set[str]]:
    """Per (chain ID, residue index) the leaving atoms :func:`tokenize` removes: heavy leaving
    atoms hanging on an atom that forms a polymer link or one of the entry's bonds."""
    ccd = (ccd or default_ccd()).with_text(entry.user_ccd)
    return _leaving_atoms(_residue_bonds(entry, ccd) + list(entry.bonds), entry, ccd)


def tokenize(
    entry: Entry, ccd: Ccd | None = None, *, seed: int = 0, max_attempts: int = 200
) -> dict[str, np.ndarray]:
    """Tokens, atoms, reference conformers and bonds of an entry (see the AF3 schema's
    ``RAW_FEATURES`` for every array). ``seed`` seeds the ETKDGv3 conformers.

    Raises :class:`InputError` naming the entity for a bond to an atom that does not exist or
    that a bond removed, and for a SMILES RDKit cannot read.
    """
    ccd = (ccd or default_ccd()).with_text(entry.user_ccd)
    links = _residue_bonds(entry, ccd)
    structure_bonds = list(entry.bonds)
    removed = _leaving_atoms(links + structure_bonds, entry, ccd)

    atom_index: dict[tuple[str, int, str], int] = {}
    tok: dict[str, list] = {k: [] for k in (
        "residue_index", "asym_id", "entity_id", "sym_id", "restype", "is_protein", "is_rna",
        "is_dna", "is_ligand", "token_center_atom", "token_pseudo_beta_atom", "is_atomized")}
    atom: dict[str, list] = {k: [] for k in (
        "ref_pos", "ref_mask", "ref_element", "ref_charge", "ref_atom_name_chars",
        "ref_space_uid", "ref_pos_source", "atom_to_token", "atom_positions", "atom_resolved")}
    intra_bonds: list[tuple[int, int, int]] = []
    copies: dict[int, int] = {}
    for asym, chain in enumerate(entry.chains):
        sym = copies.get(chain.entity_id, 0)
        copies[chain.entity_id] = sym + 1
        n_res = 1 if chain.smiles is not None else len(chain.residues)
        for res in range(n_res):
            conf, parent, code = _conformer(entry, chain, res, removed, ccd, seed, max_attempts)
            if not conf.atom_names:
                continue
            gt = chain.positions[res] if chain.positions is not None else None
            standard = chain.is_polymer and code in STANDARD_RESIDUES[chain.mol_type]
            restype = restype_of(code, chain.mol_type, parent)
            first = len(atom["ref_pos"])
            uid = _next_uid(atom["ref_space_uid"])
            for k, name in enumerate(conf.atom_names):
                atom_index[(chain.chain_id, res, name)] = first + k
                xyz = gt.get(name) if gt else None
                atom["ref_pos"].append(conf.positions[k])
                atom["ref_mask"].append(conf.mask[k])
                atom["ref_element"].append(conf.elements[k])
                atom["ref_charge"].append(conf.charges[k])
                atom["ref_atom_name_chars"].append(_name_chars(name))
                atom["ref_space_uid"].append(uid)
                atom["ref_pos_source"].append(conf.source)
                atom["atom_positions"].append(np.zeros(3) if xyz is None else xyz)
                atom["atom_resolved"].append(xyz is not None)
            intra_bonds += [(first + i, first + j, o) for i, j, o in conf.bonds]
            n_tokens = 1 if standard else len(conf.atom_names)
            for t in range(n_tokens):
                token = len(tok["restype"])
                if standard:
                    names = conf.atom_names
                    centre = _CENTRE[chain.mol_type]
                    centre_k = names.index(centre) if centre in names else 0
                    rep = pseudo_beta_atom_name(code, chain.mol_type, names)
                    # every standard residue's CCD entry has its representative atom (never a
                    # leaving atom); the centre is the fallback for a user CCD that lacks it
                    rep_k = names.index(rep) if rep in names else centre_k
                    atom["atom_to_token"] += [token] * len(names)
                    tok["token_center_atom"].append(first + centre_k)
                    tok["token_pseudo_beta_atom"].append(first + rep_k)
                else:
                    atom["atom_to_token"].append(token)
                    tok["token_center_atom"].append(first + t)
                    tok["token_pseudo_beta_atom"].append(first + t)
                tok["residue_index"].append(res)
                tok["asym_id"].append(asym)
                tok["entity_id"].append(chain.entity_id - 1)
                tok["sym_id"].append(sym)
                tok["restype"].append(restype)
                for kind in ("protein", "rna", "dna", "ligand"):
                    tok[f"is_{kind}"].append(chain.mol_type == kind)
                tok["is_atomized"].append(not standard)
    if not tok["restype"]:
        raise InputError(entry.source, entry.name, "no atoms to tokenize (every chain is empty)")

    positions = np.asarray(atom["atom_positions"], dtype=np.float32).reshape(-1, 3)
    resolved = np.asarray(atom["atom_resolved"], dtype=bool)
    inter = []
    for bond in links + structure_bonds:
        ends = []
        for end in (bond.a, bond.b):
            if end not in atom_index:
                if bond in links:
                    break  # a link atom absent after all (e.g. removed): no backbone bond
                cid, res, name = end
                raise InputError(entry.source, f"chain {cid} residue {res + 1}",
                                 f"bonded atom {name!r} is not among the residue's atoms after "
                                 "leaving atoms were removed")
            ends.append(atom_index[end])
        if len(ends) < 2:
            continue
        i, j = ends
        if bond not in links and resolved[i] and resolved[j]:
            if np.linalg.norm(positions[i] - positions[j]) > MAX_BOND_DISTANCE:
                continue  # a struct_conn record the coordinates do not support
        inter.append((i, j, 1))
    all_bonds = _unique_bonds(intra_bonds + inter)

    feats = {k: np.asarray(v, dtype=np.int32) for k, v in tok.items()}
    feats["token_index"] = np.arange(len(tok["restype"]), dtype=np.int32)
    feats["ref_pos"] = np.asarray(atom["ref_pos"], dtype=np.float32).reshape(-1, 3)
    feats["ref_mask"] = np.asarray(atom["ref_mask"], dtype=np.float32)
    feats["ref_element"] = np.asarray(atom["ref_element"], dtype=np.int32)
    feats["ref_charge"] = np.asarray(atom["ref_charge"], dtype=np.float32)
    feats["ref_atom_name_chars"] = np.asarray(atom["ref_atom_name_chars"], np.int32).reshape(-1, 4)
    for k in ("ref_space_uid", "ref_pos_source", "atom_to_token"):
        feats[k] = np.asarray(atom[k], dtype=np.int32)
    feats["atom_positions"] = positions
    feats["atom_resolved"] = resolved.astype(np.float32)
    feats["atom_bonds"] = all_bonds[:, :2].copy()
    feats["atom_bond_order"] = all_bonds[:, 2].copy()
    feats["token_bonds"] = _token_bonds(all_bonds, feats["atom_to_token"], feats["is_atomized"])
    return feats


def _next_uid(uids: list[int]) -> int:
    return uids[-1] + 1 if uids else 0


def _conformer(
    entry: Entry, chain: Chain, res: int, removed: dict, ccd: Ccd, seed: int, max_attempts: int
) -> tuple[Conformer, str | None, str]:
    record = f"{chain.mol_type} {chain.chain_id}"
    if chain.smiles is not None:
        mol = mol_from_smiles(chain.smiles, path=entry.source or None, record=record)
        return embed_conformer(mol, seed, max_attempts=max_attempts), None, "SMILES"
    code = chain.residues[res]
    comp = ccd.require(code, entry.source or None, f"{record} residue {res + 1}", "ccd code")
    drop = frozenset(removed.get((chain.chain_id, res), ()))
    return ccd_conformer(comp, drop, seed=seed, max_attempts=max_attempts), comp.parent, code


def _unique_bonds(bonds: list[tuple[int, int, int]]) -> np.ndarray:
    """[N_bond, 3] (i < j, order) with duplicates (either direction) removed, first kept."""
    seen: dict[tuple[int, int], int] = {}
    for i, j, o in bonds:
        if i != j:
            seen.setdefault((min(i, j), max(i, j)), o)
    return np.asarray([(i, j, o) for (i, j), o in seen.items()], dtype=np.int32).reshape(-1, 3)


def _token_bonds(bonds: np.ndarray, atom_to_token: np.ndarray, atomized: np.ndarray) -> np.ndarray:
    """[N_tbond, 2] token pairs (i < j) bonded by an atom pair, restricted as AF3 does to
    bonds that involve a per-atom token (ligand-ligand and polymer-ligand, modified residues)."""
    ti, tj = atom_to_token[bonds[:, 0]], atom_to_token[bonds[:, 1]]
    keep = (ti != tj) & (atomized[ti].astype(bool) | atomized[tj].astype(bool))
    pairs = np.stack([np.minimum(ti, tj), np.maximum(ti, tj)], axis=-1)[keep]
    return np.unique(pairs, axis=0).astype(np.int32).reshape(-1, 2)
