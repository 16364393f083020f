"""Per-step AF3 transforms: one training/inference sample from cached raw features.

:func:`make_sample` (all randomness from ``seed``):

1. crop (:mod:`.crop`): contiguous / spatial / spatial interface with the preset's
   probabilities, within the token and atom budgets, ligands whole; no crop when the entry fits;
2. MSA rows: the query plus a random subset of the other rows (``n_msa`` in all), then
   ``has_deletion`` and ``deletion_value`` = 2/pi arctan(d/3) (AF3 Table 5);
3. templates: a random subset of at most ``n_templ``, in their original order;
4. reference conformers: each ``ref_space_uid`` group randomly rotated (uniform on SO(3)) and
   translated (AF3 2.8, ``ref_pos``), so the model cannot learn from the conformer's frame;
5. padding to the preset's sizes (``af3_predict``: the entry's own), with ``token_mask``,
   ``atom_mask``, ``msa_mask``, ``template_mask``; ``token_bonds`` as a dense symmetric matrix.

Padding values: tokens and MSA ``restype`` 31 (gap), indices 0, everything else 0.
"""

from __future__ import annotations

import numpy as np

from fold_data.schema import validate

from .crop import contiguous_crop, crop_features, spatial_crop
from .presets import AF3DataPreset, get_preset
from .schema import GAP, RAW_FEATURES, SAMPLE_FEATURES

__all__ = ["PAD_VALUES", "make_sample", "random_rotation", "crop_indices"]

# Fill value of padded entries of a sample (everything else, masks included, pads with 0).
# Public so that code padding batches further (fold-train's shape buckets) pads the same way.
PAD_VALUES = {"restype": GAP, "msa": GAP, "template_restype": GAP}


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random rotation matrix [3, 3] (normalized Gaussian quaternion)."""
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def crop_indices(raw: dict[str, np.ndarray], preset: AF3DataPreset,
                 rng: np.random.Generator, focus: tuple[int, ...] | None = None
                 ) -> np.ndarray | None:
    """Token indices of the crop, or None when the entry fits the budgets. ``focus``: the
    chain or interface (``asym_id`` values) the sample was drawn for; spatial crops start from
    it (:func:`fold_data.af3.crop.spatial_crop`)."""
    n_token = len(raw["asym_id"])
    n_atom = len(raw["atom_to_token"])
    if preset.n_token is None or (n_token <= preset.n_token and
                                  (preset.n_atom is None or n_atom <= preset.n_atom)):
        return None
    u = rng.random()
    if u < preset.p_contiguous:
        return contiguous_crop(raw, preset.n_token, rng, preset.n_atom)
    interface = u >= preset.p_contiguous + preset.p_spatial
    return spatial_crop(raw, preset.n_token, rng, preset.n_atom, interface=interface,
                        focus=focus)


def _pad(a: np.ndarray, shape: tuple[int, ...], fill: float = 0) -> np.ndarray:
    out = np.full(shape, fill, dtype=a.dtype)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out


def make_sample(
    raw: dict[str, np.ndarray], preset: AF3DataPreset | str = "af3_initial", *, seed: int = 0,
    focus: tuple[int, ...] | None = None,
) -> dict[str, np.ndarray]:
    """One sample (:data:`~fold_data.af3.schema.SAMPLE_FEATURES`) from raw features;
    ``focus``: the chain or interface it was drawn for (:mod:`fold_data.af3.sampling`)."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    validate(raw, RAW_FEATURES, where="AF3 raw features")
    rng = np.random.default_rng(seed)
    tokens = crop_indices(raw, preset, rng, focus)
    feats = crop_features(raw, tokens) if tokens is not None else dict(raw)
    n_tok, n_at = len(feats["asym_id"]), len(feats["atom_to_token"])
    N_tok = preset.n_token if preset.n_token is not None else n_tok
    N_at = preset.n_atom if preset.n_atom is not None else n_at

    # MSA rows: the query and a random subset of the rest, in random order (AF3 2.3).
    depth = feats["msa"].shape[0]
    rest = rng.permutation(np.arange(1, depth))[: max(preset.n_msa - 1, 0)]
    rows = np.concatenate([[0], rest]).astype(np.int64)
    msa, dels = feats["msa"][rows], feats["deletion_matrix"][rows]
    N_msa = preset.n_msa if preset.n_token is not None else len(rows)

    # Templates: a random subset, original order.
    n_t = feats["template_restype"].shape[0]
    chosen = np.sort(rng.permutation(n_t)[: preset.n_templ])

    # Reference conformers: random rotation and translation per conformer (AF3 2.8).
    uids, group = np.unique(feats["ref_space_uid"], return_inverse=True)
    rots = np.stack([random_rotation(rng) for _ in uids]).reshape(-1, 3, 3)  # [N_uid, 3, 3]
    shifts = rng.normal(scale=preset.ref_translation_std, size=(len(uids), 3))  # [N_uid, 3]
    ref_pos = np.einsum("aij,aj->ai", rots[group], feats["ref_pos"].astype(np.float64))
    ref_pos = (ref_pos + shifts[group]) * feats["ref_mask"][:, None]  # [N_atom, 3]

    out: dict[str, np.ndarray] = {}
    for k in ("residue_index", "token_index", "asym_id", "entity_id", "sym_id", "is_protein",
              "is_rna", "is_dna", "is_ligand", "is_atomized", "token_center_atom",
              "token_pseudo_beta_atom", "deletion_mean"):
        out[k] = _pad(feats[k], (N_tok,))
    out["restype"] = _pad(feats["restype"], (N_tok,), GAP)
    out["token_mask"] = _pad(np.ones(n_tok, np.float32), (N_tok,))
    out["profile"] = _pad(feats["profile"], (N_tok, 32))
    out["ref_pos"] = _pad(ref_pos.astype(np.float32), (N_at, 3))
    for k in ("ref_mask", "ref_element", "ref_charge", "ref_space_uid", "ref_pos_source",
              "atom_to_token", "atom_resolved"):
        out[k] = _pad(feats[k], (N_at,))
    out["ref_atom_name_chars"] = _pad(feats["ref_atom_name_chars"], (N_at, 4))
    out["atom_positions"] = _pad(feats["atom_positions"], (N_at, 3))
    out["atom_mask"] = _pad(np.ones(n_at, np.float32), (N_at,))
    bonds = np.zeros((N_tok, N_tok), dtype=np.float32)
    tb = feats["token_bonds"]
    bonds[tb[:, 0], tb[:, 1]] = 1.0
    bonds[tb[:, 1], tb[:, 0]] = 1.0
    out["token_bonds"] = bonds
    out["msa"] = _pad(msa, (N_msa, N_tok), GAP)
    out["has_deletion"] = _pad((dels > 0).astype(np.float32), (N_msa, N_tok))
    out["deletion_value"] = _pad(
        ((2.0 / np.pi) * np.arctan(dels / 3.0)).astype(np.float32), (N_msa, N_tok))
    out["msa_mask"] = _pad(np.ones(msa.shape, np.float32), (N_msa, N_tok))
    N_templ = preset.n_templ
    for k in ("template_restype", "template_pseudo_beta", "template_pseudo_beta_mask",
              "template_backbone", "template_backbone_mask"):
        a = feats[k][chosen]
        fill = GAP if k == "template_restype" else 0
        out[k] = _pad(a, (N_templ, N_tok, *a.shape[2:]), fill)
    out["template_mask"] = _pad(np.ones(len(chosen), np.float32), (N_templ,))
    out["resolution"] = np.asarray(feats["resolution"], dtype=np.float32)
    validate(out, SAMPLE_FEATURES, where=f"AF3 sample ({preset.name})", allow_extra=False,
             sizes={"N_token": N_tok, "N_atom": N_at, "N_msa": N_msa, "N_templ": N_templ})
    return out
