"""The AlphaFold3 feature contract between fold-data and fold-model (AF3 supplement Table 5).

Two stages, two schemas, checked with :func:`fold_data.schema.validate`:

* ``RAW_FEATURES``: what :func:`fold_data.af3.make_features` returns for one entry. Deterministic
  (a pure function of the inputs, the CCD and the conformer seed), so it is what the ahead-of-time
  cache stores. Sizes are the entry's own: ``N_token`` tokens, ``N_atom`` heavy atoms, ``N_bond``
  atom bonds, ``N_tbond`` bonded token pairs, ``N_msa`` MSA rows, ``N_templ`` templates.
* ``SAMPLE_FEATURES``: what :func:`fold_data.af3.make_sample` returns for one training step:
  cropped (contiguous or spatial, whole ligands), padded to the preset's ``N_token``, ``N_atom``,
  ``N_msa``, ``N_templ`` (masks mark padding), MSA rows sampled, every reference conformer
  randomly rotated and translated. fold-model's AF3 consumes a batch of these (leading ``B``).

Codes: ``restype`` / ``msa`` 32 classes (0-19 amino acids in AF2 order, 20 unknown amino acid
and every ligand token, 21-24 RNA A G C U, 25 unknown RNA, 26-29 DNA A G C T, 30 unknown DNA,
31 gap); ``ref_element`` atomic number (the model one-hot encodes 128 classes);
``ref_atom_name_chars`` 4 x ``ord(c) - 32`` (64 classes); ``asym_id``, ``entity_id``, ``sym_id``
0-based; ``ref_pos_source`` 0 RDKit ETKDGv3, 1 CCD ideal coordinates, 2 CCD model coordinates,
3 none (``ref_mask`` 0).
"""

from __future__ import annotations

from fold_data.schema import FeatureSpec, feature_specs

__all__ = ["GAP", "RAW_FEATURES", "SAMPLE_FEATURES"]

GAP = 31  # the gap class of restype / msa / template_restype (the tokenizer's; padding too)

_F32, _I32 = "float32", "int32"

_TOKEN = (
    ("residue_index", _I32, ("N_token",), "residue number in its chain, 0-based"),
    ("token_index", _I32, ("N_token",), "token number in the entry (before cropping)"),
    ("asym_id", _I32, ("N_token",), "chain number, 0-based, unique per chain"),
    ("entity_id", _I32, ("N_token",), "entity number, 0-based, shared by identical chains"),
    ("sym_id", _I32, ("N_token",), "copy number of the chain within its entity, 0-based"),
    ("restype", _I32, ("N_token",), "residue type, 32 classes (module docstring)"),
    ("is_protein", _I32, ("N_token",), "1 for tokens of protein chains"),
    ("is_rna", _I32, ("N_token",), "1 for tokens of RNA chains"),
    ("is_dna", _I32, ("N_token",), "1 for tokens of DNA chains"),
    ("is_ligand", _I32, ("N_token",), "1 for tokens of ligand chains (CCD, SMILES, ions)"),
    ("is_atomized", _I32, ("N_token",), "1 for one-atom tokens (ligands, modified residues)"),
    ("token_center_atom", _I32, ("N_token",), "atom index of the centre (CA, C1', the atom)"),
    ("token_pseudo_beta_atom", _I32, ("N_token",),
     "atom index of the representative atom (CB / CA for GLY, C4 purines, C2 pyrimidines)"),
)
_ATOM = (
    ("ref_pos", _F32, ("N_atom", 3), "reference conformer positions, Angstrom"),
    ("ref_mask", _F32, ("N_atom",), "1 where the reference conformer has the atom"),
    ("ref_element", _I32, ("N_atom",), "atomic number"),
    ("ref_charge", _F32, ("N_atom",), "formal charge"),
    ("ref_atom_name_chars", _I32, ("N_atom", 4), "atom name characters, ord(c) - 32"),
    ("ref_space_uid", _I32, ("N_atom",), "one id per reference conformer (residue)"),
    ("ref_pos_source", _I32, ("N_atom",), "0 RDKit, 1 CCD ideal, 2 CCD model, 3 none"),
    ("atom_to_token", _I32, ("N_atom",), "token of each atom"),
    ("atom_positions", _F32, ("N_atom", 3), "ground-truth coordinates (0 where unresolved)"),
    ("atom_resolved", _F32, ("N_atom",), "1 where the structure resolves the atom"),
)
_TEMPLATE = (
    ("template_restype", _I32, ("N_templ", "N_token"), "template residue type, 31 gap"),
    ("template_pseudo_beta", _F32, ("N_templ", "N_token", 3), "CB (CA for glycine)"),
    ("template_pseudo_beta_mask", _F32, ("N_templ", "N_token"), "1 where pseudo-beta exists"),
    ("template_backbone", _F32, ("N_templ", "N_token", 3, 3), "N, CA, C positions"),
    ("template_backbone_mask", _F32, ("N_templ", "N_token"), "1 where N, CA and C exist"),
)

RAW_FEATURES: dict[str, FeatureSpec] = feature_specs(
    *_TOKEN,
    *_ATOM,
    ("atom_bonds", _I32, ("N_bond", 2), "bonded atom pairs (i < j), intra- and inter-residue"),
    ("atom_bond_order", _I32, ("N_bond",), "1-3, 4 aromatic"),
    ("token_bonds", _I32, ("N_tbond", 2), "bonded token pairs (i < j) with a one-atom token"),
    ("msa", _I32, ("N_msa", "N_token"), "per-chain MSAs side by side, row 0 the query, 0-31"),
    ("deletion_matrix", _F32, ("N_msa", "N_token"), "deletions before each aligned residue"),
    ("profile", _F32, ("N_token", 32), "residue type distribution of each chain's MSA column"),
    ("deletion_mean", _F32, ("N_token",), "mean deletion count of the column"),
    *_TEMPLATE,
    ("resolution", _F32, (), "Angstrom, 0 when unknown or not a structure"),
    ("chain_ids", "bytes", ("N_chain",), "chain ID of each asym_id, ASCII"),
)

SAMPLE_FEATURES: dict[str, FeatureSpec] = feature_specs(
    *_TOKEN,
    ("token_mask", _F32, ("N_token",), "1 for real tokens, 0 for padding"),
    *_ATOM,
    ("atom_mask", _F32, ("N_atom",), "1 for real atoms, 0 for padding"),
    ("token_bonds", _F32, ("N_token", "N_token"), "1 where two tokens are bonded (symmetric)"),
    ("msa", _I32, ("N_msa", "N_token"), "sampled MSA rows, row 0 the query, 0-31"),
    ("has_deletion", _F32, ("N_msa", "N_token"), "1 where a deletion precedes"),
    ("deletion_value", _F32, ("N_msa", "N_token"), "2/pi arctan(d/3)"),
    ("msa_mask", _F32, ("N_msa", "N_token"), "1 for real rows and tokens"),
    ("profile", _F32, ("N_token", 32), "as in RAW"),
    ("deletion_mean", _F32, ("N_token",), "as in RAW"),
    *_TEMPLATE,
    ("template_mask", _F32, ("N_templ",), "1 for real templates"),
    ("resolution", _F32, (), "as in RAW"),
)
