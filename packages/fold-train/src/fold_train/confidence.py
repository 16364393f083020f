"""Confidence metrics of a prediction from its PAE logits: pTM, ipTM, per-chain and chain-pair
ipTM, the chain-pair minimum PAE, contact probabilities, and the ranking score.

The formulas are AlphaFold3's (supplement 5.9.1-5.9.3; where the text and the released code
differ, the code: ``confidence_head._get_tmscore_adjusted_pae``, ``confidences.py``,
``model.get_inference_result``), which for one chain reduce to AF2's pTM (supplement 1.9.7,
eq. 40):

* the TM-adjusted PAE of a pair ``(i, j)`` is the expectation, under the softmax of its PAE
  logits, of ``1 / (1 + (e / d0(n))^2)`` over the bin centres ``e``, with
  ``d0(n) = 1.24 (max(n, 19) - 15)^(1/3) - 1.8``. For pTM and ipTM ``n`` is the number of
  tokens; for the chain-pair ipTM it is the number of tokens of the two chains (of the one chain
  on the diagonal);
* pTM is ``max_i mean_j`` of it over the tokens ``i`` with a valid frame and every token ``j``;
  ipTM the same with ``j`` restricted to the other chains (NaN for one chain: AF3's null);
* ``ranking_score = 0.8 ipTM + 0.2 pTM + 0.5 fraction_disordered - 100 has_clash`` (pTM when
  ipTM is NaN).

The TM-adjusted PAE is computed in torch from the logits (where the logits are, the device:
``[S, N, N, bins]`` never leaves it); the reductions are numpy float64 on ``[S, N, N]``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

__all__ = [
    "IPTM_WEIGHT",
    "chain_iptm",
    "chain_pair_iptm",
    "chain_pair_pae_min",
    "contact_probs",
    "d0",
    "expected_error",
    "interface_token_counts",
    "predicted_tm",
    "ranking_score",
    "tm_adjusted_pae",
]

# AF3 confidences.py: ranking weights
IPTM_WEIGHT = 0.8
FRACTION_DISORDERED_WEIGHT = 0.5
CLASH_PENALTY = 100.0
CONTACT_DISTANCE = 8.0  # Angstrom: AF3's contact_probs threshold


def d0(n: torch.Tensor | float) -> torch.Tensor | float:
    """TM-score's distance scale for ``n`` tokens (Yang & Skolnick 2004, eq. 5), ``n`` clipped
    at 19 as AF2/AF3 do (below it ``d0`` is negative)."""
    if isinstance(n, torch.Tensor):
        return 1.24 * (n.clamp_min(19.0) - 15.0) ** (1.0 / 3.0) - 1.8
    return 1.24 * (max(float(n), 19.0) - 15.0) ** (1.0 / 3.0) - 1.8


def expected_error(logits: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Expected PAE / PDE ``[..., N, N]`` (Angstrom) of logits ``[..., N, N, bins]``."""
    return (torch.softmax(logits.float(), -1) * centres.float()).sum(-1)


def tm_adjusted_pae(logits: torch.Tensor, centres: torch.Tensor, n_tokens: torch.Tensor
                    ) -> torch.Tensor:
    """``E[1 / (1 + (e / d0(n))^2)]`` under the PAE softmax: logits ``[..., N, N, bins]``, bin
    centres ``[bins]``, ``n_tokens`` the TM normaliser's token count, broadcast to ``[..., N,
    N]`` (a scalar for pTM, :func:`interface_token_counts` for the chain-pair ipTM) ->
    ``[..., N, N]`` in the logits' float precision (at least float32)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    n = torch.as_tensor(n_tokens, dtype=dtype, device=logits.device)
    scale = d0(n)[..., None]  # [..., N, N, 1]
    per_bin = 1.0 / (1.0 + (centres.to(dtype) / scale) ** 2)  # [..., N, N, bins]
    return (torch.softmax(logits.to(dtype), -1) * per_bin).sum(-1)


def interface_token_counts(asym_id: torch.Tensor) -> torch.Tensor:
    """``[N, N]``: tokens of chain(i) plus tokens of chain(j), counted once when they are the
    same chain (AF3's ``num_interface_tokens``) for the real tokens ``asym_id [N]``."""
    same = asym_id[:, None] == asym_id[None, :]  # [N, N]
    per_chain = same.sum(-1)  # [N]: tokens of the token's chain
    total = per_chain[:, None] + per_chain[None, :]
    return torch.where(same, total // 2, total)


def contact_probs(distogram_logits: torch.Tensor, first_break: float, last_break: float,
                  threshold: float = CONTACT_DISTANCE) -> torch.Tensor:
    """Probability that two tokens are within ``threshold`` A: the distogram's probability of
    the bins whose upper edge is at most ``threshold`` (AF3's ``contact_probs``). Logits
    ``[..., N, N, bins]`` whose ``bins - 1`` breaks run from ``first_break`` to ``last_break``
    (the last bin open) -> ``[..., N, N]``."""
    bins = distogram_logits.shape[-1]
    breaks = torch.linspace(first_break, last_break, bins - 1, dtype=torch.float64)
    tops = torch.cat([breaks, breaks[-1:] + (breaks[-1] - breaks[-2])])  # each bin's top edge
    contact = (tops <= threshold).to(torch.float32).to(distogram_logits.device)
    return (torch.softmax(distogram_logits.float(), -1) * contact).sum(-1)


def predicted_tm(tm: np.ndarray, frame_mask: np.ndarray, asym_id: np.ndarray | None = None,
                 interface: bool = False) -> float:
    """pTM (or, ``interface``, ipTM) of one sample: ``tm [N, N]`` the TM-adjusted PAE,
    ``frame_mask [N]`` the tokens with a valid frame (rows that may be the aligned frame),
    ``asym_id [N]`` the chains. ``max_i sum_j w_ij tm_ij / sum_j w_ij`` with ``w_ij`` the
    frame of ``i`` (and, for ipTM, ``j`` on another chain); NaN when no pair counts (one chain,
    or only ions: AF3 writes null)."""
    tm = np.asarray(tm, np.float64)
    n = tm.shape[0]
    if tm.shape != (n, n) or frame_mask.shape != (n,):
        raise ValueError(f"tm {tm.shape} and frame_mask {frame_mask.shape} must be [N, N], [N]")
    pair = np.repeat(frame_mask.astype(bool)[:, None], n, 1)  # [N, N]
    if interface:
        if asym_id is None:
            raise ValueError("ipTM needs the chains (asym_id)")
        pair &= asym_id[:, None] != asym_id[None, :]
    if not pair.any():
        return math.nan
    weights = pair / (1e-8 + pair.sum(-1, keepdims=True))  # [N, N], rows sum to 1 (or 0)
    return float((tm * weights).sum(-1).max())


def _chains(asym_id: np.ndarray) -> np.ndarray:
    """The chains' ids in the order of first appearance (the input's order)."""
    _, first = np.unique(asym_id, return_index=True)
    return asym_id[np.sort(first)]


def chain_pair_iptm(tm_interface: np.ndarray, frame_mask: np.ndarray, asym_id: np.ndarray
                    ) -> np.ndarray:
    """``[C, C]``: the ipTM of each pair of chains alone (the pTM of a chain on the diagonal),
    from the TM-adjusted PAE with the chain-pair normaliser ``tm_interface [N, N]``; chains in
    the order of :func:`_chains`; NaN where no frame is valid (an ion with itself)."""
    chains = _chains(asym_id)
    out = np.full((len(chains), len(chains)), np.nan)
    for a, ca in enumerate(chains):
        for b in range(a, len(chains)):
            keep = np.flatnonzero((asym_id == ca) | (asym_id == chains[b]))
            sub = np.ix_(keep, keep)
            out[a, b] = out[b, a] = predicted_tm(tm_interface[sub], frame_mask[keep],
                                                 asym_id[keep], interface=a != b)
    return out


def chain_iptm(pair_iptm: np.ndarray) -> np.ndarray:
    """``[C]``: each chain's mean ipTM with the other chains (AF3's ``iptm_xchain``: the mean of
    the off-diagonal row and column means, NaN ignored; NaN for a single chain)."""
    c = pair_iptm.shape[0]
    if c < 2:
        return np.full(c, np.nan)
    off = ~np.eye(c, dtype=bool)
    vals = np.where(off & ~np.isnan(pair_iptm), pair_iptm, np.nan)
    with warnings.catch_warnings():  # an all-NaN row is a NaN result, on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        rows = np.nanmean(vals, axis=1)
        cols = np.nanmean(vals, axis=0)
        return np.nanmean(np.stack([rows, cols]), axis=0)


def chain_pair_pae_min(pae: np.ndarray, frame_mask: np.ndarray, asym_id: np.ndarray
                       ) -> np.ndarray:
    """``[C, C]``: the smallest PAE ``pae [N, N]`` from a valid frame of chain ``a`` to a token
    of chain ``b`` (NaN when chain ``a`` has no valid frame: an ion)."""
    chains = _chains(asym_id)
    out = np.full((len(chains), len(chains)), np.nan)
    for a, ca in enumerate(chains):
        rows = np.flatnonzero((asym_id == ca) & frame_mask.astype(bool))
        if len(rows) == 0:
            continue
        for b, cb in enumerate(chains):
            out[a, b] = pae[np.ix_(rows, np.flatnonzero(asym_id == cb))].min()
    return out


def ranking_score(ptm: float, iptm: float, fraction_disordered: float, has_clash: bool
                  ) -> float:
    """AF3 5.9.3: ``0.8 ipTM + 0.2 pTM + 0.5 disorder - 100 clash`` (pTM alone for one chain)."""
    base = ptm if math.isnan(iptm) else IPTM_WEIGHT * iptm + (1.0 - IPTM_WEIGHT) * ptm
    return base + FRACTION_DISORDERED_WEIGHT * fraction_disordered - CLASH_PENALTY * has_clash

