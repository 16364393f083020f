"""AF3 input embedding (supplement 3.1-3.2): relative position encoding (Alg. 3), token bonds,
the atom attention encoder / decoder (Alg. 5, 6) with the sequence-local atom transformer (Alg. 7)
and the input feature embedder (Alg. 2).

Sequence-local atom attention: atoms are cut into query windows of ``n_queries`` (32) atoms; the
window with centre ``c`` (15.5, 47.5, ...) attends to the ``n_keys`` (128) atoms with
``|m - c| < n_keys / 2``. Alg. 7 writes this as a dense ``N_atom x N_atom`` bias with -1e10
outside the windows; here only the windows are materialised (``[*, K, n_queries, n_keys]`` with
``K = ceil(N_atom / n_queries)``), which is the same attention at ``O(N_atom)`` memory. The
test suite checks it against the dense form.

Shapes: ``B`` batch, ``S`` diffusion samples, ``N`` tokens, ``A`` atoms, ``K`` windows.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fold_model.af3.conditioning import AttentionPairBias, ConditionedTransitionBlock
from fold_model.layers import LayerNorm, Linear, stack_as_made

__all__ = [
    "ATOM_FEAT_DIM",
    "AtomWindows",
    "relative_position_features",
    "RelativePositionEncoding",
    "atom_features",
    "AtomTransformer",
    "AtomAttentionEncoder",
    "AtomAttentionDecoder",
    "InputFeatureEmbedder",
    "gather_tokens",
    "mean_over_atoms",
]

ATOM_FEAT_DIM = 3 + 1 + 1 + 128 + 4 * 64  # ref_pos, charge, mask, element, name chars (Alg. 5)


def relative_position_features(feats: dict[str, torch.Tensor], r_max: int, s_max: int,
                               rows: slice = slice(None)) -> torch.Tensor:
    """Alg. 3 lines 1-9: ``[*, N, N, 2 (2 r_max + 2) + 1 + 2 s_max + 2]`` one-hot features
    (``rows``: only the pair rows ``i`` in it, ``[*, R, N, ...]``).

    The relative chain index ``sym_id_i - sym_id_j`` is used within one entity (copies of the same
    molecule) and set to the overflow bin otherwise: across entities it carries no meaning.
    """
    def pair(x: torch.Tensor) -> torch.Tensor:
        return x[..., rows, None] - x[..., None, :]  # [*, R, N]

    asym, res, tok = feats["asym_id"], feats["residue_index"], feats["token_index"]
    same_chain = pair(asym) == 0
    same_res = pair(res) == 0
    same_entity = pair(feats["entity_id"]) == 0
    overflow_r = torch.full_like(pair(res), 2 * r_max + 1)
    d_res = torch.where(same_chain, (pair(res) + r_max).clamp(0, 2 * r_max), overflow_r)
    d_tok = torch.where(same_chain & same_res, (pair(tok) + r_max).clamp(0, 2 * r_max),
                        overflow_r)
    d_chain = torch.where(same_entity, (pair(feats["sym_id"]) + s_max).clamp(0, 2 * s_max),
                          torch.full_like(d_res, 2 * s_max + 1))
    dtype = torch.get_default_dtype()
    return torch.cat([
        nn.functional.one_hot(d_res.long(), 2 * r_max + 2).to(dtype),
        nn.functional.one_hot(d_tok.long(), 2 * r_max + 2).to(dtype),
        same_entity[..., None].to(dtype),
        nn.functional.one_hot(d_chain.long(), 2 * s_max + 2).to(dtype),
    ], dim=-1)


class RelativePositionEncoding(nn.Module):
    """Alg. 3: ``LinearNoBias`` of :func:`relative_position_features` -> ``[*, N, N, C_z]``."""

    def __init__(self, c_z: int, r_max: int = 32, s_max: int = 2) -> None:
        super().__init__()
        self.r_max, self.s_max = r_max, s_max
        self.linear = Linear(4 * r_max + 4 + 1 + 2 * s_max + 2, c_z, bias=False)

    def forward(self, feats: dict[str, torch.Tensor], rows: slice = slice(None)
                ) -> torch.Tensor:
        f = relative_position_features(feats, self.r_max, self.s_max, rows)
        return self.linear(f.to(self.linear.weight.dtype))


def atom_features(feats: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Alg. 5 line 1 input: ``[*, A, 389]``: ref_pos, arcsinh(ref_charge), ref_mask, one-hot
    element (128 classes) and one-hot atom name characters (4 x 64). The charge enters as
    ``arcsinh`` as in AF3's code (``_per_atom_conditioning``) and Protenix's (the supplement says
    ``ref_charge``): the released weights were trained on it."""
    return torch.cat([
        feats["ref_pos"].to(dtype),
        torch.arcsinh(feats["ref_charge"].to(dtype))[..., None],
        feats["ref_mask"].to(dtype)[..., None],
        nn.functional.one_hot(feats["ref_element"].long().clamp(0, 127), 128).to(dtype),
        nn.functional.one_hot(feats["ref_atom_name_chars"].long().clamp(0, 63), 64)
        .to(dtype).flatten(-2),
    ], dim=-1)


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x [B, N, C]``, ``index [B, *I]`` (token of each entry) -> ``[B, *I, C]``."""
    flat = index.reshape(index.shape[0], -1, 1).long()  # [B, I, 1]
    out = torch.gather(x, 1, flat.expand(-1, -1, x.shape[-1]))  # [B, I, C]
    return out.reshape(*index.shape, x.shape[-1])


def mean_over_atoms(x: torch.Tensor, atom_to_token: torch.Tensor, atom_mask: torch.Tensor,
                    n_token: int) -> torch.Tensor:
    """Per-token mean of atom values: ``x [B, S, A, C]`` -> ``[B, S, N, C]`` (masked atoms left
    out; a token without atoms gets 0)."""
    w = atom_mask.to(x.dtype)  # [B, A]
    idx = atom_to_token.long()[:, None, :, None].expand(x.shape[0], x.shape[1], -1, x.shape[-1])
    total = x.new_zeros(x.shape[0], x.shape[1], n_token, x.shape[-1])
    total = total.scatter_add(2, idx, x * w[:, None, :, None])  # [B, S, N, C]
    count = w.new_zeros(w.shape[0], n_token).scatter_add(1, atom_to_token.long(), w)  # [B, N]
    return total / count.clamp_min(1.0)[:, None, :, None]


class AtomWindows:
    """Index bookkeeping of sequence-local attention for ``n_atom`` atoms.

    Query window ``k`` holds atoms ``[k n_q, (k + 1) n_q)`` (padded), key window ``k`` the
    ``n_k`` atoms starting at ``k n_q - (n_k - n_q) / 2``; ``key_valid [B, K, n_k]`` is false
    outside ``[0, A)`` and for masked atoms.
    """

    def __init__(self, atom_mask: torch.Tensor, n_queries: int, n_keys: int) -> None:
        self.n_q, self.n_k = n_queries, n_keys
        self.n_atom = atom_mask.shape[-1]
        self.n_windows = -(-self.n_atom // n_queries)
        self.padded = self.n_windows * n_queries
        start = torch.arange(self.n_windows, device=atom_mask.device) * n_queries
        idx = start[:, None] - (n_keys - n_queries) // 2 + torch.arange(n_keys,
                                                                        device=atom_mask.device)
        inside = (idx >= 0) & (idx < self.n_atom)  # [K, n_k]
        self.key_index = idx.clamp(0, self.n_atom - 1)  # [K, n_k]
        mask = atom_mask.to(torch.bool)
        self.query_valid = self.queries(mask[..., None]).squeeze(-1)  # [B, K, n_q]
        self.key_valid = self.keys(mask[..., None]).squeeze(-1) & inside  # [B, K, n_k]

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, A, C]`` -> ``[*, K, n_q, C]`` (zero padded)."""
        pad = self.padded - self.n_atom
        x = nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        return x.unflatten(-2, (self.n_windows, self.n_q))

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, A, C]`` -> ``[*, K, n_k, C]`` (gathered; out-of-range entries are clamped copies,
        masked by ``key_valid``)."""
        return x.index_select(-2, self.key_index.reshape(-1)).unflatten(-2, self.key_index.shape)

    def keys_by_window(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, S, A, C]`` -> ``[B, K, S, n_k, C]``: :meth:`keys` gathered window-major in one
        gather, the layout the attention batches them in (each window's samples share its
        bias), so the k and v projections read it without a copy."""
        s = torch.arange(x.shape[1], device=x.device)
        return x[:, s[None, :, None], self.key_index[:, None, :]]  # [B, K, S, n_k, C]

    @property
    def overhang(self) -> tuple[int, int]:
        """``(before, after)``: how many rows the key windows reach before atom 0 and after
        atom A - 1 (:meth:`pad_keys` pads by them)."""
        before = (self.n_k - self.n_q) // 2
        after = max(0, (self.n_windows - 1) * self.n_q + self.n_k - before - self.n_atom)
        return before, after

    def pad_keys(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, A, C]`` -> ``[*, before + A + after, C]`` (zero rows, :attr:`overhang`): every
        key window is a slice of it (:meth:`key_windows`)."""
        before, after = self.overhang
        return nn.functional.pad(x, (0, 0, before, after))

    def key_windows(self, x_padded: torch.Tensor) -> torch.Tensor:
        """``[B, S, L, C]``, :meth:`pad_keys` of the keys or a row-wise map of it that keeps
        zero rows zero (a projection without bias) -> ``[B, K, S, n_k, C]``: the windows as
        overlapping strided views, no gather (the padded rows are masked by ``key_valid``, as
        :meth:`keys`' clamped copies are). For reading (inference): a gradient through
        overlapping views is summed by a slow scatter."""
        x = x_padded.contiguous()
        b, s, _, c = x.shape
        sb, ss, sl, sc = x.stride()
        return x.as_strided((b, self.n_windows, s, self.n_k, c),
                            (sb, self.n_q * sl, ss, sl, sc))  # window k: rows k n_q ...

    def add_windows(self, x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """``x [B, S, A, C] + unwindow(update [B, K, S, n_q, C])``: without padding (A a
        multiple of n_q) the sum is made window by window, with no copy of the update into
        the atom order first."""
        if self.padded != self.n_atom:
            return x + self.unwindow(update.transpose(1, 2))
        upd = update.transpose(1, 2)  # [B, S, K, n_q, C] view
        return (x.unflatten(-2, (self.n_windows, self.n_q)) + upd).flatten(-3, -2)

    def unwindow(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, K, n_q, C]`` -> ``[*, A, C]``."""
        return x.flatten(-3, -2)[..., : self.n_atom, :]

    def pair(self, x_q: torch.Tensor, x_k: torch.Tensor) -> torch.Tensor:
        """Pairwise differences ``[*, K, n_q, 1, C] - [*, K, 1, n_k, C]``."""
        return x_q.unsqueeze(-2) - x_k.unsqueeze(-3)


class AtomTransformer(nn.Module):
    """Alg. 7 (a diffusion transformer, Alg. 23, restricted to the atom windows).

    ``q: [B, S, A, C_atom]``, conditioning ``c: [B, A, C_atom]``, pair ``p: [B, K, n_q, n_k, C_ap]``
    -> ``[B, S, A, C_atom]``. Each block: ``q += AttentionPairBias(q, c, p)``,
    ``q += ConditionedTransitionBlock(q, c)``.
    """

    def __init__(self, c_atom: int, c_atompair: int, no_blocks: int, no_heads: int,
                 use_checkpoint: bool = False, key_norm: str = "input") -> None:
        super().__init__()
        self.attention = nn.ModuleList(
            AttentionPairBias(c_atom, c_atompair, no_heads, c_s=c_atom, key_norm=key_norm)
            for _ in range(no_blocks)
        )
        self.transition = nn.ModuleList(
            ConditionedTransitionBlock(c_atom, c_atom, 2) for _ in range(no_blocks)
        )
        # Recompute each block in backward while training. In the diffusion module the atom
        # activations carry all S samples ([B, S, A, C]): at 48 samples they, not the trunk,
        # are the largest saved term below ~300 tokens.
        self.use_checkpoint = use_checkpoint

    def pair_biases(self, p: torch.Tensor) -> torch.Tensor:
        """Every block's attention bias from the atom pair ``p [B, K, n_q, n_k, C_ap]``:
        ``[no_blocks, B, K, H, n_q, n_k]``. They depend on ``p`` alone, so the sampler makes
        them once per prediction (``DiffusionModule.prepare``), not once per step."""
        return stack_as_made([functools.partial(attn.bias_from_pair, p)
                              for attn in self.attention])

    def forward(
        self, q: torch.Tensor, c: torch.Tensor, p: torch.Tensor, win: AtomWindows,
        biases: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``biases``: :meth:`pair_biases` of ``p``, made beforehand (else each block makes its
        own from ``p``)."""
        c_q = win.queries(c).unsqueeze(-3)  # [B, K, 1, n_q, C]: shared by the samples
        c_all = c.unsqueeze(1)  # [B, 1, A, C]
        mask = win.key_valid.unsqueeze(-2).expand(-1, -1, q.shape[1], -1)  # [B, K, S, n_k]
        recompute = self.use_checkpoint and self.training and torch.is_grad_enabled()
        for i, (attn, trans) in enumerate(zip(self.attention, self.transition)):
            block = functools.partial(self._block, attn, trans, win)
            bias = None if biases is None else biases[i]
            if recompute:
                q = checkpoint(block, q, c_q, c_all, mask, p, bias, use_reentrant=False)
            else:
                q = block(q, c_q, c_all, mask, p, bias)
        return q

    @staticmethod
    def _block(attn, trans, win: AtomWindows, q, c_q, c_all, mask, p, bias=None
               ) -> torch.Tensor:
        if bias is None:
            bias = attn.bias_from_pair(p)  # [B, K, H, n_q, n_k]
        x = attn.normalize(q, c_all)  # [B, S, A, C]
        x_kv = attn.normalize_keys(q, x, c_all)  # [B, S, A, C]
        x_q = win.queries(x).transpose(1, 2)  # [B, K, S, n_q, C]
        if torch.is_grad_enabled():
            x_k = win.keys_by_window(x_kv)  # [B, K, S, n_k, C]
            out = attn.attend(x_q, x_k, mask, bias, c_q)  # [B, K, S, n_q, C]
        else:  # inference: k and v projected once per atom (each atom is in n_k / n_q key
            # windows), the windows read as overlapping views of the projections: no gather
            x_p = win.pad_keys(x_kv)  # [B, S, L, C]
            k = win.key_windows(attn.mha.linear_k(x_p))  # [B, K, S, n_k, C]
            v = win.key_windows(attn.mha.linear_v(x_p))
            out = attn.attend_projected(x_q, k, v, mask, bias, c_q)  # [B, K, S, n_q, C]
        q = win.add_windows(q, out)  # [B, S, A, C]
        return q + trans(q, c_all)


class AtomAttentionEncoder(nn.Module):
    """Alg. 5. ``forward(feats, r, s_trunk, z) -> (a, q_skip, c_skip, p_skip, windows)``.

    ``r: [B, S, A, 3]`` noisy positions (None in the input embedder); ``s_trunk: [B, N, C_s]`` and
    ``z: [B, N, N, C_z]`` (both None in the input embedder). Returns token activations
    ``a: [B, S, N, C_token]`` (S = 1 without ``r``), ``q_skip [B, S, A, C_atom]``,
    ``c_skip [B, A, C_atom]``, ``p_skip [B, K, n_q, n_k, C_ap]``.
    """

    def __init__(self, cfg, c_token: int, c_s: int | None = None, c_z: int | None = None) -> None:
        super().__init__()
        c_atom, c_ap = cfg.c_atom, cfg.c_atompair
        self.cfg = cfg
        self.linear_feat = Linear(ATOM_FEAT_DIM, c_atom, bias=False)
        self.linear_d = Linear(3, c_ap, bias=False)
        self.linear_inv_d = Linear(1, c_ap, bias=False)
        self.linear_v = Linear(1, c_ap, bias=False)
        self.trunk = c_s is not None
        if self.trunk:
            self.layer_norm_s = LayerNorm(c_s)
            self.linear_s = Linear(c_s, c_atom, bias=False)
            self.layer_norm_z = LayerNorm(c_z)
            self.linear_z = Linear(c_z, c_ap, bias=False)
            self.linear_r = Linear(3, c_atom, bias=False)
        self.linear_c_q = Linear(c_atom, c_ap, bias=False)
        self.linear_c_k = Linear(c_atom, c_ap, bias=False)
        self.pair_mlp = nn.Sequential(
            nn.ReLU(), Linear(c_ap, c_ap, bias=False, init="relu"),
            nn.ReLU(), Linear(c_ap, c_ap, bias=False, init="relu"),
            nn.ReLU(), Linear(c_ap, c_ap, bias=False, init="final"),
        )
        self.transformer = AtomTransformer(c_atom, c_ap, cfg.no_blocks, cfg.no_heads,
                                           key_norm=cfg.key_norm)
        self.linear_out = Linear(c_atom, c_token, bias=False, init="relu")

    def windows(self, feats: dict[str, torch.Tensor]) -> AtomWindows:
        return AtomWindows(feats["atom_mask"], self.cfg.n_queries, self.cfg.n_keys)

    def forward(
        self,
        feats: dict[str, torch.Tensor],
        r: torch.Tensor | None = None,
        s_trunk: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        cond: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AtomWindows]:
        """``cond``: :meth:`condition` of the same ``feats``, ``s_trunk`` and ``z``, made
        beforehand (the sampler's steps share it), optionally with ``"biases"``: the
        transformer's ``pair_biases`` of its ``"p"``."""
        win = self.windows(feats)
        if cond is None:
            cond = self.condition(feats, s_trunk, z, win)
        c, p = cond["c"], cond["p"]
        q = c.unsqueeze(1)  # [B, 1, A, C_atom]
        if self.trunk:
            q = q + self.linear_r(r)  # [B, S, A, C_atom]
        q = self.transformer(q, c, p, win, cond.get("biases"))
        n_token = feats["token_mask"].shape[-1]
        tok = feats["atom_to_token"].long()  # [B, A]
        a = mean_over_atoms(torch.relu(self.linear_out(q)), tok, feats["atom_mask"], n_token)
        return a, q, c, p, win

    def condition(
        self,
        feats: dict[str, torch.Tensor],
        s_trunk: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        win: AtomWindows | None = None,
    ) -> dict[str, torch.Tensor]:
        """Alg. 5 but the noisy positions' term: ``{"c": [B, A, C_atom], "p": [B, K, n_q, n_k,
        C_ap]}``, the atom single and pair conditioning. They depend on the features and the
        trunk only, so every sampler step of a prediction shares them."""
        dtype = self.linear_feat.weight.dtype
        win = self.windows(feats) if win is None else win
        # Atoms outside the reference conformer get no conditioning (AF3's and Protenix's code:
        # ``act *= ref_mask``).
        c = self.linear_feat(atom_features(feats, dtype))  # [B, A, C_atom]
        c = c * feats["ref_mask"].to(dtype)[..., None]
        # Pairs inside one reference conformer (same ref_space_uid, real atoms): Alg. 5 lines 2-6.
        uid = feats["ref_space_uid"][..., None]  # [B, A, 1]
        pos = feats["ref_pos"].to(dtype)  # [B, A, 3]
        d = win.pair(win.queries(pos), win.keys(pos))  # [B, K, n_q, n_k, 3]
        same = win.pair(win.queries(uid), win.keys(uid)) == 0  # [B, K, n_q, n_k, 1]
        v = (same & win.query_valid[..., :, None, None] & win.key_valid[..., None, :, None])
        v = v.to(dtype)
        p = self.linear_d(d) * v
        p = p + self.linear_inv_d(1.0 / (1.0 + d.square().sum(-1, keepdim=True))) * v
        p = p + self.linear_v(v) * v  # [B, K, n_q, n_k, C_ap]
        tok = feats["atom_to_token"].long()  # [B, A]
        if self.trunk:
            c = c + gather_tokens(self.linear_s(self.layer_norm_s(s_trunk)), tok)
            zp = self.linear_z(self.layer_norm_z(z))  # [B, N, N, C_ap]: project, then gather
            n = zp.shape[-2]
            pair_idx = win.queries(tok[..., None]) * n + win.keys(tok[..., None]).transpose(-1, -2)
            p = p + gather_tokens(zp.flatten(1, 2), pair_idx)  # [B, K, n_q, n_k, C_ap]
        relu_c = torch.relu(c)
        p = p + self.linear_c_q(win.queries(relu_c)).unsqueeze(-2)
        p = p + self.linear_c_k(win.keys(relu_c)).unsqueeze(-3)
        p = p + self.pair_mlp(p)
        return {"c": c, "p": p}


class AtomAttentionDecoder(nn.Module):
    """Alg. 6: broadcast tokens to atoms, the atom transformer, ``LinearNoBias(LN(q))`` -> 3.

    ``a: [B, S, N, C_token]`` -> position updates ``[B, S, A, 3]``."""

    def __init__(self, cfg, c_token: int) -> None:
        super().__init__()
        self.linear_a = Linear(c_token, cfg.c_atom, bias=False)
        self.transformer = AtomTransformer(cfg.c_atom, cfg.c_atompair, cfg.no_blocks, cfg.no_heads,
                                           key_norm=cfg.key_norm)
        self.layer_norm = LayerNorm(cfg.c_atom)
        self.linear_out = Linear(cfg.c_atom, 3, bias=False, init="final")

    def forward(
        self,
        a: torch.Tensor,
        q_skip: torch.Tensor,
        c_skip: torch.Tensor,
        p_skip: torch.Tensor,
        win: AtomWindows,
        atom_to_token: torch.Tensor,
        biases: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``biases``: the transformer's ``pair_biases`` of ``p_skip``, made beforehand."""
        tok = atom_to_token.long()[:, None, :].expand(a.shape[0], a.shape[1], -1)  # [B, S, A]
        a_atoms = torch.gather(a, 2, tok[..., None].expand(-1, -1, -1, a.shape[-1]))
        q = self.linear_a(a_atoms) + q_skip  # [B, S, A, C_atom]
        q = self.transformer(q, c_skip, p_skip, win, biases)
        return self.linear_out(self.layer_norm(q))


class InputFeatureEmbedder(nn.Module):
    """Alg. 2: ``s_inputs = concat(AtomAttentionEncoder(f), restype, profile, deletion_mean)``
    -> ``[B, N, C_token + 65]``."""

    def __init__(self, cfg, c_token: int) -> None:
        super().__init__()
        self.encoder = AtomAttentionEncoder(cfg, c_token)

    def forward(self, feats: dict[str, torch.Tensor]) -> torch.Tensor:
        a = self.encoder(feats)[0].squeeze(1)  # [B, N, C_token]
        dtype = a.dtype
        return torch.cat([
            a,
            nn.functional.one_hot(feats["restype"].long(), 32).to(dtype),
            feats["profile"].to(dtype),
            feats["deletion_mean"].to(dtype)[..., None],
        ], dim=-1)
