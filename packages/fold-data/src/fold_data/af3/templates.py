"""AF3 template features of protein chains (AF3 supplement 2.4 and Table 5).

Templates are found per protein chain, as in AF2: from template-search hits (``.hhr`` / ``.sto``,
featurized by :func:`fold_data.templates.make_template_features`, which handles the release
date filter, realignment and missing files) or from the AF3 JSON's user templates (an mmCIF and
query/template index lists). Template ``t`` of every chain shares row ``t``; tokens of other
chains, ligands and atomized residues are gaps with zero masks (AF3 masks template features
between chains in the model, by ``asym_id``).

Stored per token: the template residue type (32 classes), the pseudo-beta atom (CB, CA for
glycine) for the template distogram, and the backbone N, CA, C for the template unit vectors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif
from fold_data.templates import load_template_hits, make_template_features

from .parse import Chain, Entry
from .tokenizer import GAP

__all__ = ["make_af3_template_features", "empty_af3_templates"]

_N, _CA, _C, _CB = (rc.atom_order[a] for a in ("N", "CA", "C", "CB"))
_GLY = rc.restype_order["G"]


def empty_af3_templates(n_token: int, n_templ: int = 0) -> dict[str, np.ndarray]:
    """Template features with ``n_templ`` empty (all-gap, zero-mask) templates."""
    return {
        "template_restype": np.full((n_templ, n_token), GAP, dtype=np.int32),
        "template_pseudo_beta": np.zeros((n_templ, n_token, 3), dtype=np.float32),
        "template_pseudo_beta_mask": np.zeros((n_templ, n_token), dtype=np.float32),
        "template_backbone": np.zeros((n_templ, n_token, 3, 3), dtype=np.float32),
        "template_backbone_mask": np.zeros((n_templ, n_token), dtype=np.float32),
    }


def _chain_templates(
    chain: Chain, spec, mmcif_dir, *, max_template_date, max_templates: int, source: str | None
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(aatype [N_res] 0-21, atom37 positions [N_res, 37, 3], mask [N_res, 37]) per template."""
    n_res = len(chain.residues)
    out = []
    if spec is not None:
        hits = load_template_hits(chain.sequence, spec)
        if hits:
            if mmcif_dir is None:
                raise ValueError("template hits were given but no template_mmcif_dir")
            feats = make_template_features(chain.sequence, hits, mmcif_dir,
                                           max_template_date=max_template_date,
                                           max_hits=max_templates)
            for t in range(feats["template_aatype"].shape[0]):
                out.append((feats["template_aatype"][t], feats["template_all_atom_positions"][t],
                            feats["template_all_atom_mask"][t]))
    for user in chain.templates[: max(0, max_templates - len(out))]:
        structure = parse_mmcif(user.mmcif_path)
        tchain = next(iter(structure.chains.values()))
        aatype = np.full(n_res, 21, dtype=np.int32)
        pos = np.zeros((n_res, rc.atom_type_num, 3), dtype=np.float32)
        mask = np.zeros((n_res, rc.atom_type_num), dtype=np.float32)
        for q, t in zip(user.query_indices, user.template_indices):
            if q >= n_res or t >= tchain.num_res:
                raise InputError(source, f"protein {chain.chain_id}",
                                 f"field 'templates': index pair ({q}, {t}) outside the query "
                                 f"(length {n_res}) or the template chain (length "
                                 f"{tchain.num_res} in {user.mmcif_path})")
            aatype[q] = tchain.aatype[t]
            pos[q], mask[q] = tchain.atom37_positions[t], tchain.atom37_mask[t]
        out.append((aatype, pos, mask))
    return out


def make_af3_template_features(
    entry: Entry,
    tokens: dict[str, np.ndarray],
    template_hits: Mapping[str, object] | None = None,
    *,
    template_mmcif_dir: str | os.PathLike | None = None,
    max_template_date: str | None = None,
    max_templates: int = 4,
) -> dict[str, np.ndarray]:
    """``template_restype`` [N_templ, N_token] int32, ``template_pseudo_beta`` [N_templ, N_token,
    3], ``template_pseudo_beta_mask`` [N_templ, N_token], ``template_backbone`` [N_templ,
    N_token, 3, 3] (N, CA, C), ``template_backbone_mask`` [N_templ, N_token] float32.

    ``template_hits``: per protein chain's author ID a hits file or parsed hits.
    """
    template_hits = template_hits or {}
    asym, res_index = tokens["asym_id"], tokens["residue_index"]
    atomized = tokens["is_atomized"].astype(bool)
    per_chain = {}
    for a, chain in enumerate(entry.chains):
        if chain.mol_type != "protein":
            continue
        spec = template_hits.get(chain.author_id)
        if spec is None and not chain.templates:
            continue
        per_chain[a] = _chain_templates(chain, spec, template_mmcif_dir,
                                        max_template_date=max_template_date,
                                        max_templates=max_templates, source=entry.source or None)
    n_templ = max((len(v) for v in per_chain.values()), default=0)
    feats = empty_af3_templates(len(asym), n_templ)
    for a, templates in per_chain.items():
        cols = np.flatnonzero((asym == a) & ~atomized)  # one token per standard residue
        res = res_index[cols]
        for t, (aatype, pos, mask) in enumerate(templates):
            aa = aatype[res]
            feats["template_restype"][t, cols] = np.where(aa == 21, GAP, aa)
            is_gly = aa == _GLY
            pb = np.where(is_gly[:, None], pos[res, _CA], pos[res, _CB])
            pb_mask = np.where(is_gly, mask[res, _CA], mask[res, _CB])
            feats["template_pseudo_beta"][t, cols] = pb * pb_mask[:, None]
            feats["template_pseudo_beta_mask"][t, cols] = pb_mask
            bb = pos[res][:, [_N, _CA, _C]]
            bb_mask = mask[res][:, [_N, _CA, _C]].prod(axis=-1)
            feats["template_backbone"][t, cols] = bb * bb_mask[:, None, None]
            feats["template_backbone_mask"][t, cols] = bb_mask
    return feats
