"""The AF3 confidence head (supplement 4.3, Alg. 31) and its losses.

The head embeds the distances between the tokens' predicted representative atoms
(``token_pseudo_beta_atom``: CB, CA for glycine, C4 / C2 for purines / pyrimidines, the atom of a
one-atom token) into the (detached) trunk pair, runs a 4-block Pairformer and predicts per-atom
pLDDT (50 bins) and experimentally resolved (2 bins) with one weight matrix per atom slot of a
token, and per-pair PAE and PDE (64 bins of 0.5 A). In training it sees the output of a
mini-rollout of the sampler (no gradient), and its targets are computed from that prediction and
the ground truth: per-atom lDDT against the token centre atoms, representative-atom distance
errors (PDE), and aligned errors of the centre atoms in each token's frame (N-CA-C for amino
acids, C1'-C3'-C4' for nucleotides, the atom and its two nearest centre atoms of the same chain
for ligands and other one-atom tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fold_model.af3.config import PairformerConfig
from fold_model.af3.pairformer import PairformerStack
from fold_model.geometry import rigid_from_3_points
from fold_model.layers import LayerNorm, Linear

__all__ = [
    "PairReducer",
    "token_atom_index",
    "ConfidenceHead",
    "token_frame_atoms",
    "confidence_targets",
    "confidence_loss",
    "expected_value",
]


# reduce_pair of ConfidenceHead.forward: (logits {"pae", "pde"} [B, G, R, N, bins], rows) ->
# {name: [B, G, R, ...]}
PairReducer = Callable[[dict[str, torch.Tensor], slice], dict[str, torch.Tensor]]


def token_atom_index(atom_to_token: torch.Tensor, n_token: int) -> torch.Tensor:
    """Rank of each atom among its token's atoms (a token's atoms are contiguous): ``[B, A]``."""
    tok = atom_to_token.long()
    ar = torch.arange(tok.shape[-1], device=tok.device).expand_as(tok)
    first = torch.full((tok.shape[0], n_token), tok.shape[-1], device=tok.device, dtype=torch.long)
    first = first.scatter_reduce(1, tok, ar, reduce="amin")
    return ar - torch.gather(first, 1, tok)


def _center_positions(x: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """``x [B, S, A, 3]`` at one atom per token ``[B, N]`` (centre or representative atoms)
    -> ``[B, S, N, 3]``."""
    idx = center.long()[:, None, :, None].expand(-1, x.shape[1], -1, 3)
    return torch.gather(x, 2, idx)


class ConfidenceHead(nn.Module):
    """Alg. 31, with AF3's code where it adds to the supplement (LayerNorms before the heads,
    the pair-distance bins of ``dgram_from_positions``, symmetrised PDE logits) and, with
    ``confidence.variant="protenix"``, Protenix 2.0's differences (see docs/weights.md).

    ``forward(feats, s_inputs [B, N, C_si], s_trunk [B, N, C_s], z_trunk [B, N, N, C_z],
    x_pred [B, S, A, 3]) -> logits`` ``plddt [B, S, A, 50]``, ``resolved [B, S, A, 2]``,
    ``pae [B, S, N, N, 64]``, ``pde [B, S, N, N, 64]``. Inputs are detached (no gradient into the
    trunk or the diffusion module)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        c = cfg.confidence
        self.cfg = c
        self.max_atoms = cfg.atom.max_atoms_per_token
        self.linear_s_i = Linear(cfg.c_s_inputs, cfg.c_z, bias=False)
        self.linear_s_j = Linear(cfg.c_s_inputs, cfg.c_z, bias=False)
        self.linear_d = Linear(c.distance_no_bins, cfg.c_z, bias=False)
        self.protenix = c.variant == "protenix"
        if self.protenix:  # Protenix 2.0: LN(clamp(s_trunk)) and the raw distance embedded too
            self.layer_norm_s_trunk = LayerNorm(cfg.c_s)
            self.linear_d_raw = Linear(1, cfg.c_z, bias=False)
        pf = PairformerConfig(**{**vars(cfg.pairformer), "no_blocks": c.no_blocks})
        self.pairformer = PairformerStack(pf, cfg.c_s, cfg.c_z, use_checkpoint=cfg.checkpoint)
        # LayerNorms before the four heads, as in AF3's code (pae_logits_ln, logits_ln,
        # plddt_logits_ln, experimentally_resolved_ln) and Protenix's.
        self.layer_norm_pae = LayerNorm(cfg.c_z)
        self.layer_norm_pde = LayerNorm(cfg.c_z)
        self.layer_norm_plddt = LayerNorm(cfg.c_s)
        self.layer_norm_resolved = LayerNorm(cfg.c_s)
        self.linear_pae = Linear(cfg.c_z, c.pae_no_bins, bias=False, init="final")
        self.linear_pde = Linear(cfg.c_z, c.pde_no_bins, bias=False, init="final")
        # One weight matrix per atom slot of a token (LinearNoBias_{token_atom_idx(l)}).
        self.plddt_weight = nn.Parameter(torch.zeros(self.max_atoms, cfg.c_s, c.plddt_no_bins))
        self.resolved_weight = nn.Parameter(
            torch.zeros(self.max_atoms, cfg.c_s, c.resolved_no_bins)
        )
        # Inference: the samples go through the head in groups of this many (None: all at once)
        self.sample_group_size: int | None = None
        # Inference with ``reduce_pair``: pair rows per block of the PAE / PDE heads (None: all)
        self.chunk_size: int | None = None

    def _per_atom(self, s: torch.Tensor, weight: torch.Tensor, tok: torch.Tensor,
                  slot: torch.Tensor) -> torch.Tensor:
        per_slot = torch.einsum("bsnc,kcd->bsnkd", s, weight)  # [B, S, N, K, bins]
        flat = per_slot.flatten(2, 3)  # [B, S, N * K, bins]
        idx = (tok * self.max_atoms + slot)[:, None, :, None]  # [B, 1, A, 1]
        idx = idx.expand(s.shape[0], s.shape[1], -1, weight.shape[-1])
        return torch.gather(flat, 2, idx)  # [B, S, A, bins]

    def forward(
        self,
        feats: dict[str, torch.Tensor],
        s_inputs: torch.Tensor,
        s_trunk: torch.Tensor,
        z_trunk: torch.Tensor,
        x_pred: torch.Tensor,
        reduce_pair: PairReducer | None = None,
    ) -> dict[str, torch.Tensor]:
        """Each sample is scored on its own, so with ``sample_group_size`` G the head runs on
        G samples at a time (its Pairformer's pair ``[B, G, N, N, C_z]`` instead of S of them)
        and the outputs are concatenated over the samples.

        ``reduce_pair`` (inference): instead of the PAE / PDE logits ``[B, S, N, N, bins]``,
        return what ``reduce_pair(logits, rows)`` makes of them, one group of samples and one
        block of pair rows at a time: it gets ``{"pae", "pde"}`` logits ``[B, G, R, N, bins]``
        of the rows ``rows`` (a slice of ``N``) and returns tensors ``[B, G, R, ...]``, which
        are concatenated over the rows and the groups. The rows come in blocks of
        ``chunk_size`` (None: all rows at once), so the logits of all samples are never held
        together (docs/memory.md)."""
        G, S = self.sample_group_size, x_pred.shape[1]
        if G is None or S <= G:
            return self._forward(feats, s_inputs, s_trunk, z_trunk, x_pred, reduce_pair)
        parts = [self._forward(feats, s_inputs, s_trunk, z_trunk, x_pred[:, i: i + G],
                               reduce_pair)
                 for i in range(0, S, G)]
        return {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}

    def pair_logits(self, z: torch.Tensor, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
        """PAE and PDE logits of the pair rows ``rows``: ``z [B, S, N, N, C_z]`` (the head's
        Pairformer output) -> ``[B, S, R, N, bins]``. The PDE is symmetric in (i, j): AF3's code
        adds the projection of ``z_ji`` to that of ``z_ij``, Protenix projects ``z_ij + z_ji``;
        the column block ``z[:, :, :, rows]`` gives the ``z_ji`` of these rows."""
        z_ij = z[:, :, rows]  # [B, S, R, N, C_z]
        z_ji = z[:, :, :, rows].transpose(-2, -3)  # [B, S, R, N, C_z]
        if self.protenix:  # Protenix: one projection of the symmetrised pair
            pde = self.linear_pde(self.layer_norm_pde(z_ij + z_ji))
        else:  # AF3's code: the projection's logits symmetrised
            pde = (self.linear_pde(self.layer_norm_pde(z_ij))
                   + self.linear_pde(self.layer_norm_pde(z_ji)))
        return {"pae": self.linear_pae(self.layer_norm_pae(z_ij)), "pde": pde}

    def _reduced_pairs(self, z: torch.Tensor, reduce_pair: PairReducer
                       ) -> dict[str, torch.Tensor]:
        """``reduce_pair`` of the pair logits, row block by row block (``chunk_size`` rows; the
        logits of one block live at a time): ``z [B, G, N, N, C_z]`` -> ``[B, G, N, ...]``."""
        n = z.shape[-2]
        step = self.chunk_size or n
        parts = [reduce_pair(self.pair_logits(z, slice(i, min(i + step, n))),
                             slice(i, min(i + step, n)))
                 for i in range(0, n, step)]
        return {k: torch.cat([p[k] for p in parts], dim=2) for k in parts[0]}

    def _forward(self, feats, s_inputs, s_trunk, z_trunk, x_pred, reduce_pair=None):
        c = self.cfg
        s_inputs, s_trunk, z_trunk, x_pred = (t.detach() for t in (s_inputs, s_trunk, z_trunk,
                                                                    x_pred))
        S = x_pred.shape[1]
        z = z_trunk + self.linear_s_i(s_inputs).unsqueeze(-2)  # [B, N, N, C_z]
        z += self.linear_s_j(s_inputs).unsqueeze(-3)  # in place: one pair-sized temporary less
        # Distances between the tokens' representative atoms (AF3's pseudo-beta: CB, CA for
        # glycine, C4 / C2 for purines / pyrimidines, the atom of a one-atom token), one-hot in
        # AF3's bins: lower edges linspace(min, max, no_bins), each bin open up to the next
        # edge, the last unbounded.
        centers = _center_positions(x_pred, feats["token_pseudo_beta_atom"])  # [B, S, N, 3]
        d = torch.cdist(centers, centers)  # [B, S, N, N]
        lower = torch.linspace(c.distance_min_bin, c.distance_max_bin, c.distance_no_bins,
                               device=d.device, dtype=d.dtype)
        upper = torch.cat([lower[1:], lower.new_full((1,), 1e6)])
        onehot = (d[..., None] > lower) & (d[..., None] < upper)  # [B, S, N, N, bins]
        # 0 / 1 are exact in any dtype: the one autocast's matmul reads, not a float32 copy
        kind = z.device.type
        onehot = onehot.to(torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind)
                           else z.dtype)
        z_d = self.linear_d(onehot)  # [B, S, N, N, C_z]
        del onehot
        # one sample (a group of 1, long inputs): in place, no second [B, 1, N, N, C_z]
        z = z.unsqueeze(1).add_(z_d) if S == 1 else z.unsqueeze(1) + z_d
        del z_d
        if self.protenix:
            z = z + self.linear_d_raw(d[..., None].to(z.dtype))
            s_trunk = self.layer_norm_s_trunk(s_trunk.clamp(-512, 512))
        s = s_trunk.unsqueeze(1).expand(-1, S, -1, -1)
        mask = feats["token_mask"].to(z.dtype)[:, None].expand(-1, S, -1)  # [B, S, N]
        s, z = self.pairformer(s, z, mask, mask[..., :, None] * mask[..., None, :])
        tok = feats["atom_to_token"].long()
        slot = token_atom_index(tok, s.shape[-2]).clamp_max(self.max_atoms - 1)
        out = {
            "plddt": self._per_atom(self.layer_norm_plddt(s), self.plddt_weight, tok, slot),
            "resolved": self._per_atom(self.layer_norm_resolved(s), self.resolved_weight, tok,
                                       slot),
        }
        if reduce_pair is not None:
            return {**out, **self._reduced_pairs(z, reduce_pair)}
        if self.protenix:  # Protenix: one projection of the symmetrised pair
            pde = self.linear_pde(self.layer_norm_pde(z + z.transpose(-2, -3)))
        else:  # AF3's code: the projection's logits symmetrised
            pde = self.linear_pde(self.layer_norm_pde(z))
            pde = pde + pde.transpose(-2, -3)
        return {"pae": self.linear_pae(self.layer_norm_pae(z)), "pde": pde, **out}


_NUCLEOTIDE_FRAME = ("C1'", "C3'", "C4'")


def _name_codes(names: tuple[str, ...]) -> list[list[int]]:
    return [[ord(ch) - 32 for ch in n.ljust(4)] for n in names]


def token_frame_atoms(feats: dict[str, torch.Tensor], x_gt: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Three atoms per token defining its frame ``[B, N, 3]`` (atom indices), validity ``[B, N]``.

    Amino acids: the atoms before and after the centre (N, CA, C in the CCD order); nucleotides:
    C1', C3', C4' by name; one-atom tokens: the atom and the two nearest centre atoms of the same
    chain in the ground truth ``x_gt [B, A, 3]``, valid when not within 25 degrees of collinear.
    """
    center = feats["token_center_atom"].long()  # [B, N]
    B, N = center.shape
    A = x_gt.shape[1]
    tok = feats["atom_to_token"].long()
    res = feats["atom_resolved"] * feats["atom_mask"]  # [B, A]
    frame = torch.stack([center - 1, center, center + 1], -1).clamp(0, A - 1)  # amino acids
    # Nucleotides: find C1', C3', C4' among each token's atoms.
    names = feats["ref_atom_name_chars"].long()  # [B, A, 4]
    # Compared character by character with Python ints: no host-to-device copy (a step
    # captured in a CUDA graph cannot make one).
    nuc = torch.stack([
        torch.stack([names[..., k] == c for k, c in enumerate(code)], -1).all(-1)
        for code in _name_codes(_NUCLEOTIDE_FRAME)
    ], -1)  # [B, A, 3]
    ar = torch.arange(A, device=names.device)[None, :, None].expand(B, A, 3)
    found = torch.full((B, N, 3), -1, dtype=torch.long, device=names.device)
    found = found.scatter_reduce(1, tok[..., None].expand(-1, -1, 3),
                                 torch.where(nuc, ar, -1), reduce="amax")
    is_nuc = (feats["is_rna"] + feats["is_dna"]).bool() & ~feats["is_atomized"].bool()
    frame = torch.where(is_nuc[..., None], found.clamp_min(0), frame)
    valid = torch.where(is_nuc, (found >= 0).all(-1), feats["is_protein"].bool())
    # One-atom tokens: two nearest centre atoms of the same chain.
    cpos = torch.gather(x_gt, 1, center[..., None].expand(-1, -1, 3))  # [B, N, 3]
    d = torch.cdist(cpos, cpos)
    c_ok = torch.gather(res, 1, center) * feats["token_mask"]
    same = feats["asym_id"][:, :, None] == feats["asym_id"][:, None, :]
    far = ~same | (c_ok[:, None, :] == 0) | torch.eye(N, dtype=torch.bool, device=d.device)
    d = d.masked_fill(far, math.inf)
    near_d, near = d.topk(min(2, N), dim=-1, largest=False)  # [B, N, 2]
    atomized = feats["is_atomized"].bool()
    if N >= 2:
        nb = torch.gather(center, 1, near.flatten(1)).view(B, N, 2)
        lig_frame = torch.stack([nb[..., 0], center, nb[..., 1]], -1)
        frame = torch.where(atomized[..., None], lig_frame, frame)
        idx = lig_frame.flatten(1)[..., None].expand(-1, -1, 3)  # [B, 3N, 3]
        p = torch.gather(x_gt, 1, idx).view(B, N, 3, 3)
        u, v = p[..., 0, :] - p[..., 1, :], p[..., 2, :] - p[..., 1, :]
        cos = (u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1)).clamp_min(1e-8)
        lig_ok = torch.isfinite(near_d).all(-1) & (cos.abs() < math.cos(math.radians(25)))
        valid = torch.where(atomized, lig_ok, valid)
    else:
        valid = valid & ~atomized
    ok = torch.gather(res, 1, frame.flatten(1)).view(B, N, 3).prod(-1) > 0
    return frame, valid & ok & feats["token_mask"].bool()


def _aligned_errors(x: torch.Tensor, frame: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """Centre atoms ``j`` in the frame of token ``i``: ``[B, S, N_i, N_j, 3]``."""
    B, S = x.shape[:2]
    idx = frame.flatten(1)[:, None, :, None].expand(B, S, -1, 3)
    p = torch.gather(x, 2, idx).unflatten(2, (frame.shape[1], 3))  # [B, S, N, 3, 3]
    rig = rigid_from_3_points(p[..., 0, :], p[..., 1, :], p[..., 2, :])
    c = _center_positions(x, center)  # [B, S, N, 3]
    diff = c[:, :, None, :, :] - rig.trans[:, :, :, None, :]  # [B, S, N_i, N_j, 3]
    return torch.einsum("bsiuv,bsiju->bsijv", rig.rots, diff)  # R_i^T (x_j - t_i)


def confidence_targets(
    feats: dict[str, torch.Tensor], x_pred: torch.Tensor, cfg
) -> dict[str, torch.Tensor]:
    """Binned targets and masks from the prediction ``x_pred [B, S, A, 3]`` and the ground truth
    (``atom_positions``): per-atom lDDT (50 bins over [0, 1]) against the resolved centre atoms of
    the other tokens, PDE and PAE (bins of ``max / no_bins`` A), resolved (0/1)."""
    x_pred = x_pred.detach().float()
    x_gt = feats["atom_positions"].float()
    S = x_pred.shape[1]
    gt = x_gt[:, None].expand_as(x_pred)
    center = feats["token_center_atom"].long()
    tok = feats["atom_to_token"].long()
    res = feats["atom_resolved"].float() * feats["atom_mask"].float()  # [B, A]
    c_ok = torch.gather(res, 1, center) * feats["token_mask"].float()  # [B, N]
    # pLDDT: atom l against centre atoms m of other tokens within 15 A (30 A for nucleotides).
    cp, cg = _center_positions(x_pred, center), _center_positions(gt, center)
    d_pred = torch.cdist(x_pred, cp)  # [B, S, A, N]
    d_gt = torch.cdist(gt, cg)
    nuc = (feats["is_rna"] + feats["is_dna"]) > 0
    radius = torch.where(nuc, 30.0, 15.0)[:, None, None, :]
    other = tok[:, :, None] != torch.arange(center.shape[1], device=tok.device)
    pair = (d_gt < radius) & (other & (c_ok[:, None, :] > 0))[:, None]
    err = (d_pred - d_gt).abs()
    score = sum((err < t).float() for t in (0.5, 1.0, 2.0, 4.0)) / 4
    pairf = pair.float()
    atom_lddt = (score * pairf).sum(-1) / pairf.sum(-1).clamp_min(1e-8)  # [B, S, A]
    plddt_mask = res[:, None].expand(-1, S, -1) * (pairf.sum(-1) > 0).float()
    c = cfg.confidence
    plddt_bin = _bin(atom_lddt * c.plddt_no_bins, c.plddt_no_bins)
    # PDE: distance errors between the tokens' representative atoms (supplement 4.3.3; the
    # distogram's pseudo-beta atoms, as Protenix's PDE loss).
    rep = feats["token_pseudo_beta_atom"].long()  # [B, N]
    rp, rg = _center_positions(x_pred, rep), _center_positions(gt, rep)  # [B, S, N, 3]
    r_ok = torch.gather(res, 1, rep) * feats["token_mask"].float()  # [B, N]
    pde = (torch.cdist(rp, rp) - torch.cdist(rg, rg)).abs()
    pde_bin = _bin(pde / (c.pde_max / c.pde_no_bins), c.pde_no_bins)
    pde_mask = (r_ok[:, :, None] * r_ok[:, None, :])[:, None].expand(-1, S, -1, -1)
    pair_mask = (c_ok[:, :, None] * c_ok[:, None, :])[:, None].expand(-1, S, -1, -1)
    # A sample with non-finite coordinates (a diverged model) gets NaN masks: its loss is NaN,
    # which the trainer's non-finite guard skips, instead of targets binned from garbage.
    poison = torch.where(torch.isfinite(x_pred).all(-1).all(-1), 1.0, float("nan"))  # [B, S]
    plddt_mask = plddt_mask * poison[:, :, None]
    pair_mask = pair_mask * poison[:, :, None, None]
    pde_mask = pde_mask * poison[:, :, None, None]
    # PAE: errors of centre atoms in each token's frame (ground-truth frame atoms must exist).
    frame, valid = token_frame_atoms(feats, x_gt)
    e = (_aligned_errors(x_pred, frame, center) - _aligned_errors(gt, frame, center)).norm(dim=-1)
    pae_bin = _bin(e / (c.pae_max / c.pae_no_bins), c.pae_no_bins)
    pae_mask = pair_mask * valid.float()[:, None, :, None]
    return {
        "plddt": plddt_bin, "plddt_mask": plddt_mask,
        "pde": pde_bin, "pde_mask": pde_mask,
        "pae": pae_bin, "pae_mask": pae_mask,
        "resolved": feats["atom_resolved"].long()[:, None].expand(-1, S, -1),
        "resolved_mask": feats["atom_mask"].float()[:, None].expand(-1, S, -1),
    }


def _bin(x: torch.Tensor, n: int) -> torch.Tensor:
    """Bin indices ``floor(x)`` in ``0..n-1``; NaN and infinities land in a valid bin (a NaN
    cast to an integer is INT_MIN, an out-of-range class for the cross-entropy)."""
    return x.nan_to_num(0.0, posinf=n - 1, neginf=0.0).clamp(0, n - 1).long()


def _masked_ce(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ce = nn.functional.cross_entropy(logits.float().movedim(-1, 1), target, reduction="none")
    return (ce * mask).sum() / mask.sum().clamp_min(1.0)


def confidence_loss(logits: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], loss_cfg
                    ) -> dict[str, torch.Tensor]:
    """Cross-entropies of the four heads (section 4.3) and their weighted sum ``confidence``."""
    out = {k: _masked_ce(logits[k], targets[k], targets[k + "_mask"])
           for k in ("plddt", "pde", "pae", "resolved")}
    out["confidence"] = (loss_cfg.plddt_weight * out["plddt"] + loss_cfg.pde_weight * out["pde"]
                         + loss_cfg.pae_weight * out["pae"]
                         + loss_cfg.resolved_weight * out["resolved"])
    return out


def expected_value(logits: torch.Tensor, max_value: float) -> torch.Tensor:
    """Expectation of the binned quantity under the softmax (bin centres of ``[0, max_value]``):
    pLDDT with ``max_value=100``, PAE/PDE with ``32`` A."""
    n = logits.shape[-1]
    centres = (torch.arange(n, device=logits.device, dtype=torch.float32) + 0.5) * max_value / n
    return (torch.softmax(logits.float(), -1) * centres).sum(-1)
