"""Parity of fold's AF3 modules with Protenix 2.0's, module by module, with Protenix's weights
mapped by fold_model.af3.params_protenix.

Protenix is installed from its wheel (``nox -s tests`` installs it pinned, without its CUDA
dependencies); its modules are built at tiny sizes in float64 with random weights (every
parameter drawn, also those Protenix initialises to zero), the same random inputs go through
both, and outputs and every gradient (inputs and parameters, mapped through the same renaming)
agree within float64 round-off: relative error < 1e-10 (the two compute the same sums in
different orders and groupings; float64 round-off over a few hundred terms is ~1e-14 relative,
and 1e-10 still fails on any real difference, which shows up at 1e-3 or more).

Masks: Protenix never pads tokens, atoms or MSA rows at inference (its attention with pair bias,
MSA pair-weighted averaging and outer product mean take no mask), so fold's token, atom and MSA
masks are all ones here; the pair masks that Protenix's triangle updates do take have holes.
"""

from __future__ import annotations

import inspect
import os
import textwrap

import pytest
import torch

os.environ.setdefault("LAYERNORM_TYPE", "torch")  # Protenix's LayerNorm without its CUDA build
pytest.importorskip("protenix", reason="protenix not installed (nox -s tests installs it)")

from fold_model.af3.confidence import ConfidenceHead  # noqa: E402
from fold_model.af3.config import config  # noqa: E402
from fold_model.af3.diffusion import DiffusionModule  # noqa: E402
from fold_model.af3.msa_module import MSAModule, msa_features  # noqa: E402
from fold_model.af3.pairformer import PairformerStack  # noqa: E402
from fold_model.af3.params_protenix import convert_protenix_module  # noqa: E402
from fold_model.af3.template import TemplateEmbedder, template_pair_features  # noqa: E402

TOL = 1e-10
C_S, C_Z, C_ATOM, C_ATOMPAIR, C_TOKEN_IN, C_TOKEN = 32, 16, 16, 8, 24, 32
C_SI = C_TOKEN_IN + 65


@pytest.fixture(autouse=True)
def protenix_attention_in_input_dtype(monkeypatch):
    """Protenix's attention with pair bias (``primitives._attention``) casts q, k and the bias to
    float32 whatever the input dtype (a precision choice for its bf16 training): here it runs
    in float64 like everything else, with the same formula (its non-fused branch without the
    casts: ``softmax(q k^T + bias) v``, q already scaled)."""
    from protenix.model.modules import primitives

    def attention(q, k, v, attn_bias=None, use_efficient_implementation=True,
                  inplace_safe=False):
        logits = q @ k.transpose(-1, -2)
        if attn_bias is not None:
            logits = logits + attn_bias
        return torch.softmax(logits, dim=-1) @ v

    monkeypatch.setattr(primitives, "_attention", attention)
    # Likewise the explicit float32 casts of DiffusionModule.f_forward and of the confidence
    # head's per-sample forward: the same code, its casts to float64 instead.
    from protenix.model.modules.confidence import ConfidenceHead as PxConfidenceHead
    from protenix.model.modules.diffusion import DiffusionModule as PxDiffusionModule

    for cls, name in ((PxDiffusionModule, "f_forward"),
                      (PxConfidenceHead, "memory_efficient_forward")):
        fn = getattr(cls, name)
        src = textwrap.dedent(inspect.getsource(fn)).replace("torch.float32", "torch.float64")
        namespace = dict(fn.__globals__)
        # protenix.model.utils.one_hot ends in .float(): the distance one-hot in float64 here
        namespace["one_hot"] = lambda x, lower_bins, upper_bins: (
            (x[..., None] > lower_bins) & (x[..., None] < upper_bins)).to(x.dtype)
        exec(compile(src, inspect.getsourcefile(fn), "exec"), namespace)  # noqa: S102
        monkeypatch.setattr(cls, name, namespace[name])


def full_precision(module: torch.nn.Module) -> torch.nn.Module:
    """Protenix's Linear layers with ``precision=torch.float32`` compute in float32 whatever the
    input: here in the input's dtype (float64)."""
    for m in module.modules():
        if getattr(m, "precision", None) is not None:
            m.precision = None
    return module


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().detach() / b.abs().max().detach().clamp_min(1e-300))


def fold_config(**over):
    """fold's config at the sizes of the Protenix modules below (Protenix's fixed hidden sizes:
    triangle multiplication 128, triangle attention 4 x 32, MSA pair averaging 8 x 8)."""
    cfg = config("af3", c_s=C_S, c_z=C_Z, c_token_input=C_TOKEN_IN, checkpoint=False,
                 z_init_from="s_init", atom__c_atom=C_ATOM, atom__c_atompair=C_ATOMPAIR,
                 atom__no_blocks=2, atom__key_norm="query", pairformer__no_blocks=2,
                 pairformer__dropout=0.0, msa__c_m=12, msa__no_blocks=2,
                 msa__c_hidden_pair_avg=8, msa__msa_dropout=0.0, msa__pair_dropout=0.0,
                 diffusion__c_token=C_TOKEN, diffusion__no_blocks=2, diffusion__no_heads=4,
                 confidence__no_blocks=1, confidence__variant="protenix", **over)
    return cfg


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn ~ N(0, 1/fan_in) (Protenix zero-initialises many), float64."""
    g = torch.Generator().manual_seed(seed)
    module = full_precision(module.double())
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("fourier_embedding.w") or name.endswith("fourier_embedding.b") \
                    or name.endswith("_bins"):
                continue  # frozen constants, copied as they are
            fan = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / fan**0.5)
            if name.endswith("weight") and p.dim() == 1:  # LayerNorm scales around 1
                p.add_(1.0)
    return module


def load_mapped(kind: str, theirs: torch.nn.Module, ours: torch.nn.Module, cfg):
    state, filled = convert_protenix_module(kind, theirs.state_dict(), cfg, ours.state_dict())
    ours.load_state_dict(state, strict=True)
    return filled


def compare_grads(kind: str, theirs, ours, cfg, filled: set[str]) -> None:
    """Every parameter gradient of Protenix's module, mapped into fold's names like its weights,
    equals fold's."""
    grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p))
             for k, p in theirs.named_parameters()}
    grads.update({k: v for k, v in theirs.state_dict().items() if k not in grads})  # buffers
    mapped, _ = convert_protenix_module(kind, grads, cfg, ours.state_dict())
    # Errors relative to the largest gradient of the module: some gradients are zero in exact
    # arithmetic (e.g. a bias shared by every key of a softmax) and round-off in both.
    scale = max(float(v.abs().max()) for v in mapped.values())
    checked = 0
    for name, p in ours.named_parameters():
        if name in filled or not p.requires_grad:
            continue
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        err = float((g - mapped[name]).abs().max()) / scale
        assert err < TOL, (name, err)
        checked += 1
    assert checked > 10


def pair_mask_with_holes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(n, n, generator=g) > 0.15).double()
    m[0] = 1
    return m


# -- Pairformer -----------------------------------------------------------------------------------

def test_pairformer_stack_matches_protenix():
    from protenix.model.modules.pairformer import PairformerStack as PxPairformerStack

    cfg = fold_config()
    n = 11
    theirs = randomize(PxPairformerStack(n_blocks=2, n_heads=16, c_z=C_Z, c_s=C_S, dropout=0.0), 1)
    ours = PairformerStack(cfg.pairformer, C_S, C_Z).double()
    filled = load_mapped("pairformer", theirs, ours, cfg)
    g = torch.Generator().manual_seed(2)
    s = torch.randn(n, C_S, generator=g, dtype=torch.float64)
    z = torch.randn(n, n, C_Z, generator=g, dtype=torch.float64)
    pair_mask = pair_mask_with_holes(n, 3)
    leaves_t = [s.clone().requires_grad_(), z.clone().requires_grad_()]
    leaves_o = [s.clone().requires_grad_(), z.clone().requires_grad_()]
    s_t, z_t = theirs(leaves_t[0], leaves_t[1], pair_mask)
    s_o, z_o = ours(leaves_o[0][None], leaves_o[1][None], torch.ones(1, n, dtype=torch.float64),
                    pair_mask[None])
    assert rel_err(s_o[0], s_t) < TOL and rel_err(z_o[0], z_t) < TOL
    g_s = torch.randn(s_t.shape, generator=g, dtype=torch.float64)
    g_z = torch.randn(z_t.shape, generator=g, dtype=torch.float64)
    ((s_t * g_s).sum() + (z_t * g_z).sum()).backward()
    ((s_o[0] * g_s).sum() + (z_o[0] * g_z).sum()).backward()
    for a, b in zip(leaves_o, leaves_t):
        assert rel_err(a.grad, b.grad) < TOL
    compare_grads("pairformer", theirs, ours, cfg, filled)
    # Protenix's inference path (eval: its chunked transitions) gives the same outputs
    with torch.no_grad():
        s_e, z_e = theirs.eval()(s, z, pair_mask)
        s_f, z_f = ours.eval()(s[None], z[None], torch.ones(1, n, dtype=torch.float64),
                               pair_mask[None])
    assert rel_err(s_f[0], s_e) < TOL and rel_err(z_f[0], z_e) < TOL


# -- MSA module -----------------------------------------------------------------------------------

def test_msa_module_matches_protenix():
    from protenix.model.modules.pairformer import MSAModule as PxMSAModule

    cfg = fold_config()
    n, n_msa = 9, 7
    full = {"train": n_msa, "test": n_msa}  # every row, in order (Protenix samples otherwise)
    theirs = randomize(PxMSAModule(
        n_blocks=2, c_m=12, c_z=C_Z, c_s_inputs=C_SI, msa_dropout=0.0, pair_dropout=0.0,
        blocks_per_ckpt=None,
        msa_configs={"enable": True, "strategy": "topk", "sample_cutoff": full,
                     "min_size": full}), 4)
    ours = MSAModule(cfg.msa, C_Z, C_SI).double()
    filled = load_mapped("msa_module", theirs, ours, cfg)
    g = torch.Generator().manual_seed(5)
    msa = torch.randint(0, 32, (n_msa, n), generator=g)
    has_del = (torch.rand(n_msa, n, generator=g) > 0.7).double()
    del_val = torch.rand(n_msa, n, generator=g, dtype=torch.float64) * has_del
    z = torch.randn(n, n, C_Z, generator=g, dtype=torch.float64)
    s_inputs = torch.randn(n, C_SI, generator=g, dtype=torch.float64)
    pair_mask = pair_mask_with_holes(n, 6)
    feats = {"msa": msa, "has_deletion": has_del, "deletion_value": del_val}
    z_t_in, z_o_in = z.clone().requires_grad_(), z.clone().requires_grad_()
    si_t, si_o = s_inputs.clone().requires_grad_(), s_inputs.clone().requires_grad_()
    z_t = theirs(dict(feats), z_t_in, si_t, pair_mask)
    ones = torch.ones(1, n, dtype=torch.float64)
    z_o = ours(msa_features(msa, has_del, del_val)[None], z_o_in[None], si_o[None],
               torch.ones(1, n_msa, n, dtype=torch.float64), pair_mask[None], ones)[0]
    assert rel_err(z_o, z_t) < TOL
    g_z = torch.randn(z_t.shape, generator=g, dtype=torch.float64)
    (z_t * g_z).sum().backward()
    (z_o * g_z).sum().backward()
    assert rel_err(z_o_in.grad, z_t_in.grad) < TOL
    assert rel_err(si_o.grad, si_t.grad) < TOL
    compare_grads("msa_module", theirs, ours, cfg, filled)
    with torch.no_grad():  # Protenix's inference path (in-place MSA updates in chunks)
        z_e = theirs.eval()(dict(feats), z.clone(), s_inputs, pair_mask)
        z_f = ours.eval()(msa_features(msa, has_del, del_val)[None], z[None], s_inputs[None],
                          torch.ones(1, n_msa, n, dtype=torch.float64), pair_mask[None], ones)[0]
    assert rel_err(z_f, z_e) < TOL


# -- template embedder ----------------------------------------------------------------------------

def test_template_embedder_matches_protenix():
    """Protenix's template embedder takes its featurizer's pair features; they are given here
    from fold's (``template_pair_features``) in Protenix's layout, so that the network and the
    importer's reordering of the input projection are what is compared."""
    from protenix.model.modules.pairformer import TemplateEmbedder as PxTemplateEmbedder

    cfg = fold_config(template__c_t=10, template__no_blocks=1, template__c_hidden_mul=128,
                      template__c_hidden_tri_att=32, template__dropout=0.0)
    n, t = 10, 2
    theirs = randomize(PxTemplateEmbedder(n_blocks=1, c=10, c_z=C_Z, dropout=0.0), 11)
    ours = TemplateEmbedder(cfg.template, C_Z).double()
    filled = load_mapped("template_embedder", theirs, ours, cfg)
    g = torch.Generator().manual_seed(12)
    asym = torch.tensor([0] * 6 + [1] * 4)
    feats = {
        "template_restype": torch.randint(0, 32, (1, t, n), generator=g),
        "template_pseudo_beta": torch.randn(1, t, n, 3, generator=g, dtype=torch.float64) * 8,
        "template_pseudo_beta_mask": (torch.rand(1, t, n, generator=g) > 0.2).double(),
        "template_backbone": torch.randn(1, t, n, 3, 3, generator=g, dtype=torch.float64) * 8,
        "template_backbone_mask": (torch.rand(1, t, n, generator=g) > 0.2).double(),
        "asym_id": asym[None], "template_mask": torch.ones(1, t, dtype=torch.float64),
    }
    a = template_pair_features(
        feats["template_restype"], feats["template_pseudo_beta"],
        feats["template_pseudo_beta_mask"], feats["template_backbone"],
        feats["template_backbone_mask"], feats["asym_id"])[0]  # [T, N, N, 108]
    px = {"asym_id": asym, "template_aatype": feats["template_restype"][0],
          "template_distogram": a[..., :39], "template_pseudo_beta_mask": a[..., 39],
          "template_unit_vector": a[..., 40:43], "template_backbone_frame_mask": a[..., 43]}
    z = torch.randn(n, n, C_Z, generator=g, dtype=torch.float64)
    z_t, z_o = z.clone().requires_grad_(), z.clone().requires_grad_()
    u_t = theirs(px, z_t)
    u_o = ours(feats, z_o[None], torch.ones(1, n, n, dtype=torch.float64))[0]
    assert rel_err(u_o, u_t) < TOL
    g_u = torch.randn(u_t.shape, generator=g, dtype=torch.float64)
    (u_t * g_u).sum().backward()
    (u_o * g_u).sum().backward()
    assert rel_err(z_o.grad, z_t.grad) < TOL
    compare_grads("template_embedder", theirs, ours, cfg, filled)


# -- atoms and tokens shared by the diffusion and confidence tests --------------------------------

def _structure(seed: int):
    """Tokens with 1-9 atoms (ligand-like one-atom tokens among them), 2 chains; about 70
    atoms, so that Protenix's 32-atom query windows and 128-atom key windows overhang both ends."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(x) for x in torch.randint(1, 10, (14,), generator=g)]
    n, a = len(sizes), sum(sizes)
    atom_to_token = torch.repeat_interleave(torch.arange(n), torch.tensor(sizes))
    asym = torch.tensor([0] * 8 + [1] * 6)
    feats = {
        "asym_id": asym, "entity_id": torch.tensor([0] * 8 + [1] * 6),
        "sym_id": torch.zeros(n, dtype=torch.long),
        "residue_index": torch.cat([torch.arange(8), torch.arange(6)]),
        "token_index": torch.arange(n),
        "atom_to_token": atom_to_token,
        "ref_pos": torch.randn(a, 3, generator=g, dtype=torch.float64) * 3,
        "ref_charge": torch.randint(-1, 2, (a,), generator=g).double(),
        "ref_mask": torch.ones(a, dtype=torch.float64),
        "ref_element": torch.randint(1, 20, (a,), generator=g),
        "ref_atom_name_chars": torch.randint(0, 64, (a, 4), generator=g),
        "ref_space_uid": atom_to_token.clone(),
    }
    feats["ref_space_uid"][atom_to_token >= 10] = 10  # one conformer spanning tokens
    return feats, n, a, g


def _protenix_atom_feats(f, n):
    """The same atoms in Protenix's input format (one-hots, relp, the trunked pair features)."""
    from protenix.model.modules.embedders import RelativePositionEncoding
    from protenix.model.protenix import update_input_feature_dict

    px = {
        "asym_id": f["asym_id"], "entity_id": f["entity_id"], "sym_id": f["sym_id"],
        "residue_index": f["residue_index"], "token_index": f["token_index"],
        "atom_to_token_idx": f["atom_to_token"], "ref_pos": f["ref_pos"],
        "ref_charge": f["ref_charge"], "ref_mask": f["ref_mask"],
        "ref_element": torch.nn.functional.one_hot(f["ref_element"], 128).double(),
        "ref_atom_name_chars": torch.nn.functional.one_hot(f["ref_atom_name_chars"], 64).double(),
        "ref_space_uid": f["ref_space_uid"],
    }
    px = RelativePositionEncoding().generate_relp(px)
    px["relp"] = px["relp"].double()
    return update_input_feature_dict(px)


def _batch(f, n, a):
    """fold's batch: a leading batch dim, every token and atom real."""
    out = {k: v[None] for k, v in f.items()}
    out["token_mask"] = torch.ones(1, n, dtype=torch.float64)
    out["atom_mask"] = torch.ones(1, a, dtype=torch.float64)
    return out


# -- diffusion module -----------------------------------------------------------------------------

def test_diffusion_module_matches_protenix():
    from protenix.model.modules.diffusion import DiffusionModule as PxDiffusionModule

    cfg = fold_config()
    f, n, a, g = _structure(7)
    n_sample = 3
    theirs = randomize(PxDiffusionModule(
        c_atom=C_ATOM, c_atompair=C_ATOMPAIR, c_token=C_TOKEN, c_s=C_S, c_z=C_Z, c_s_inputs=C_SI,
        atom_encoder={"n_blocks": 2, "n_heads": 4},
        transformer={"n_blocks": 2, "n_heads": 4}, atom_decoder={"n_blocks": 2, "n_heads": 4}), 8)
    ours = DiffusionModule(cfg.diffusion, cfg.atom, cfg.relpos, C_S, C_Z, C_SI).double()
    filled = load_mapped("diffusion", theirs, ours, cfg)
    s_inputs = torch.randn(n, C_SI, generator=g, dtype=torch.float64)
    s_trunk = torch.randn(n, C_S, generator=g, dtype=torch.float64)
    z_trunk = torch.randn(n, n, C_Z, generator=g, dtype=torch.float64)
    x_noisy = torch.randn(n_sample, a, 3, generator=g, dtype=torch.float64) * 10
    t_hat = torch.tensor([0.5, 4.0, 60.0], dtype=torch.float64)
    px = _protenix_atom_feats(f, n)
    leaves_t = [t.clone().requires_grad_() for t in (x_noisy, s_inputs, s_trunk, z_trunk)]
    leaves_o = [t.clone().requires_grad_() for t in (x_noisy, s_inputs, s_trunk, z_trunk)]
    x_t = theirs(leaves_t[0], t_hat, px, leaves_t[1], leaves_t[2], leaves_t[3], None, None, None)
    x_o = ours(leaves_o[0][None], t_hat[None], _batch(f, n, a), leaves_o[1][None],
               leaves_o[2][None], leaves_o[3][None])[0]
    assert rel_err(x_o, x_t) < TOL
    g_x = torch.randn(x_t.shape, generator=g, dtype=torch.float64)
    (x_t * g_x).sum().backward()
    (x_o * g_x).sum().backward()
    for mine, ref in zip(leaves_o, leaves_t):
        assert rel_err(mine.grad, ref.grad) < TOL
    compare_grads("diffusion", theirs, ours, cfg, filled)


# -- confidence head ------------------------------------------------------------------------------

def test_confidence_head_matches_protenix():
    from protenix.model.modules.confidence import ConfidenceHead as PxConfidenceHead

    cfg = fold_config()
    f, n, a, g = _structure(9)
    n_sample = 2
    theirs = randomize(PxConfidenceHead(n_blocks=1, c_s=C_S, c_z=C_Z, c_s_inputs=C_SI,
                                        max_atoms_per_token=24, pairformer_dropout=0.0), 10)
    ours = ConfidenceHead(cfg).double()
    filled = load_mapped("confidence_head", theirs, ours, cfg)
    s_inputs = torch.randn(n, C_SI, generator=g, dtype=torch.float64)
    s_trunk = torch.randn(n, C_S, generator=g, dtype=torch.float64) * 3
    z_trunk = torch.randn(n, n, C_Z, generator=g, dtype=torch.float64)
    # predicted atoms spread over ~3-50 A so the distance one-hot uses many bins
    x_pred = torch.randn(n_sample, a, 3, generator=g, dtype=torch.float64) * 12
    # one representative atom per token (Protenix: distogram_rep_atom_mask; fold: its index)
    first = torch.searchsorted(f["atom_to_token"], torch.arange(n))
    rep = first + (torch.bincount(f["atom_to_token"]) > 1).long()  # 2nd atom where there is one
    slot = torch.arange(a) - first[f["atom_to_token"]]
    px = {"distogram_rep_atom_mask": torch.zeros(a, dtype=torch.bool).index_fill(0, rep, True),
          "atom_to_token_idx": f["atom_to_token"], "atom_to_tokatom_idx": slot}
    batch = _batch(f, n, a)
    batch["token_pseudo_beta_atom"] = rep[None]
    out_t = theirs(px, s_inputs, s_trunk, z_trunk, torch.ones(n, n, dtype=torch.float64), x_pred)
    out_o = ours(batch, s_inputs[None], s_trunk[None], z_trunk[None], x_pred[None])
    g_out = {}
    loss_t = loss_o = 0.0
    for name, t in zip(("plddt", "pae", "pde", "resolved"), out_t):
        assert rel_err(out_o[name][0], t) < TOL, name
        g_out[name] = torch.randn(t.shape, generator=g, dtype=torch.float64)
        loss_t = loss_t + (t * g_out[name]).sum()
        loss_o = loss_o + (out_o[name][0] * g_out[name]).sum()
    loss_t.backward()
    loss_o.backward()
    compare_grads("confidence_head", theirs, ours, cfg, filled)



# -- distogram and PDE targets on the representative atoms ----------------------------------------

def test_distogram_loss_and_pde_targets_match_protenix():
    """fold's distogram loss and PDE targets (on ``token_pseudo_beta_atom``) against Protenix's
    ``DistogramLoss`` and ``PDELoss`` (on ``distogram_rep_atom_mask``): the same representative
    atom per token, ground truth with unresolved atoms, two predicted samples. The PDE bins and
    masks are equal; the distogram loss agrees to float32 round-off (fold computes the loss in
    float32: 1e-5 relative), Protenix adds 1e-6 to the pair count, fold clamps it at 1."""
    from fold_model.af3.confidence import confidence_targets
    from fold_model.af3.loss import distogram_loss
    from protenix.model.loss import DistogramLoss, PDELoss

    cfg = fold_config()
    f, n, a, g = _structure(11)
    first = torch.searchsorted(f["atom_to_token"], torch.arange(n))
    size = torch.bincount(f["atom_to_token"])
    # one representative atom per token, anywhere in the token (not the centre, the first atom)
    rep = first + (torch.rand(n, generator=g) * size).long()
    x_gt = torch.randn(a, 3, generator=g, dtype=torch.float64) * 8
    resolved = (torch.rand(a, generator=g) > 0.2).double()
    x_pred = x_gt + torch.randn(2, a, 3, generator=g, dtype=torch.float64) * 1.5
    batch = _batch(f, n, a)
    zeros = torch.zeros(1, n, dtype=torch.long)
    batch.update(token_pseudo_beta_atom=rep[None], token_center_atom=first[None],
                 atom_positions=x_gt[None], atom_resolved=resolved[None], is_rna=zeros,
                 is_dna=zeros, is_protein=(size > 1).long()[None],
                 is_atomized=(size == 1).long()[None])
    rep_mask = torch.zeros(a, dtype=torch.bool).index_fill(0, rep, True)

    logits = torch.randn(n, n, 64, generator=g, dtype=torch.float64)
    theirs = DistogramLoss()(logits, x_gt, resolved, rep_mask)
    ours = distogram_loss(logits[None], batch, 2.3125, 21.6875)[0]
    assert abs(ours.item() - theirs.item()) < 1e-5 * theirs.item()

    bins_t, mask_t = PDELoss().calculate_label(x_pred, x_gt, resolved, rep_mask)
    t = confidence_targets(batch, x_pred[None], cfg)
    assert cfg.confidence.pde_max == 32 and cfg.confidence.pde_no_bins == 64
    assert torch.equal(t["pde_mask"][0], mask_t[None].expand(2, -1, -1).to(t["pde_mask"].dtype))
    assert mask_t.sum() > 0 and (mask_t == 0).any()  # holes: unresolved representative atoms
    assert torch.equal(t["pde"][0], bins_t.argmax(-1))
