"""The AlphaFold2 feature contract between fold-data and fold-model.

Two stages, two schemas:

* ``RAW_FEATURES``: what :func:`fold_data.af2.make_features` returns for one chain. Deterministic
  (a pure function of the input files), so it is what the ahead-of-time cache stores. Sizes are the
  chain's own (``N_res`` residues, ``N_msa`` alignment rows, ``N_templ`` template hits).
* ``SAMPLE_FEATURES``: what the per-step transform (:func:`fold_data.af2.make_sample`) returns for
  one training/inference sample. Every array has a leading recycling dimension ``R`` (the recycling
  copies of the AF2 supplement 1.10: the MSA is re-sampled for every recycling iteration) and is
  padded to the preset's fixed sizes (``N_res`` = crop size, ``N_clust``, ``N_extra``, ``N_templ``),
  so samples batch by stacking and shapes stay static (CUDA Graphs). Padding is marked by masks.
  fold-model consumes a batch of these: the same shapes with a leading batch dimension ``B``.

Dimension names follow the AF2 supplement. Integers in shapes are literal sizes. Names follow
OpenFold where the supplement does not name the array.

Residue type codes (``aatype``): 0-19 the 20 amino acids in ``residue_constants.restypes`` order,
20 unknown (X). MSA codes (``msa``, ``true_msa``, ``extra_msa``): 0-20 as aatype, 21 gap, and in
``msa_feat`` after BERT masking 22 the mask token.
"""

from __future__ import annotations

from fold_data.schema import FeatureSpec, feature_specs

__all__ = ["RAW_FEATURES", "SAMPLE_FEATURES"]

_F32, _I32 = "float32", "int32"

# Ground truth shared by both stages (per residue; the losses need them).
_GROUND_TRUTH = (
    ("all_atom_positions", _F32, ("N_res", 37, 3), "atom37 coordinates in Angstrom"),
    ("all_atom_mask", _F32, ("N_res", 37), "1 where the atom is resolved in the structure"),
    ("atom14_gt_positions", _F32, ("N_res", 14, 3), "atom14 coordinates (supplement 1.2.1)"),
    ("atom14_gt_exists", _F32, ("N_res", 14), "1 where the atom14 atom is resolved"),
    ("atom14_atom_exists", _F32, ("N_res", 14), "1 where the residue type has this atom14 slot"),
    (
        "atom14_alt_gt_positions",
        _F32,
        ("N_res", 14, 3),
        "atom14 with ambiguous atoms renamed (1.9.3)",
    ),
    ("atom14_alt_gt_exists", _F32, ("N_res", 14), "mask of the renamed atom14"),
    ("atom14_atom_is_ambiguous", _F32, ("N_res", 14), "1 for atoms swapped by renaming"),
    ("residx_atom14_to_atom37", _I32, ("N_res", 14), "atom37 index of each atom14 slot"),
    ("residx_atom37_to_atom14", _I32, ("N_res", 37), "atom14 index of each atom37 slot"),
    ("atom37_atom_exists", _F32, ("N_res", 37), "1 where the residue type has this atom37 slot"),
    ("rigidgroups_gt_frames", _F32, ("N_res", 8, 4, 4), "8 rigid-group frames as 4x4 (1.8)"),
    (
        "rigidgroups_gt_exists",
        _F32,
        ("N_res", 8),
        "1 where the frame's defining atoms are resolved",
    ),
    ("rigidgroups_group_exists", _F32, ("N_res", 8), "1 where the residue type has the group"),
    ("rigidgroups_group_is_ambiguous", _F32, ("N_res", 8), "1 for groups with pi-symmetric chis"),
    ("rigidgroups_alt_gt_frames", _F32, ("N_res", 8, 4, 4), "frames after ambiguous renaming"),
    ("backbone_rigid_tensor", _F32, ("N_res", 4, 4), "backbone frame from N, CA, C (Alg. 21)"),
    ("backbone_rigid_mask", _F32, ("N_res",), "1 where N, CA and C are resolved"),
    ("chi_angles_sin_cos", _F32, ("N_res", 4, 2), "sin, cos of the 4 side-chain torsions"),
    ("chi_mask", _F32, ("N_res", 4), "1 where the chi angle exists and is resolved"),
    ("pseudo_beta", _F32, ("N_res", 3), "CB (CA for glycine) position"),
    ("pseudo_beta_mask", _F32, ("N_res",), "1 where pseudo_beta is resolved"),
    ("resolution", _F32, (), "resolution in Angstrom (0 when the method reports none)"),
)

_TEMPLATE_RAW = (
    (
        "template_aatype",
        _I32,
        ("N_templ", "N_res"),
        "template residue per query residue, 0-20, 21 gap",
    ),
    (
        "template_all_atom_positions",
        _F32,
        ("N_templ", "N_res", 37, 3),
        "template atom37, query-aligned",
    ),
    ("template_all_atom_mask", _F32, ("N_templ", "N_res", 37), "template atom37 mask"),
    ("template_sum_probs", _F32, ("N_templ",), "hit score used to rank templates"),
    ("template_domain_names", "bytes", ("N_templ",), "'pdbid_chain' of each hit, ASCII"),
)

RAW_FEATURES: dict[str, FeatureSpec] = feature_specs(
    ("aatype", _I32, ("N_res",), "residue type 0-20 of the chain's full sequence"),
    ("residue_index", _I32, ("N_res",), "0-based position in the entity sequence"),
    ("seq_length", _I32, (), "N_res"),
    ("sequence", "bytes", (), "one-letter sequence, ASCII"),
    ("msa", _I32, ("N_msa", "N_res"), "aligned sequences, 0-21 (21 gap); row 0 is the query"),
    ("deletion_matrix", _F32, ("N_msa", "N_res"), "deletions before each aligned residue"),
    ("msa_species", "bytes", ("N_msa",), "species identifier of each row, empty when unknown"),
    *_TEMPLATE_RAW,
    *_GROUND_TRUTH,
)

SAMPLE_FEATURES: dict[str, FeatureSpec] = feature_specs(
    ("aatype", _I32, ("R", "N_res"), "residue type 0-20; padding 20 with seq_mask 0"),
    ("residue_index", _I32, ("R", "N_res"), "position in the uncropped chain"),
    ("seq_mask", _F32, ("R", "N_res"), "1 for real residues, 0 for padding"),
    (
        "target_feat",
        _F32,
        ("R", "N_res", 22),
        "one-hot aatype with a between-segment bit (Table 1)",
    ),
    (
        "msa_feat",
        _F32,
        ("R", "N_clust", "N_res", 49),
        "cluster centres: 23 one-hot, has_deletion,"
        " deletion_value, 23 cluster profile, deletion mean (Table 1)",
    ),
    ("msa_mask", _F32, ("R", "N_clust", "N_res"), "1 for real cluster rows and residues"),
    ("true_msa", _I32, ("R", "N_clust", "N_res"), "cluster centres before BERT masking"),
    ("bert_mask", _F32, ("R", "N_clust", "N_res"), "1 where the masked-MSA loss applies"),
    ("extra_msa", _I32, ("R", "N_extra", "N_res"), "extra (non-centre) sequences, 0-22"),
    ("extra_has_deletion", _F32, ("R", "N_extra", "N_res"), "1 where a deletion precedes"),
    ("extra_deletion_value", _F32, ("R", "N_extra", "N_res"), "2/pi arctan(d/3)"),
    ("extra_msa_mask", _F32, ("R", "N_extra", "N_res"), "1 for real extra rows and residues"),
    ("template_mask", _F32, ("R", "N_templ"), "1 for real templates"),
    ("template_aatype", _I32, ("R", "N_templ", "N_res"), "0-21"),
    ("template_all_atom_positions", _F32, ("R", "N_templ", "N_res", 37, 3), "template atom37"),
    ("template_all_atom_mask", _F32, ("R", "N_templ", "N_res", 37), "template atom37 mask"),
    ("template_pseudo_beta", _F32, ("R", "N_templ", "N_res", 3), "template CB (CA for Gly)"),
    ("template_pseudo_beta_mask", _F32, ("R", "N_templ", "N_res"), "mask of template_pseudo_beta"),
    (
        "template_torsion_angles_sin_cos",
        _F32,
        ("R", "N_templ", "N_res", 7, 2),
        "omega, phi, psi, chi1-4 (1.4)",
    ),
    (
        "template_alt_torsion_angles_sin_cos",
        _F32,
        ("R", "N_templ", "N_res", 7, 2),
        "with pi-periodic chis shifted by pi",
    ),
    (
        "template_torsion_angles_mask",
        _F32,
        ("R", "N_templ", "N_res", 7),
        "torsion exists and resolved",
    ),
    ("use_clamped_fape", _F32, ("R",), "1 for the 90% of samples that use clamped FAPE (1.11.5)"),
    *[(n, d, ("R", *s), doc) for n, d, s, doc in _GROUND_TRUTH],
)
