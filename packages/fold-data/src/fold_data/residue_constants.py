"""Residue constants for AlphaFold2-style models: atom types, rigid groups, chi angles, geometry.

Everything the data pipeline, the model and the losses need to know about the 20 amino acids,
written out in one place (numpy only).

Sources
-------
* AF2 supplement (Jumper et al. 2021, Nature 596, Supplementary Information):
  - 1.2.1: the 37-atom (``atom37``) and 14-atom (``atom14``) representations, residue order
    ``ARNDCQEGHILKMFPSTWYV`` and the HHblits MSA alphabet;
  - 1.8 and Table 2: the 8 rigid groups per residue (backbone, pre-omega, phi, psi, chi1-chi4),
    the atoms that define each chi angle and the idealized local atom positions;
  - 1.9.3: ambiguous (180-degree-symmetric) side chains and the atom renaming swaps;
  - 1.9.11: stereochemical violation loss (bond lengths/angles with a tolerance of 12 sigma,
    as the supplement and AF2's ``model/config.py``, ``violation_tolerance_factor: 12.0``;
    clashes from van der Waals radii with ``clash_overlap_tolerance: 1.5``). The violation
    constants, their sources and where they differ from AF2's code: ``docs/violation_constants.md``.
* Idealized geometry: the bond lengths and angles of Engh & Huber (1991), "Accurate bond and
  angle parameters for X-ray protein structure refinement", Acta Cryst. A47, 392-400, as used by
  AF2 to build its literature positions (``rigid_group_atom_positions`` below) and, per residue, in
  the table ``stereo_chemical_props.txt`` next to this module (read by
  :func:`load_stereo_chemical_props`).
* Van der Waals radii: Bondi (1964), J. Phys. Chem. 68, 441.

Residue type codes (``aatype``): 0-19 the amino acids in ``restypes`` order, 20 unknown (X).
MSA codes: 0-19 as aatype, 20 X, 21 gap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------
# Residue types (supplement 1.2.1)
# ---------------------------------------------------------------------------------------------

restypes: list[str] = list("ARNDCQEGHILKMFPSTWYV")
restype_order: dict[str, int] = {r: i for i, r in enumerate(restypes)}
restype_num: int = len(restypes)  # 20
unk_restype_index: int = restype_num  # 20: "X", the unknown residue type
restypes_with_x: list[str] = restypes + ["X"]
restype_order_with_x: dict[str, int] = {r: i for i, r in enumerate(restypes_with_x)}
restypes_with_x_and_gap: list[str] = restypes_with_x + ["-"]

restype_1to3: dict[str, str] = {
    "A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS",
    "Q": "GLN", "E": "GLU", "G": "GLY", "H": "HIS", "I": "ILE",
    "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE", "P": "PRO",
    "S": "SER", "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL",
}  # fmt: skip
restype_3to1: dict[str, str] = {v: k for k, v in restype_1to3.items()}
unk_restype: str = "UNK"
# Three-letter names in aatype order, index 20 = UNK.
resnames: list[str] = [restype_1to3[r] for r in restypes] + [unk_restype]
resname_to_idx: dict[str, int] = {n: i for i, n in enumerate(resnames)}

# Modified residues -> their standard parent (the chemical component dictionary's
# ``mon_nstd_parent_comp_id``) for the modifications common in the PDB. mmCIF parsing uses this
# first and falls back on gemmi's tabulated components for the rest.
MODIFIED_RESIDUE_PARENTS: dict[str, str] = {
    "MSE": "MET",  # selenomethionine
    "FME": "MET",  # N-formylmethionine
    "MHO": "MET",  # S-oxymethionine
    "SEP": "SER",  # phosphoserine
    "TPO": "THR",  # phosphothreonine
    "PTR": "TYR",  # phosphotyrosine
    "TYS": "TYR",  # sulfotyrosine
    "HYP": "PRO",  # 4-hydroxyproline
    "MLY": "LYS",  # N-dimethyl-lysine
    "M3L": "LYS",  # N-trimethyl-lysine
    "MLZ": "LYS",  # N-methyl-lysine
    "ALY": "LYS",  # N-acetyl-lysine
    "KCX": "LYS",  # lysine NZ-carboxylic acid
    "LLP": "LYS",  # lysine-pyridoxal-5'-phosphate
    "CSO": "CYS",  # S-hydroxycysteine
    "CSD": "CYS",  # 3-sulfinoalanine
    "CSS": "CYS",  # S-mercaptocysteine
    "CME": "CYS",  # S,S-(2-hydroxyethyl)thiocysteine
    "CAS": "CYS",  # S-(dimethylarsenic)cysteine
    "OCS": "CYS",  # cysteine sulfonic acid
    "SMC": "CYS",  # S-methylcysteine
    "CGU": "GLU",  # gamma-carboxy-glutamic acid
    "PCA": "GLN",  # pyroglutamic acid (CCD parent: GLN)
    "HIC": "HIS",  # 4-methyl-histidine
    "NEP": "HIS",  # N1-phosphonohistidine
    "MEN": "ASN",  # N-methyl asparagine
    "AGM": "ARG",  # 5-methyl-arginine
    "DAL": "ALA",  # D-alanine
    "NLE": "LEU",  # norleucine
    "SAC": "SER",  # N-acetyl-serine
}

# ---------------------------------------------------------------------------------------------
# Atom types (supplement 1.2.1): atom37 and atom14
# ---------------------------------------------------------------------------------------------

atom_types: list[str] = [
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD", "CD1", "CD2",
    "ND1", "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3", "NE", "NE1", "NE2", "OE1",
    "OE2", "CH2", "NH1", "NH2", "OH", "CZ", "CZ2", "CZ3", "NZ", "OXT",
]  # fmt: skip
atom_order: dict[str, int] = {a: i for i, a in enumerate(atom_types)}
atom_type_num: int = len(atom_types)  # 37
atom14_num: int = 14

# The heavy atoms of each residue in atom14 slot order (backbone N, CA, C, O first, then the
# side chain outwards). '' pads unused slots. OXT has no atom14 slot.
_ATOM14: dict[str, tuple[str, ...]] = {
    "ALA": ("N", "CA", "C", "O", "CB"),
    "ARG": ("N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": ("N", "CA", "C", "O", "CB", "CG", "OD1", "ND2"),
    "ASP": ("N", "CA", "C", "O", "CB", "CG", "OD1", "OD2"),
    "CYS": ("N", "CA", "C", "O", "CB", "SG"),
    "GLN": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": ("N", "CA", "C", "O"),
    "HIS": ("N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": ("N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1"),
    "LEU": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2"),
    "LYS": ("N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"),
    "MET": ("N", "CA", "C", "O", "CB", "CG", "SD", "CE"),
    "PHE": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": ("N", "CA", "C", "O", "CB", "CG", "CD"),
    "SER": ("N", "CA", "C", "O", "CB", "OG"),
    "THR": ("N", "CA", "C", "O", "CB", "OG1", "CG2"),
    "TRP": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3",
            "CH2"),
    "TYR": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": ("N", "CA", "C", "O", "CB", "CG1", "CG2"),
    "UNK": (),
}
restype_name_to_atom14_names: dict[str, list[str]] = {
    name: list(atoms) + [""] * (atom14_num - len(atoms)) for name, atoms in _ATOM14.items()
}
# Heavy atoms per residue type (without OXT), three-letter name -> atom names.
residue_atoms: dict[str, list[str]] = {n: list(a) for n, a in _ATOM14.items() if n != "UNK"}

# ---------------------------------------------------------------------------------------------
# Chi angles (supplement 1.8, Table 2)
# ---------------------------------------------------------------------------------------------

# The four atoms defining each chi angle, in order chi1..chi4.
chi_angles_atoms: dict[str, list[list[str]]] = {
    "ALA": [],
    "ARG": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD"], ["CB", "CG", "CD", "NE"],
            ["CG", "CD", "NE", "CZ"]],
    "ASN": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "OD1"]],
    "ASP": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "OD1"]],
    "CYS": [["N", "CA", "CB", "SG"]],
    "GLN": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD"], ["CB", "CG", "CD", "OE1"]],
    "GLU": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD"], ["CB", "CG", "CD", "OE1"]],
    "GLY": [],
    "HIS": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "ND1"]],
    "ILE": [["N", "CA", "CB", "CG1"], ["CA", "CB", "CG1", "CD1"]],
    "LEU": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD1"]],
    "LYS": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD"], ["CB", "CG", "CD", "CE"],
            ["CG", "CD", "CE", "NZ"]],
    "MET": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "SD"], ["CB", "CG", "SD", "CE"]],
    "PHE": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD1"]],
    "PRO": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD"]],
    "SER": [["N", "CA", "CB", "OG"]],
    "THR": [["N", "CA", "CB", "OG1"]],
    "TRP": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD1"]],
    "TYR": [["N", "CA", "CB", "CG"], ["CA", "CB", "CG", "CD1"]],
    "VAL": [["N", "CA", "CB", "CG1"]],
}  # fmt: skip

# [21, 4] float32: 1 where residue type (aatype order, row 20 = UNK) has chi angle k.
chi_angles_mask: np.ndarray = np.zeros((restype_num + 1, 4), dtype=np.float32)
for _i, _r in enumerate(restypes):
    chi_angles_mask[_i, : len(chi_angles_atoms[restype_1to3[_r]])] = 1.0

# [21, 4] float32: 1 where the chi angle is pi-periodic (the last chi of the symmetric side
# chains ASP, GLU, PHE, TYR; supplement 1.9.3).
chi_pi_periodic: np.ndarray = np.zeros((restype_num + 1, 4), dtype=np.float32)
chi_pi_periodic[restype_order["D"], 1] = 1.0
chi_pi_periodic[restype_order["E"], 2] = 1.0
chi_pi_periodic[restype_order["F"], 1] = 1.0
chi_pi_periodic[restype_order["Y"], 1] = 1.0

# ---------------------------------------------------------------------------------------------
# Rigid groups and idealized atom positions (supplement 1.8, Table 2; Engh & Huber 1991)
# ---------------------------------------------------------------------------------------------

# Rigid group indices: 0 backbone (N, CA, C, CB), 1 pre-omega, 2 phi, 3 psi (O), 4-7 chi1-chi4.
# Each atom: (name, group, position in Angstrom in that group's local frame). The backbone frame
# has CA at the origin, C on the +x axis and N in the xy plane (y > 0). The psi frame has C at the
# origin and x along CA->C. A chi frame has its origin on the third chi atom and x along the
# axis (second -> third chi atom); at torsion 0 the fourth chi atom is cis to the first.
rigid_group_atom_positions: dict[str, list[tuple[str, int, tuple[float, float, float]]]] = {
    "ALA": [
        ("N", 0, (-0.525, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, -0.000, -0.000)),
        ("CB", 0, (-0.529, -0.774, -1.205)),
        ("O", 3, (0.627, 1.062, 0.000)),
    ],
    "ARG": [
        ("N", 0, (-0.524, 1.362, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, -0.000, -0.000)),
        ("CB", 0, (-0.524, -0.778, -1.209)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.616, 1.390, -0.000)),
        ("CD", 5, (0.564, 1.414, 0.000)),
        ("NE", 6, (0.539, 1.357, -0.000)),
        ("NH1", 7, (0.206, 2.301, 0.000)),
        ("NH2", 7, (2.078, 0.978, -0.000)),
        ("CZ", 7, (0.758, 1.093, -0.000)),
    ],
    "ASN": [
        ("N", 0, (-0.536, 1.357, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, -0.000, -0.000)),
        ("CB", 0, (-0.531, -0.787, -1.200)),
        ("O", 3, (0.625, 1.062, 0.000)),
        ("CG", 4, (0.584, 1.399, 0.000)),
        ("ND2", 5, (0.593, -1.188, 0.001)),
        ("OD1", 5, (0.633, 1.059, 0.000)),
    ],
    "ASP": [
        ("N", 0, (-0.525, 1.362, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, 0.000, -0.000)),
        ("CB", 0, (-0.526, -0.778, -1.208)),
        ("O", 3, (0.626, 1.062, -0.000)),
        ("CG", 4, (0.593, 1.398, -0.000)),
        ("OD1", 5, (0.610, 1.091, 0.000)),
        ("OD2", 5, (0.592, -1.101, -0.003)),
    ],
    "CYS": [
        ("N", 0, (-0.522, 1.362, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, 0.000, 0.000)),
        ("CB", 0, (-0.519, -0.773, -1.212)),
        ("O", 3, (0.625, 1.062, -0.000)),
        ("SG", 4, (0.728, 1.653, 0.000)),
    ],
    "GLN": [
        ("N", 0, (-0.526, 1.361, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.525, -0.779, -1.207)),
        ("O", 3, (0.626, 1.062, -0.000)),
        ("CG", 4, (0.615, 1.393, 0.000)),
        ("CD", 5, (0.587, 1.399, -0.000)),
        ("NE2", 6, (0.593, -1.189, -0.001)),
        ("OE1", 6, (0.634, 1.060, 0.000)),
    ],
    "GLU": [
        ("N", 0, (-0.528, 1.361, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, -0.000, -0.000)),
        ("CB", 0, (-0.526, -0.781, -1.207)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.615, 1.392, 0.000)),
        ("CD", 5, (0.600, 1.397, 0.000)),
        ("OE1", 6, (0.607, 1.095, -0.000)),
        ("OE2", 6, (0.589, -1.104, -0.001)),
    ],
    "GLY": [
        ("N", 0, (-0.572, 1.337, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.517, -0.000, -0.000)),
        ("O", 3, (0.626, 1.062, -0.000)),
    ],
    "HIS": [
        ("N", 0, (-0.527, 1.360, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.525, -0.778, -1.208)),
        ("O", 3, (0.625, 1.063, 0.000)),
        ("CG", 4, (0.600, 1.370, -0.000)),
        ("CD2", 5, (0.889, -1.021, 0.003)),
        ("ND1", 5, (0.744, 1.160, -0.000)),
        ("CE1", 5, (2.030, 0.851, 0.002)),
        ("NE2", 5, (2.145, -0.466, 0.004)),
    ],
    "ILE": [
        ("N", 0, (-0.493, 1.373, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, -0.000, -0.000)),
        ("CB", 0, (-0.536, -0.793, -1.213)),
        ("O", 3, (0.627, 1.062, -0.000)),
        ("CG1", 4, (0.534, 1.437, -0.000)),
        ("CG2", 4, (0.540, -0.785, -1.199)),
        ("CD1", 5, (0.619, 1.391, 0.000)),
    ],
    "LEU": [
        ("N", 0, (-0.520, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, -0.000, -0.000)),
        ("CB", 0, (-0.522, -0.773, -1.214)),
        ("O", 3, (0.625, 1.063, -0.000)),
        ("CG", 4, (0.678, 1.371, 0.000)),
        ("CD1", 5, (0.530, 1.430, -0.000)),
        ("CD2", 5, (0.535, -0.774, 1.200)),
    ],
    "LYS": [
        ("N", 0, (-0.526, 1.362, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.524, -0.778, -1.208)),
        ("O", 3, (0.626, 1.062, -0.000)),
        ("CG", 4, (0.619, 1.390, 0.000)),
        ("CD", 5, (0.559, 1.417, 0.000)),
        ("CE", 6, (0.560, 1.416, 0.000)),
        ("NZ", 7, (0.554, 1.387, 0.000)),
    ],
    "MET": [
        ("N", 0, (-0.521, 1.364, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.523, -0.776, -1.210)),
        ("O", 3, (0.625, 1.062, -0.000)),
        ("CG", 4, (0.613, 1.391, -0.000)),
        ("SD", 5, (0.703, 1.695, 0.000)),
        ("CE", 6, (0.320, 1.786, -0.000)),
    ],
    "PHE": [
        ("N", 0, (-0.518, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, 0.000, -0.000)),
        ("CB", 0, (-0.525, -0.776, -1.212)),
        ("O", 3, (0.626, 1.062, -0.000)),
        ("CG", 4, (0.607, 1.377, 0.000)),
        ("CD1", 5, (0.709, 1.195, -0.000)),
        ("CD2", 5, (0.706, -1.196, 0.000)),
        ("CE1", 5, (2.102, 1.198, -0.000)),
        ("CE2", 5, (2.098, -1.201, -0.000)),
        ("CZ", 5, (2.794, -0.003, -0.001)),
    ],
    "PRO": [
        ("N", 0, (-0.566, 1.351, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, -0.000, 0.000)),
        ("CB", 0, (-0.546, -0.611, -1.293)),
        ("O", 3, (0.621, 1.066, 0.000)),
        ("CG", 4, (0.382, 1.445, 0.0)),
        # CB-CG-CD opened by ~2 degrees from the Engh & Huber value so that the idealized ring
        # closes onto N at the common pucker (as AF2 does).
        ("CD", 5, (0.477, 1.424, 0.0)),
    ],
    "SER": [
        ("N", 0, (-0.529, 1.360, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, -0.000, -0.000)),
        ("CB", 0, (-0.518, -0.777, -1.211)),
        ("O", 3, (0.626, 1.062, -0.000)),
        ("OG", 4, (0.503, 1.325, 0.000)),
    ],
    "THR": [
        ("N", 0, (-0.517, 1.364, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, -0.000)),
        ("CB", 0, (-0.516, -0.793, -1.215)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG2", 4, (0.550, -0.718, -1.228)),
        ("OG1", 4, (0.472, 1.353, 0.000)),
    ],
    "TRP": [
        ("N", 0, (-0.521, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, -0.000, 0.000)),
        ("CB", 0, (-0.523, -0.776, -1.212)),
        ("O", 3, (0.627, 1.062, 0.000)),
        ("CG", 4, (0.609, 1.370, -0.000)),
        ("CD1", 5, (0.824, 1.091, 0.000)),
        ("CD2", 5, (0.854, -1.148, -0.005)),
        ("CE2", 5, (2.186, -0.678, -0.007)),
        ("CE3", 5, (0.622, -2.530, -0.007)),
        ("NE1", 5, (2.140, 0.690, -0.004)),
        ("CH2", 5, (3.028, -2.890, -0.013)),
        ("CZ2", 5, (3.283, -1.543, -0.011)),
        ("CZ3", 5, (1.715, -3.389, -0.011)),
    ],
    "TYR": [
        ("N", 0, (-0.522, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, -0.000, -0.000)),
        ("CB", 0, (-0.522, -0.776, -1.213)),
        ("O", 3, (0.627, 1.062, -0.000)),
        ("CG", 4, (0.607, 1.382, -0.000)),
        ("CD1", 5, (0.716, 1.195, -0.000)),
        ("CD2", 5, (0.713, -1.194, -0.001)),
        ("CE1", 5, (2.107, 1.200, -0.002)),
        ("CE2", 5, (2.104, -1.201, -0.003)),
        ("OH", 5, (4.168, -0.002, -0.005)),
        ("CZ", 5, (2.791, -0.001, -0.003)),
    ],
    "VAL": [
        ("N", 0, (-0.494, 1.373, -0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, -0.000, -0.000)),
        ("CB", 0, (-0.533, -0.795, -1.213)),
        ("O", 3, (0.627, 1.062, -0.000)),
        ("CG1", 4, (0.540, 1.429, -0.000)),
        ("CG2", 4, (0.533, -0.776, 1.203)),
    ],
}

# Ambiguous side chains (supplement 1.9.3): renaming these atom pairs gives the same molecule.
residue_atom_renaming_swaps: dict[str, dict[str, str]] = {
    "ASP": {"OD1": "OD2"},
    "GLU": {"OE1": "OE2"},
    "PHE": {"CD1": "CD2", "CE1": "CE2"},
    "TYR": {"CD1": "CD2", "CE1": "CE2"},
}

# Van der Waals radii in Angstrom by element (Bondi 1964), for the clash term of the violation
# loss (supplement 1.9.11).
van_der_waals_radius: dict[str, float] = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}

# Peptide bond geometry between residue i (C) and i+1 (N, CA), the values of AF2's
# residue_constants.py (Engh & Huber 1991): index 0 for a non-proline next residue, 1 for
# proline.
between_res_bond_length_c_n: tuple[float, float] = (1.329, 1.341)
between_res_bond_length_stddev_c_n: tuple[float, float] = (0.014, 0.016)
# (mean, stddev) of the cosine of the C-N-CA angle (121.352 +- 2.315 deg) and of the CA-C-N
# angle (116.568 +- 1.995 deg) across the peptide bond (AF2's residue_constants.py). The loss
# uses 0.0311 for CA-C-N as current AlphaFold does; AF2's code before that fix (v2.0, the one
# the released weights were fine-tuned with) took the C-N length stddev, 0.014, there.
between_res_cos_angles_c_n_ca: tuple[float, float] = (-0.5203, 0.0353)
between_res_cos_angles_ca_c_n: tuple[float, float] = (-0.4473, 0.0311)

# ---------------------------------------------------------------------------------------------
# Stereochemistry table (Engh & Huber 1991, per residue)
# ---------------------------------------------------------------------------------------------

_STEREO_FILE = Path(__file__).with_name("stereo_chemical_props.txt")


@dataclass(frozen=True)
class Bond:
    """A covalent bond: atom names, ideal length (Angstrom) and its standard deviation."""

    atom1_name: str
    atom2_name: str
    length: float
    stddev: float


@dataclass(frozen=True)
class BondAngle:
    """A bond angle atom1-atom2-atom3 (atom2 the vertex), in radians, and its standard deviation."""

    atom1_name: str
    atom2_name: str
    atom3_name: str
    angle_rad: float
    stddev: float


@functools.cache
def load_stereo_chemical_props(
    path: str | Path | None = None,
) -> tuple[Mapping[str, list[Bond]], Mapping[str, list[Bond]], Mapping[str, list[BondAngle]]]:
    """Read the per-residue bond-length/bond-angle table.

    Returns ``(residue_bonds, residue_virtual_bonds, residue_bond_angles)``, each keyed by the
    three-letter residue name. The virtual bonds are the 1-3 distances spanned by every bond
    angle (law of cosines), with a standard deviation propagated to first order from the two
    bond lengths and the angle; the violation loss bounds them like real bonds.

    The file format: a ``Bond`` section of ``A1-A2 RES mean stddev`` lines and an ``Angle``
    section of ``A1-A2-A3 RES mean_degrees stddev_degrees`` lines, each headed by its name and
    ended by a line ``-``. Lines starting with ``#`` are comments.
    """
    from fold_data.errors import InputError  # local: keeps this module importable on its own

    path = _STEREO_FILE if path is None else Path(path)
    residue_bonds: dict[str, list[Bond]] = {}
    residue_bond_angles: dict[str, list[BondAngle]] = {}
    section = None
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if section is None:
            section = line.split()[0]
            if section not in ("Bond", "Angle"):
                raise InputError(
                    path, f"line {lineno}", f"expected a 'Bond' or 'Angle' header, got {line!r}"
                )
            continue
        if line == "-":
            section = None
            continue
        fields = line.split()
        if len(fields) != 4:
            raise InputError(
                path, f"line {lineno}", f"expected 'atoms residue mean stddev', got {line!r}"
            )
        atoms, resname = fields[0].split("-"), fields[1]
        try:
            mean, stddev = float(fields[2]), float(fields[3])
        except ValueError:
            raise InputError(
                path, f"line {lineno}", f"mean and stddev must be numbers: {line!r}"
            ) from None
        if section == "Bond" and len(atoms) == 2:
            residue_bonds.setdefault(resname, []).append(Bond(atoms[0], atoms[1], mean, stddev))
        elif section == "Angle" and len(atoms) == 3:
            residue_bond_angles.setdefault(resname, []).append(
                BondAngle(atoms[0], atoms[1], atoms[2], math.radians(mean), math.radians(stddev))
            )
        else:
            raise InputError(
                path, f"line {lineno}", f"wrong number of atoms for a {section}: {line!r}"
            )
    if section is not None:
        raise InputError(path, section, "section not terminated by a '-' line (truncated file?)")

    residue_virtual_bonds: dict[str, list[Bond]] = {}
    for resname, angles in residue_bond_angles.items():
        lengths = {
            frozenset((b.atom1_name, b.atom2_name)): b for b in residue_bonds.get(resname, [])
        }
        for ang in angles:
            bond1 = lengths.get(frozenset((ang.atom1_name, ang.atom2_name)))
            bond2 = lengths.get(frozenset((ang.atom2_name, ang.atom3_name)))
            if bond1 is None or bond2 is None:
                raise InputError(
                    path, f"{resname} {ang.atom1_name}-{ang.atom2_name}-{ang.atom3_name}",
                    "angle between atoms whose bonds are not in the Bond section",
                )
            l1, l2, g = bond1.length, bond2.length, ang.angle_rad
            outer = math.sqrt(l1 * l1 + l2 * l2 - 2.0 * l1 * l2 * math.cos(g))
            # First-order propagation of the law of cosines with uncorrelated errors: the
            # partial derivatives times the stddevs added in quadrature, as AF2's
            # residue_constants.load_stereo_chemical_props (a linear sum, the bound for fully
            # correlated errors, would widen every 1-3 window of the violation loss).
            d_outer = math.hypot(
                (l1 - l2 * math.cos(g)) / outer * bond1.stddev,
                (l2 - l1 * math.cos(g)) / outer * bond2.stddev,
                l1 * l2 * math.sin(g) / outer * ang.stddev,
            )
            residue_virtual_bonds.setdefault(resname, []).append(
                Bond(ang.atom1_name, ang.atom3_name, outer, d_outer)
            )
    return residue_bonds, residue_virtual_bonds, residue_bond_angles


# ---------------------------------------------------------------------------------------------
# MSA alphabet (HHblits order) and sequence helpers
# ---------------------------------------------------------------------------------------------

# HHblits' 22-letter alphabet: ambiguity codes collapse onto a member (B -> D, Z -> E), U
# (selenocysteine) onto C, and J/O onto X.
HHBLITS_AA_TO_ID: dict[str, int] = {
    "A": 0, "B": 2, "C": 1, "D": 2, "E": 3, "F": 4, "G": 5, "H": 6, "I": 7, "J": 20, "K": 8,
    "L": 9, "M": 10, "N": 11, "O": 20, "P": 12, "Q": 13, "R": 14, "S": 15, "T": 16, "U": 1,
    "V": 17, "W": 18, "X": 20, "Y": 19, "Z": 3, "-": 21,
}  # fmt: skip
ID_TO_HHBLITS_AA: dict[int, str] = {
    0: "A", 1: "C", 2: "D", 3: "E", 4: "F", 5: "G", 6: "H", 7: "I", 8: "K", 9: "L", 10: "M",
    11: "N", 12: "P", 13: "Q", 14: "R", 15: "S", 16: "T", 17: "V", 18: "W", 19: "Y", 20: "X",
    21: "-",
}  # fmt: skip
# HHblits id -> our MSA code (0-19 restypes, 20 X, 21 gap).
MAP_HHBLITS_AATYPE_TO_OUR_AATYPE: tuple[int, ...] = tuple(
    restypes_with_x_and_gap.index(ID_TO_HHBLITS_AA[i]) for i in range(22)
)


def sequence_to_aatype(sequence: str) -> np.ndarray:
    """One-letter sequence -> aatype [N_res] int32 (0-19, 20 for anything else, e.g. X, U, B)."""
    lut = np.full(128, unk_restype_index, dtype=np.int32)
    for r, i in restype_order.items():
        lut[ord(r)] = i
    codes = np.frombuffer(sequence.upper().encode("ascii", errors="replace"), dtype=np.uint8)
    return lut[np.minimum(codes, 127)]


# ---------------------------------------------------------------------------------------------
# Precomputed per-residue-type arrays (aatype order; row 20 = UNK is all zero)
# ---------------------------------------------------------------------------------------------


def _make_rigid_transformation_4x4(
    ex: np.ndarray, ey: np.ndarray, translation: np.ndarray
) -> np.ndarray:
    """4x4 frame: x axis along ``ex``, y axis in the (ex, ey) plane, origin ``translation``."""
    ex = ex / np.linalg.norm(ex)
    ey = ey - np.dot(ey, ex) * ex  # Gram-Schmidt (supplement Alg. 21)
    ey = ey / np.linalg.norm(ey)
    ez = np.cross(ex, ey)
    m = np.eye(4)
    m[:3, :3] = np.stack([ex, ey, ez], axis=1)  # columns are the frame axes
    m[:3, 3] = translation
    return m


def _build_per_restype_arrays() -> dict[str, np.ndarray]:
    n = restype_num + 1
    a14_to_a37 = np.zeros((n, atom14_num), dtype=np.int32)
    a37_to_a14 = np.zeros((n, atom_type_num), dtype=np.int32)
    a14_mask = np.zeros((n, atom14_num), dtype=np.float32)
    a37_mask = np.zeros((n, atom_type_num), dtype=np.float32)
    a14_group = np.zeros((n, atom14_num), dtype=np.int32)
    a37_group = np.zeros((n, atom_type_num), dtype=np.int32)
    a14_pos = np.zeros((n, atom14_num, 3), dtype=np.float32)
    a37_pos = np.zeros((n, atom_type_num, 3), dtype=np.float32)
    default_frame = np.zeros((n, 8, 4, 4), dtype=np.float32)
    ambiguous = np.zeros((n, atom14_num), dtype=np.float32)
    swap_idx = np.tile(np.arange(atom14_num, dtype=np.int32), (n, 1))
    vdw = np.zeros((n, atom14_num), dtype=np.float32)
    group_exists = np.zeros((n, 8), dtype=np.float32)

    for aa in range(n):
        resname = resnames[aa]
        names14 = restype_name_to_atom14_names[resname]
        for slot, name in enumerate(names14):
            if not name:
                continue
            a14_to_a37[aa, slot] = atom_order[name]
            a37_to_a14[aa, atom_order[name]] = slot
            a14_mask[aa, slot] = 1.0
            a37_mask[aa, atom_order[name]] = 1.0
            vdw[aa, slot] = van_der_waals_radius[name[0]]
        default_frame[aa] = np.eye(4, dtype=np.float32)
        if resname == unk_restype:
            continue
        positions = {}
        for name, group, pos in rigid_group_atom_positions[resname]:
            slot = names14.index(name)
            a14_group[aa, slot] = group
            a37_group[aa, atom_order[name]] = group
            a14_pos[aa, slot] = pos
            a37_pos[aa, atom_order[name]] = pos
            positions[name] = np.asarray(pos, dtype=np.float64)
        for a, b in residue_atom_renaming_swaps.get(resname, {}).items():
            ia, ib = names14.index(a), names14.index(b)
            ambiguous[aa, ia] = ambiguous[aa, ib] = 1.0
            swap_idx[aa, ia], swap_idx[aa, ib] = ib, ia

        # Default frames: each group's frame expressed in its parent's frame (supplement 1.8).
        # Groups 0 (backbone) and 1 (pre-omega) are the identity in the backbone frame.
        group_exists[aa, :4] = 1.0
        # phi: x along CA->N, origin N (its rotation about that axis is the phi torsion).
        default_frame[aa, 2] = _make_rigid_transformation_4x4(
            positions["N"] - positions["CA"], np.array([1.0, 0.0, 0.0]), positions["N"]
        )
        # psi: x along CA->C, y towards the CA->N side, origin C.
        default_frame[aa, 3] = _make_rigid_transformation_4x4(
            positions["C"] - positions["CA"], positions["CA"] - positions["N"], positions["C"]
        )
        chis = chi_angles_atoms[resname]
        if chis:
            # chi1: x along CA->CB, N in the xy plane, origin CB (backbone frame coordinates).
            base = [positions[name] for name in chis[0]]
            default_frame[aa, 4] = _make_rigid_transformation_4x4(
                base[2] - base[1], base[0] - base[1], base[2]
            )
            group_exists[aa, 4] = 1.0
        for k in range(1, len(chis)):
            # chi(k+1) in the chi(k) frame: the axis atom (third atom of this chi) is the
            # previous group's "outer" atom, the previous origin lies at -x of the new frame.
            axis_end = positions[chis[k][2]]
            default_frame[aa, 4 + k] = _make_rigid_transformation_4x4(
                axis_end, np.array([-1.0, 0.0, 0.0]), axis_end
            )
            group_exists[aa, 4 + k] = 1.0

    return {
        "restype_atom14_to_atom37": a14_to_a37,
        "restype_atom37_to_atom14": a37_to_a14,
        "restype_atom14_mask": a14_mask,
        "restype_atom37_mask": a37_mask,
        "restype_atom14_to_rigid_group": a14_group,
        "restype_atom37_to_rigid_group": a37_group,
        "restype_atom14_rigid_group_positions": a14_pos,
        "restype_atom37_rigid_group_positions": a37_pos,
        "restype_rigid_group_default_frame": default_frame,
        "restype_atom14_ambiguous_atoms": ambiguous,
        "restype_atom14_ambiguous_atoms_swap_idx": swap_idx,
        "restype_atom14_vdw_radius": vdw,
        "restype_rigid_group_exists": group_exists,
    }


_ARRAYS = _build_per_restype_arrays()
# [21, 14] int32: atom37 index of each atom14 slot (0 for empty slots; use the mask).
restype_atom14_to_atom37: np.ndarray = _ARRAYS["restype_atom14_to_atom37"]
# [21, 37] int32: atom14 slot of each atom37 type (0 where absent; use the mask).
restype_atom37_to_atom14: np.ndarray = _ARRAYS["restype_atom37_to_atom14"]
# [21, 14] / [21, 37] float32: 1 where the residue type has the atom.
restype_atom14_mask: np.ndarray = _ARRAYS["restype_atom14_mask"]
restype_atom37_mask: np.ndarray = _ARRAYS["restype_atom37_mask"]
# [21, 14] / [21, 37] int32: rigid group (0-7) each atom belongs to.
restype_atom14_to_rigid_group: np.ndarray = _ARRAYS["restype_atom14_to_rigid_group"]
restype_atom37_to_rigid_group: np.ndarray = _ARRAYS["restype_atom37_to_rigid_group"]
# [21, 14, 3] / [21, 37, 3] float32: idealized atom position in its rigid group's frame.
restype_atom14_rigid_group_positions: np.ndarray = _ARRAYS["restype_atom14_rigid_group_positions"]
restype_atom37_rigid_group_positions: np.ndarray = _ARRAYS["restype_atom37_rigid_group_positions"]
# [21, 8, 4, 4] float32: each group's default frame in its parent's frame (groups 1-4 in the
# backbone frame, group 4+k in group 3+k's frame), before the torsion rotation about x.
restype_rigid_group_default_frame: np.ndarray = _ARRAYS["restype_rigid_group_default_frame"]
# [21, 14] float32 / int32: atoms renamed under 180-degree symmetry and their swap partner.
restype_atom14_ambiguous_atoms: np.ndarray = _ARRAYS["restype_atom14_ambiguous_atoms"]
restype_atom14_ambiguous_atoms_swap_idx: np.ndarray = _ARRAYS[
    "restype_atom14_ambiguous_atoms_swap_idx"
]
# [21, 14] float32: van der Waals radius of each atom14 slot (0 for empty slots).
restype_atom14_vdw_radius: np.ndarray = _ARRAYS["restype_atom14_vdw_radius"]
# [21, 8] float32: 1 where the residue type has the rigid group.
restype_rigid_group_exists: np.ndarray = _ARRAYS["restype_rigid_group_exists"]


def make_atom14_dists_bounds(
    overlap_tolerance: float = 1.5, bond_length_tolerance_factor: float = 15.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intra-residue atom-pair distance bounds for the violation loss (supplement 1.9.11).

    Bonded pairs and 1-3 pairs (virtual bonds spanning a bond angle) get
    ``length -+ bond_length_tolerance_factor * stddev``; all other pairs a lower bound of the
    sum of van der Waals radii minus ``overlap_tolerance`` and no upper bound (1e10).
    Returns ``(lower, upper, stddev)``, each [21, 14, 14] float32 (zero on and off the existing
    atoms' diagonal / missing slots).
    """
    n = restype_num + 1
    lower = np.zeros((n, atom14_num, atom14_num), dtype=np.float32)
    upper = np.zeros((n, atom14_num, atom14_num), dtype=np.float32)
    stddev = np.zeros((n, atom14_num, atom14_num), dtype=np.float32)
    residue_bonds, residue_virtual_bonds, _ = load_stereo_chemical_props()
    for aa in range(restype_num):
        resname = resnames[aa]
        names14 = restype_name_to_atom14_names[resname]
        present = [i for i, name in enumerate(names14) if name]
        for i in present:
            for j in present:
                if i == j:
                    continue
                lo = van_der_waals_radius[names14[i][0]] + van_der_waals_radius[names14[j][0]]
                lower[aa, i, j] = lo - overlap_tolerance
                upper[aa, i, j] = 1e10
        for b in residue_bonds.get(resname, []) + residue_virtual_bonds.get(resname, []):
            i, j = names14.index(b.atom1_name), names14.index(b.atom2_name)
            for p, q in ((i, j), (j, i)):
                lower[aa, p, q] = b.length - bond_length_tolerance_factor * b.stddev
                upper[aa, p, q] = b.length + bond_length_tolerance_factor * b.stddev
                stddev[aa, p, q] = b.stddev
    return lower, upper, stddev


# [21, 14, 14] float32: bounds with the defaults of AF2's make_atom14_dists_bounds (overlap
# 1.5 A, 15 sigma); the violation loss builds its own with LossConfig's 12 sigma.
(
    restype_atom14_bond_lower_bound,
    restype_atom14_bond_upper_bound,
    restype_atom14_bond_stddev,
) = make_atom14_dists_bounds()
