"""Test helpers for the AF2 trunk tests: random re-initialisation and inputs with holes.

AF2's 'final' and 'gating' inits make many outputs trivially zero or constant; tests re-draw every
parameter so that a wrong path can be told from a right one.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Re-draw every parameter: weights ~ N(0, 1/fan_in), vectors ~ 1 + 0.2 N or 0.2 N."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                p.copy_(r / p.shape[-1] ** 0.5)
            elif name.endswith("weight"):  # LayerNorm gains
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
    """Relative norm error ``|a - b| / |b|`` in float64; NaN anywhere gives inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return float("inf")
    return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item()


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameter gradients by name (zeros where a parameter got none)."""
    return {
        n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }


MODEL_INPUTS = (
    "aatype", "residue_index", "seq_mask", "target_feat", "msa_feat", "msa_mask",
    "extra_msa", "extra_has_deletion", "extra_deletion_value", "extra_msa_mask",
    "template_mask", "template_aatype", "template_all_atom_positions",
    "template_all_atom_mask", "template_pseudo_beta", "template_pseudo_beta_mask",
    "template_torsion_angles_sin_cos", "template_alt_torsion_angles_sin_cos",
    "template_torsion_angles_mask",
)


def make_batch(
    b: int = 1, r: int = 2, n_res: int = 9, n_clust: int = 5, n_extra: int = 7,
    n_templ: int = 2, seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A random batch with the fold-data SAMPLE_FEATURES names, dtypes and shapes ``[B, R, ...]``
    (model inputs only), with padded residues, cluster rows and one absent template."""
    g = torch.Generator().manual_seed(seed)
    f32, i32 = torch.float32, torch.int32

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    def mask(*shape, p=0.2):
        return (torch.rand(*shape, generator=g) > p).to(f32)

    seq_mask = torch.ones(b, r, n_res)
    seq_mask[..., -2:] = 0.0  # two padded residues
    aatype = torch.randint(0, 21, (b, r, n_res), generator=g).to(i32)
    aatype[..., 1] = 7  # a glycine (pseudo-beta = CA)
    target_feat = torch.nn.functional.one_hot(aatype.long(), 22).to(f32)
    residue_index = torch.cumsum(torch.randint(1, 3, (b, r, n_res), generator=g), -1).to(i32)
    msa_mask = mask(b, r, n_clust, n_res) * seq_mask[:, :, None]
    msa_mask[:, :, 0] = seq_mask  # the query row is real
    msa_mask[:, :, -1] = 0.0  # a padding row
    extra_mask = mask(b, r, n_extra, n_res) * seq_mask[:, :, None]
    templ_mask = torch.ones(b, r, n_templ)
    templ_mask[..., -1] = 0.0
    atom_pos = rnd(b, r, n_templ, n_res, 37, 3) * 3.0 + 3.8 * torch.arange(n_res)[:, None, None]
    atom_mask = mask(b, r, n_templ, n_res, 37, p=0.1) * templ_mask[..., None, None]
    tors = rnd(b, r, n_templ, n_res, 7, 2)
    tors = tors / tors.norm(dim=-1, keepdim=True)
    return {
        "aatype": aatype,
        "residue_index": residue_index,
        "seq_mask": seq_mask,
        "target_feat": target_feat,
        "msa_feat": torch.cat(
            [torch.nn.functional.one_hot(torch.randint(0, 23, (b, r, n_clust, n_res),
                                                       generator=g), 23).to(f32),
             mask(b, r, n_clust, n_res, 2, p=0.5), torch.rand(b, r, n_clust, n_res, 24,
                                                                 generator=g)], -1),
        "msa_mask": msa_mask,
        "extra_msa": torch.randint(0, 23, (b, r, n_extra, n_res), generator=g).to(i32),
        "extra_has_deletion": mask(b, r, n_extra, n_res, p=0.7),
        "extra_deletion_value": torch.rand(b, r, n_extra, n_res, generator=g),
        "extra_msa_mask": extra_mask,
        "template_mask": templ_mask,
        "template_aatype": torch.randint(0, 22, (b, r, n_templ, n_res), generator=g).to(i32),
        "template_all_atom_positions": atom_pos,
        "template_all_atom_mask": atom_mask,
        "template_pseudo_beta": atom_pos[..., 3, :],
        "template_pseudo_beta_mask": atom_mask[..., 3],
        "template_torsion_angles_sin_cos": tors,
        "template_alt_torsion_angles_sin_cos": -tors,
        "template_torsion_angles_mask": mask(b, r, n_templ, n_res, 7) * templ_mask[..., None, None],
    }
