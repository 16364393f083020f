"""Per-step stochastic transforms: raw AF2 features -> one fixed-size training/inference sample.

Re-implements the AF2 supplement sections 1.2.5-1.2.7 and 1.11 in numpy with an explicit
``np.random.Generator`` (no torch, no global random state). :func:`make_sample` runs, in order:

1. contiguous crop to ``N_res`` residues (random start in training, no crop at inference);
2. MSA block deletion (supplement Alg. 1), training only, once per sample;
3. template selection (a random number of the hits in training, the top ones at inference) and
   the template pseudo-beta / torsion features;
4. for each of the ``R = N_cycle`` passes independently (the MSA is re-sampled every recycling
   iteration, supplement 1.10): cluster-centre sampling (query first), BERT masking, extra MSA,
   assignment of every non-centre row to its nearest centre, cluster profile and deletion mean,
   ``msa_feat``;
5. padding to the preset's fixed sizes with zero masks, the leading ``R`` dim, schema dtypes.

Conventions. ``R`` is the total number of forward passes, ``N_cycle = max_recycling_iters + 1``
(AF2: 3 recycling iterations + the final pass = 4); the trainer may use fewer (AF2 samples the
number per step). The profile that BERT masking draws from is the column frequency (0-21) of the
sample's MSA after crop and block deletion. Cluster profiles summarize every non-centre row, not
only the ``N_extra`` shown to the extra-MSA stack (AF2 crops the extra MSA after summarizing).
Padding: masks 0, ``msa_feat`` 0, ``aatype`` 20, MSA codes 21 (gap), 4x4 frames the identity.

Random streams: ``np.random.SeedSequence(seed)`` spawns stream 0 for the per-sample draws (crop,
block deletion, templates, clamped FAPE) and stream ``1 + r`` for pass ``r``; a sample is a pure
function of ``(raw, preset, seed, training, crop_start)``.
"""

from __future__ import annotations

import numpy as np

from fold_data.schema import validate

from .presets import DataPreset, get_preset
from .schema import RAW_FEATURES, SAMPLE_FEATURES

__all__ = [
    "FRAME_FEATURES",
    "GAP",
    "MASK_TOKEN",
    "NUM_MSA_CLASSES",
    "PAD_VALUES",
    "assign_extra_to_clusters",
    "crop_features",
    "deletion_value",
    "make_msa_cycle",
    "make_sample",
    "make_target_feat",
    "make_template_sample",
    "masked_msa",
    "msa_block_deletion",
    "msa_profile",
    "sample_cluster_centres",
    "summarize_clusters",
]

UNKNOWN = 20  # aatype X
GAP = 21  # MSA gap
MASK_TOKEN = 22  # BERT mask token in msa_feat
NUM_MSA_CLASSES = 23  # 20 amino acids, X, gap, mask
_NUM_RES_CLASSES = 21  # classes that count as agreement in the cluster assignment (not gap/mask)
_ASSIGN_CHUNK = 2048  # extra rows per matrix product in the cluster assignment (bounds memory)


# --------------------------------------------------------------------------------------------
# Cropping and MSA block deletion
# --------------------------------------------------------------------------------------------


def crop_features(raw: dict[str, np.ndarray], start: int, size: int) -> dict[str, np.ndarray]:
    """Slice every raw feature along its ``N_res`` axis (as declared in :data:`RAW_FEATURES`)."""
    out = {}
    for name, spec in RAW_FEATURES.items():
        arr = raw[name]
        if "N_res" in spec.shape:
            axis = spec.shape.index("N_res")
            index = [slice(None)] * arr.ndim
            index[axis] = slice(start, start + size)
            arr = arr[tuple(index)]
        out[name] = arr
    return out


def msa_block_deletion(
    n_msa: int, rng: np.random.Generator, *, fraction_per_block: float, num_blocks: int
) -> np.ndarray:
    """Rows kept after MSA block deletion (supplement Alg. 1): ``[N_kept]`` int64, ascending.

    Deletes ``num_blocks`` contiguous blocks of ``floor(N_msa * fraction_per_block)`` rows each,
    starting at uniformly random rows (blocks may overlap and are clipped at the MSA end). The
    query (row 0) is never deleted: blocks start in ``[1, N_msa)``.
    """
    block_size = int(np.floor(n_msa * fraction_per_block))
    keep = np.ones(n_msa, dtype=bool)
    if block_size == 0 or n_msa < 2 or num_blocks == 0:
        return np.arange(n_msa)
    starts = rng.integers(1, n_msa, size=num_blocks)
    for start in starts:
        keep[start : start + block_size] = False
    return np.flatnonzero(keep)


# --------------------------------------------------------------------------------------------
# MSA sampling, masking, clustering (supplement 1.2.6-1.2.7)
# --------------------------------------------------------------------------------------------


def msa_profile(msa: np.ndarray) -> np.ndarray:
    """Per-column class frequencies of ``msa`` ``[N_msa, N_res]`` over 0-21 -> ``[N_res, 22]``."""
    n_msa, n_res = msa.shape
    flat = (np.arange(n_res)[None, :] * 22 + msa).ravel()
    counts = np.bincount(flat, minlength=n_res * 22).reshape(n_res, 22)
    return counts.astype(np.float64) / max(n_msa, 1)


def sample_cluster_centres(
    n_msa: int, n_clust: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split the MSA rows into cluster centres and the rest.

    Returns ``(centres [min(N_msa, N_clust)], rest [N_msa - len(centres)])``: the query (row 0)
    is always the first centre; the other rows are shuffled, the first ``n_clust - 1`` become
    centres and the remaining ones keep their shuffled order (so any prefix of ``rest`` is a
    uniform random subset, which is how the extra MSA is drawn).
    """
    order = np.concatenate([[0], 1 + rng.permutation(n_msa - 1)]).astype(np.int64)
    return order[:n_clust], order[n_clust:]


def masked_msa(
    msa: np.ndarray,
    profile: np.ndarray,
    rng: np.random.Generator,
    *,
    replace_fraction: float,
    uniform_prob: float,
    profile_prob: float,
    same_prob: float,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT-style masking of the cluster centres (supplement 1.2.7).

    ``msa`` ``[N_clust, N_res]`` (0-21), ``profile`` ``[N_res, 22]`` (:func:`msa_profile`).
    Each position is selected with probability ``replace_fraction``; a selected position becomes
    a uniformly random amino acid (0-19) with probability ``uniform_prob``, a draw from the
    column's profile with ``profile_prob``, stays unchanged with ``same_prob`` and becomes the mask
    token 22 otherwise. Returns ``(bert_msa [N_clust, N_res] 0-22, bert_mask [N_clust, N_res])``.
    """
    selected = rng.random(msa.shape) < replace_fraction
    rows, cols = np.nonzero(selected)
    n = rows.size
    kind = rng.random(n)
    uniform_aa = rng.integers(0, 20, size=n)
    # Inverse-CDF draw from each selected column's profile.
    cdf = np.cumsum(profile, axis=1)[cols]  # [n, 22]
    u = rng.random(n) * cdf[:, -1]
    from_profile = np.minimum((u[:, None] >= cdf).sum(axis=1), GAP)
    t_uniform = uniform_prob
    t_profile = t_uniform + profile_prob
    t_same = t_profile + same_prob
    unchanged_or_mask = np.where(kind < t_same, msa[rows, cols], MASK_TOKEN)
    new = np.where(
        kind < t_uniform, uniform_aa, np.where(kind < t_profile, from_profile, unchanged_or_mask)
    )
    bert_msa = msa.copy()
    bert_msa[rows, cols] = new
    return bert_msa, selected.astype(np.float32)


def _scatter_ones(onehot: np.ndarray, columns: np.ndarray) -> None:
    """``onehot[i, columns[i, j]] = 1`` for a C-contiguous ``onehot`` ``[n, K]``."""
    flat = np.arange(columns.shape[0])[:, None] * onehot.shape[1] + columns  # [n, N_res]
    onehot.reshape(-1)[flat.ravel()] = 1.0


def assign_extra_to_clusters(centres: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Nearest cluster centre of every extra row (supplement 1.2.6): ``[N_extra]`` int64.

    ``centres`` ``[N_clust, N_res]`` (0-22, after BERT masking), ``extra`` ``[N_extra, N_res]``.
    The similarity of an extra row and a centre is the number of positions where both hold the
    same residue (0-20): gaps and mask tokens never count as agreement (a Hamming distance that
    ignores gaps and masked positions). Ties go to the lowest centre index, i.e. the query first.

    Computed as one-hot matrix products ``[N_extra, K] @ [K, N_clust]``, where ``K`` holds only
    the (residue, class) pairs that occur in some centre: the other one-hot columns are zero on
    the centre side, so dropping them is exact (on real MSAs ``K`` is about ``15 N_res`` instead
    of ``21 N_res``). Extra rows go through in chunks to bound the one-hot memory.
    """
    n_clust, n_res = centres.shape
    n_extra = extra.shape[0]
    # Key of a (residue, class) pair; gaps and mask tokens all get the key ``none``.
    none = n_res * _NUM_RES_CLASSES
    pos = np.arange(n_res)[None, :]
    centre_key = np.where(centres < _NUM_RES_CLASSES, pos * _NUM_RES_CLASSES + centres, none)
    extra_key = np.where(extra < _NUM_RES_CLASSES, pos * _NUM_RES_CLASSES + extra, none)
    present = np.zeros(none + 1, dtype=bool)
    present[centre_key] = True
    present[none] = False
    k = int(present.sum())  # K one-hot columns; column K collects the pairs no centre has
    column = np.full(none + 1, k, dtype=np.int64)
    column[present] = np.arange(k)
    centre_onehot = np.zeros((n_clust, k + 1), dtype=np.float32)  # [N_clust, K + 1]
    _scatter_ones(centre_onehot, column[centre_key])
    centre_onehot[:, k] = 0.0
    extra_col = column[extra_key]  # [N_extra, N_res]
    assignment = np.empty(n_extra, dtype=np.int64)
    for begin in range(0, n_extra, _ASSIGN_CHUNK):
        cols = extra_col[begin : begin + _ASSIGN_CHUNK]
        extra_onehot = np.zeros((cols.shape[0], k + 1), dtype=np.float32)  # [chunk, K + 1]
        _scatter_ones(extra_onehot, cols)
        agreement = extra_onehot @ centre_onehot.T  # [chunk, N_clust], exact integer counts
        assignment[begin : begin + cols.shape[0]] = np.argmax(agreement, axis=1)
    return assignment


def summarize_clusters(
    centres: np.ndarray,
    centre_deletions: np.ndarray,
    extra: np.ndarray,
    extra_deletions: np.ndarray,
    assignment: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster profile and deletion mean (supplement 1.2.6, Table 1).

    Each cluster holds its centre (``[N_clust, N_res]``, 0-22 after masking) and the extra rows
    assigned to it (``[N_all_extra, N_res]``). Returns ``(cluster_profile [N_clust, N_res, 23],
    cluster_deletion_mean [N_clust, N_res])``: the class frequencies and the mean deletion count
    over the cluster's members. Every real position has at least its centre, so profile rows
    sum to 1.
    """
    n_clust, n_res = centres.shape
    pos = np.arange(n_res)[None, :]
    # Scatter-add one-hot counts with bincount over flat (cluster, residue, class) indices.
    members = np.concatenate([np.arange(n_clust), assignment])  # cluster of each member row
    classes = np.concatenate([centres, extra], axis=0)  # [N_members, N_res]
    cell = members[:, None] * n_res + pos  # [N_members, N_res] flat (cluster, residue)
    counts = np.bincount(
        (cell * NUM_MSA_CLASSES + classes).ravel(), minlength=n_clust * n_res * NUM_MSA_CLASSES
    ).reshape(n_clust, n_res, NUM_MSA_CLASSES)
    size = np.bincount(members, minlength=n_clust).astype(np.float64)  # [N_clust] >= 1
    deletions = np.concatenate([centre_deletions, extra_deletions], axis=0)
    del_sum = np.bincount(
        cell.ravel(), weights=deletions.ravel().astype(np.float64), minlength=n_clust * n_res
    ).reshape(n_clust, n_res)
    return counts / size[:, None, None], del_sum / size[:, None]


def deletion_value(deletions: np.ndarray) -> np.ndarray:
    """Deletion count squashed to [0, 1): ``2/pi * arctan(d / 3)`` (supplement Table 1)."""
    return (2.0 / np.pi) * np.arctan(np.asarray(deletions, dtype=np.float64) / 3.0)


def make_msa_cycle(
    msa: np.ndarray,
    deletion_matrix: np.ndarray,
    profile: np.ndarray,
    preset: DataPreset,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The MSA features of one forward pass, unpadded.

    ``msa`` / ``deletion_matrix`` ``[N_msa, N_res]`` (query first), ``profile`` ``[N_res, 22]``.
    Returns ``msa_feat [N_c, N_res, 49]``, ``true_msa`` / ``bert_mask`` ``[N_c, N_res]``,
    ``extra_msa`` / ``extra_deletion_matrix`` ``[N_e, N_res]`` with ``N_c = min(N_msa,
    n_clust)`` and ``N_e = min(N_msa - N_c, n_extra)``, and ``extra_cluster_assignment`` of all
    ``N_msa - N_c`` non-centre rows (those all feed the cluster profiles; the extra MSA stack
    gets a random subset of them, as AF2 crops the extra MSA after summarizing the clusters).
    """
    centre_idx, rest_idx = sample_cluster_centres(msa.shape[0], preset.n_clust, rng)
    true_msa = msa[centre_idx]
    centre_del = deletion_matrix[centre_idx]
    bert_msa, bert_mask = masked_msa(
        true_msa,
        profile,
        rng,
        replace_fraction=preset.masked_msa_replace_fraction,
        uniform_prob=preset.masked_msa_uniform_prob,
        profile_prob=preset.masked_msa_profile_prob,
        same_prob=preset.masked_msa_same_prob,
    )
    rest = msa[rest_idx]
    rest_del = deletion_matrix[rest_idx]
    assignment = assign_extra_to_clusters(bert_msa, rest)
    profile_c, del_mean = summarize_clusters(bert_msa, centre_del, rest, rest_del, assignment)

    n_c, n_res = bert_msa.shape
    msa_feat = np.zeros((n_c, n_res, 49), dtype=np.float32)  # Table 1 channel layout
    msa_feat[..., :NUM_MSA_CLASSES] = np.eye(NUM_MSA_CLASSES, dtype=np.float32)[bert_msa]
    msa_feat[..., 23] = np.clip(centre_del, 0.0, 1.0)  # has_deletion
    msa_feat[..., 24] = deletion_value(centre_del)
    msa_feat[..., 25:48] = profile_c
    msa_feat[..., 48] = deletion_value(del_mean)
    n_e = min(rest_idx.size, preset.n_extra)  # ``rest`` is shuffled: its prefix is random
    return {
        "msa_feat": msa_feat,
        "true_msa": true_msa,
        "bert_mask": bert_mask,
        "extra_msa": rest[:n_e],
        "extra_deletion_matrix": rest_del[:n_e],
        "extra_cluster_assignment": assignment,
        "centre_index": centre_idx,
        "rest_index": rest_idx,
    }


# --------------------------------------------------------------------------------------------
# Target and template features
# --------------------------------------------------------------------------------------------


def make_target_feat(aatype: np.ndarray) -> np.ndarray:
    """``target_feat`` ``[N_res, 22]``: between-segment bit (0 for one chain), one-hot aatype."""
    feat = np.zeros((aatype.shape[0], 22), dtype=np.float32)
    feat[np.arange(aatype.shape[0]), 1 + aatype] = 1.0
    return feat


def make_template_sample(
    raw: dict[str, np.ndarray], selected: np.ndarray, start: int, size: int
) -> dict[str, np.ndarray]:
    """Template features of the selected hits over residues ``[start, start + size)``, unpadded.

    Torsion angles (omega and phi need the previous residue) and pseudo-beta come from
    :mod:`fold_data.af2.ground_truth`, computed on the window widened by one residue on the left
    so the first cropped residue keeps its backbone torsions when it has a predecessor.
    """
    if selected.size:  # imported lazily: zero-template samples need no geometry code
        from .ground_truth import atom37_to_torsion_angles, make_pseudo_beta

    left = max(start - 1, 0)
    window = slice(left, start + size)
    offset = start - left
    out: dict[str, list[np.ndarray]] = {
        k: []
        for k in (
            "template_aatype",
            "template_all_atom_positions",
            "template_all_atom_mask",
            "template_pseudo_beta",
            "template_pseudo_beta_mask",
            "template_torsion_angles_sin_cos",
            "template_alt_torsion_angles_sin_cos",
            "template_torsion_angles_mask",
        )
    }
    for t in selected:
        aatype = raw["template_aatype"][t, window]
        positions = raw["template_all_atom_positions"][t, window].astype(np.float32)
        mask = raw["template_all_atom_mask"][t, window].astype(np.float32)
        residue = np.minimum(aatype, UNKNOWN)  # gaps have no atoms; treat them as X for geometry
        sin_cos, alt_sin_cos, torsion_mask = atom37_to_torsion_angles(residue, positions, mask)
        pseudo_beta, pseudo_beta_mask = make_pseudo_beta(residue, positions, mask)
        keep = slice(offset, offset + size)
        out["template_aatype"].append(aatype[keep])
        out["template_all_atom_positions"].append(positions[keep])
        out["template_all_atom_mask"].append(mask[keep])
        out["template_pseudo_beta"].append(np.asarray(pseudo_beta)[keep])
        out["template_pseudo_beta_mask"].append(np.asarray(pseudo_beta_mask)[keep])
        out["template_torsion_angles_sin_cos"].append(np.asarray(sin_cos)[keep])
        out["template_alt_torsion_angles_sin_cos"].append(np.asarray(alt_sin_cos)[keep])
        out["template_torsion_angles_mask"].append(np.asarray(torsion_mask)[keep])
    shapes = {
        "template_aatype": (size,),
        "template_all_atom_positions": (size, 37, 3),
        "template_all_atom_mask": (size, 37),
        "template_pseudo_beta": (size, 3),
        "template_pseudo_beta_mask": (size,),
        "template_torsion_angles_sin_cos": (size, 7, 2),
        "template_alt_torsion_angles_sin_cos": (size, 7, 2),
        "template_torsion_angles_mask": (size, 7),
    }
    return {
        k: (np.stack(v) if v else np.zeros((0, *shapes[k]), dtype=np.float32))
        for k, v in out.items()
    }


# --------------------------------------------------------------------------------------------
# The sample
# --------------------------------------------------------------------------------------------

# Fill value of padded entries (everything else pads with 0); all masks pad with 0. Public so
# that code padding batches further (fold-train's shape buckets) pads exactly as make_sample.
PAD_VALUES = _PAD_VALUE = {
    "aatype": UNKNOWN,
    "true_msa": GAP,
    "extra_msa": GAP,
    "template_aatype": GAP,
}
# 4x4 frames pad with the identity so padded frames stay valid rigid transforms.
FRAME_FEATURES = _FRAMES = (
    "rigidgroups_gt_frames", "rigidgroups_alt_gt_frames", "backbone_rigid_tensor")


def _padded(arr: np.ndarray, shape: tuple[int, ...], fill: float) -> np.ndarray:
    out = np.full(shape, fill, dtype=arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def _check_raw(raw: dict[str, np.ndarray]) -> dict[str, int]:
    sizes = validate(raw, RAW_FEATURES, where="raw AF2 features")
    if int(raw["seq_length"]) != sizes["N_res"]:
        raise ValueError(
            f"raw AF2 features: seq_length {int(raw['seq_length'])} != N_res {sizes['N_res']}"
        )
    if sizes["N_msa"] < 1:
        raise ValueError("raw AF2 features: the MSA needs at least the query row")
    for name, hi in (("aatype", UNKNOWN), ("msa", GAP), ("template_aatype", GAP)):
        a = raw[name]
        if a.size and (a.min() < 0 or a.max() > hi):
            raise ValueError(f"raw AF2 features: {name} values must be in [0, {hi}]")
    return sizes


def _crop_window(
    n_full: int,
    crop_size: int,
    rng: np.random.Generator,
    *,
    training: bool,
    crop_start: int | None,
) -> tuple[int, int]:
    """``(start, size)`` of the contiguous residue window a sample keeps (AF2 monomer crop)."""
    max_start = max(n_full - crop_size, 0)
    if crop_start is not None:
        if not 0 <= crop_start <= max_start:
            raise ValueError(
                f"crop_start {crop_start} out of range [0, {max_start}] for a chain of "
                f"{n_full} residues and crop size {crop_size}"
            )
        return crop_start, min(n_full, crop_size)
    if training:  # uniformly random start
        return int(rng.integers(0, max_start + 1)), min(n_full, crop_size)
    return 0, n_full  # inference: the whole chain


def _select_templates(
    n_hits: int, preset: DataPreset, rng: np.random.Generator, *, training: bool
) -> np.ndarray:
    """Indices of the raw templates a sample uses, in rank order.

    Training draws how many (uniformly in ``[0, min(hits, N_templ)]``) and which hits; inference
    takes the top ``min(hits, N_templ)``.
    """
    n_avail = min(n_hits, preset.n_templ)
    if training and preset.subsample_templates:
        n_use = int(rng.integers(0, n_avail + 1))
        return np.sort(rng.permutation(n_hits)[:n_use])
    return np.arange(n_avail)


def make_sample(
    raw: dict[str, np.ndarray],
    preset: DataPreset | str,
    *,
    seed: int,
    training: bool = True,
    crop_start: int | None = None,
) -> dict[str, np.ndarray]:
    """Turn raw features (:data:`RAW_FEATURES`) into one sample (:data:`SAMPLE_FEATURES`).

    Sizes of the result: ``R = preset.n_cycle`` (recycling iterations + the final pass; every
    pass has its own MSA sampling and masking, the other features are copies), ``N_clust``,
    ``N_extra``, ``N_templ`` from the preset, and ``N_res = preset.n_res`` -- except at inference
    on a chain longer than the crop, which is not cropped and gives ``N_res = seq_length``.

    Training crops a random contiguous window (or the one starting at ``crop_start``), applies MSA
    block deletion, samples the number of templates and draws ``use_clamped_fape``; inference
    keeps the whole chain (or the window at ``crop_start``), the top templates and clamped FAPE.
    BERT masking applies in both modes, as in AF2. Deterministic given ``seed``.
    """
    preset = get_preset(preset)
    sizes = _check_raw(raw)
    n_full, n_hits = sizes["N_res"], sizes["N_templ"]
    sample_ss, *cycle_ss = np.random.SeedSequence(seed).spawn(1 + preset.n_cycle)
    rng = np.random.default_rng(sample_ss)

    # 1. Contiguous crop (supplement 1.2.5 / 1.11).
    start, size = _crop_window(n_full, preset.n_res, rng, training=training, crop_start=crop_start)
    n_res = max(preset.n_res, size)  # padded residue count
    feats = crop_features(raw, start, size)

    # 2. MSA block deletion (Alg. 1), training only.
    msa, deletions = feats["msa"], feats["deletion_matrix"].astype(np.float32)
    if training and preset.msa_block_deletion:
        keep = msa_block_deletion(
            msa.shape[0],
            rng,
            fraction_per_block=preset.msa_fraction_per_block,
            num_blocks=preset.msa_num_blocks,
        )
        msa, deletions = msa[keep], deletions[keep]
    profile = msa_profile(msa)

    # 3. Templates.
    selected = _select_templates(n_hits, preset, rng, training=training)
    templ = make_template_sample(raw, selected, start, size)

    use_clamped_fape = float(rng.random() < preset.clamped_fape_prob) if training else 1.0

    # 4. Per-pass MSA features.
    r_total = preset.n_cycle
    n_clust, n_extra = preset.n_clust, preset.n_extra
    out: dict[str, np.ndarray] = {
        "msa_feat": np.zeros((r_total, n_clust, n_res, 49), np.float32),
        "msa_mask": np.zeros((r_total, n_clust, n_res), np.float32),
        "true_msa": np.full((r_total, n_clust, n_res), GAP, np.int32),
        "bert_mask": np.zeros((r_total, n_clust, n_res), np.float32),
        "extra_msa": np.full((r_total, n_extra, n_res), GAP, np.int32),
        "extra_has_deletion": np.zeros((r_total, n_extra, n_res), np.float32),
        "extra_deletion_value": np.zeros((r_total, n_extra, n_res), np.float32),
        "extra_msa_mask": np.zeros((r_total, n_extra, n_res), np.float32),
    }
    for r, ss in enumerate(cycle_ss):
        cyc = make_msa_cycle(msa, deletions, profile, preset, np.random.default_rng(ss))
        n_c, n_e = cyc["true_msa"].shape[0], cyc["extra_msa"].shape[0]
        out["msa_feat"][r, :n_c, :size] = cyc["msa_feat"]
        out["msa_mask"][r, :n_c, :size] = 1.0
        out["true_msa"][r, :n_c, :size] = cyc["true_msa"]
        out["bert_mask"][r, :n_c, :size] = cyc["bert_mask"]
        out["extra_msa"][r, :n_e, :size] = cyc["extra_msa"]
        out["extra_has_deletion"][r, :n_e, :size] = np.clip(cyc["extra_deletion_matrix"], 0, 1)
        out["extra_deletion_value"][r, :n_e, :size] = deletion_value(cyc["extra_deletion_matrix"])
        out["extra_msa_mask"][r, :n_e, :size] = 1.0

    # 5. Non-stochastic features: pad once, copy along R.
    static: dict[str, np.ndarray] = {
        "aatype": feats["aatype"],
        "residue_index": feats["residue_index"],
        "seq_mask": np.ones(size, np.float32),
        "target_feat": make_target_feat(feats["aatype"]),
        "template_mask": np.ones(selected.size, np.float32),
        "use_clamped_fape": np.asarray(use_clamped_fape, np.float32),
        **templ,
    }
    for name, spec in SAMPLE_FEATURES.items():
        if name in out:
            continue
        arr = static[name] if name in static else feats[name]
        dims = {"N_res": n_res, "N_templ": preset.n_templ}
        shape = tuple(dims.get(d, d) for d in spec.shape[1:])
        arr = _padded(np.asarray(arr, dtype=spec.dtype), shape, _PAD_VALUE.get(name, 0))
        if name in _FRAMES:
            arr[size:] = np.eye(4, dtype=np.float32)
        out[name] = np.repeat(arr[None], r_total, axis=0)

    validate(
        out,
        SAMPLE_FEATURES,
        where=f"AF2 sample (preset {preset.name!r}, seed {seed})",
        sizes={
            "R": r_total,
            "N_res": n_res,
            "N_clust": n_clust,
            "N_extra": n_extra,
            "N_templ": preset.n_templ,
        },
        allow_extra=False,
    )
    return out
