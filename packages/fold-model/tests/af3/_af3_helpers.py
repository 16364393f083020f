"""Helpers for the AF3 model tests: random re-initialisation, masks with holes, errors, and a
random AF3 feature batch in the fold-data ``SAMPLE_FEATURES`` layout.

AF3's zero ('final') and gate inits make many outputs trivially zero; tests re-draw every
parameter so that a wrong path can be told from a right one.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_(module: nn.Module, seed: int = 0, scale: float = 1.0) -> nn.Module:
    """Re-draw every parameter: weights ~ N(0, scale / fan_in), gains 1 + 0.2 N, biases 0.2 N."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                p.copy_(r * (scale / p.shape[-1]) ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(0.2 * r)
    return module


def holes(shape: tuple[int, ...], p_hole: float = 0.3, seed: int = 0) -> torch.Tensor:
    """A float 0/1 mask with random holes (position 0 of the last dim kept real)."""
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(shape, generator=gen) > p_hole).float()
    mask[..., 0] = 1.0
    return mask


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in float64; NaN or inf anywhere gives inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return float("inf")
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }


def random_features(
    n_token: int = 7, n_atom_per_token: int = 3, n_msa: int = 5, n_templ: int = 2,
    batch: int = 1, seed: int = 0, n_pad_token: int = 1, n_pad_atom: int = 2,
) -> dict[str, torch.Tensor]:
    """A random AF3 feature batch (SAMPLE_FEATURES names, leading ``B``): two chains of protein
    tokens with ``n_atom_per_token`` atoms each, the last real token a one-atom ligand bonded to
    the token before it, then ``n_pad_token`` padding tokens and ``n_pad_atom`` padding atoms."""
    g = torch.Generator().manual_seed(seed)
    n_real = n_token
    N = n_real + n_pad_token
    per = [n_atom_per_token] * (n_real - 1) + [1]
    atom_to_token = torch.cat([torch.full((k,), i) for i, k in enumerate(per)])
    A_real = int(atom_to_token.numel())
    A = A_real + n_pad_atom

    def pad_tok(x: torch.Tensor, fill: float = 0) -> torch.Tensor:
        out = torch.full((N, *x.shape[1:]), fill, dtype=x.dtype)
        out[:n_real] = x
        return out

    def pad_atom(x: torch.Tensor, fill: float = 0) -> torch.Tensor:
        out = torch.full((A, *x.shape[1:]), fill, dtype=x.dtype)
        out[:A_real] = x
        return out

    half = (n_real - 1) // 2
    asym = torch.tensor([0] * half + [1] * (n_real - 1 - half) + [2])
    residue_index = torch.cat([torch.arange(half), torch.arange(n_real - 1 - half), torch.zeros(1)])
    is_ligand = torch.zeros(n_real, dtype=torch.int32)
    is_ligand[-1] = 1
    restype = torch.randint(0, 20, (n_real,), generator=g)
    restype[-1] = 20
    first = torch.cumsum(torch.tensor([0] + per[:-1]), 0)
    center = first + torch.tensor([min(1, k - 1) for k in per])  # the second atom (CA-like)
    # representative atom: the third (CB-like), the centre for every third token (glycine-like)
    # and for the one-atom ligand token
    rep = first + torch.tensor([min(1 if i % 3 == 0 else 2, k - 1) for i, k in enumerate(per)])
    true_pos = torch.randn(A_real, 3, generator=g) * 6.0
    ref_pos = torch.randn(A_real, 3, generator=g) * 1.5
    bonds = torch.zeros(N, N)
    bonds[n_real - 2, n_real - 1] = bonds[n_real - 1, n_real - 2] = 1.0
    msa = torch.randint(0, 32, (n_msa, N), generator=g)
    msa_mask = torch.zeros(n_msa, N)
    msa_mask[:, :n_real] = holes((n_msa, n_real), seed=seed + 1)
    f = {
        "residue_index": pad_tok(residue_index).int(),
        "token_index": pad_tok(torch.arange(n_real)).int(),
        "asym_id": pad_tok(asym).int(),
        "entity_id": pad_tok(torch.tensor([0] * (n_real - 1) + [1])).int(),
        "sym_id": pad_tok(torch.tensor([0] * half + [1] * (n_real - 1 - half) + [0])).int(),
        "restype": pad_tok(restype, 31).int(),
        "is_protein": pad_tok(1 - is_ligand).int(),
        "is_rna": torch.zeros(N, dtype=torch.int32),
        "is_dna": torch.zeros(N, dtype=torch.int32),
        "is_ligand": pad_tok(is_ligand).int(),
        "is_atomized": pad_tok(is_ligand).int(),
        "token_center_atom": pad_tok(center).int(),
        "token_pseudo_beta_atom": pad_tok(rep).int(),
        "token_mask": pad_tok(torch.ones(n_real)),
        "ref_pos": pad_atom(ref_pos),
        "ref_mask": pad_atom(torch.ones(A_real)),
        "ref_element": pad_atom(torch.randint(1, 17, (A_real,), generator=g)).int(),
        "ref_charge": pad_atom(torch.randint(-1, 2, (A_real,), generator=g).float()),
        "ref_atom_name_chars": pad_atom(torch.randint(0, 64, (A_real, 4), generator=g)).int(),
        "ref_space_uid": pad_atom(atom_to_token).int(),
        "ref_pos_source": torch.zeros(A, dtype=torch.int32),
        "atom_to_token": pad_atom(atom_to_token).int(),
        "atom_positions": pad_atom(true_pos),
        "atom_resolved": pad_atom(holes((A_real,), p_hole=0.1, seed=seed + 2)),
        "atom_mask": pad_atom(torch.ones(A_real)),
        "token_bonds": bonds,
        "msa": msa.int(),
        "has_deletion": (torch.rand(n_msa, N, generator=g) > 0.7).float() * msa_mask,
        "deletion_value": torch.rand(n_msa, N, generator=g) * msa_mask,
        "msa_mask": msa_mask,
        "profile": torch.softmax(torch.randn(N, 32, generator=g), -1),
        "deletion_mean": torch.rand(N, generator=g),
        "template_restype": torch.randint(0, 32, (n_templ, N), generator=g).int(),
        "template_pseudo_beta": torch.randn(n_templ, N, 3, generator=g) * 6,
        "template_pseudo_beta_mask": holes((n_templ, N), seed=seed + 3),
        "template_backbone": torch.randn(n_templ, N, 3, 3, generator=g) * 6,
        "template_backbone_mask": holes((n_templ, N), seed=seed + 4),
        "template_mask": torch.tensor([1.0] * (n_templ - 1) + [0.0]),
        "resolution": torch.tensor(2.0),
    }
    return {k: v.unsqueeze(0).expand(batch, *v.shape).clone() for k, v in f.items()}
