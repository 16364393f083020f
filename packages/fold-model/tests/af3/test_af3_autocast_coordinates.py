"""AF3 coordinates stay fp32 under bf16 autocast: the augmented ground truth, the noise, the noised
coordinates, the EDM preconditioning, the denoised output and the sampler's trajectory; only the
network runs in bf16 (its ``r_update`` is bf16). bf16 keeps 8 significant bits (relative 2^-9 =
2e-3 rounding: ~0.1 A at 50 A), fp32 24 (6e-8); the tolerances below sit between the two where a
quantity is pure coordinate arithmetic, and at bf16's ~1e-2 where it goes through the network."""

from __future__ import annotations

import copy

import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3 import AlphaFold3, config
from fold_model.af3.diffusion import (
    DiffusionModule,
    centre_random_augmentation,
    noisy_training_samples,
    sample_diffusion,
)

CFG = config("tiny")
G = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def _far(f, offset=50.0):
    """The features with the structure moved ~50 A from the origin (where bf16 rounds to 0.25 A)."""
    f = dict(f)
    f["atom_positions"] = (f["atom_positions"] + offset) * f["atom_mask"][..., None]
    return f


def test_augmentation_and_training_noise_fp32_under_autocast():
    """Same generator, with and without autocast: identical fp32 results (the rotation einsum
    would run in bf16 under autocast)."""
    f = _far(random_features(n_token=9, batch=2, seed=3, n_pad_atom=3))
    x, mask = f["atom_positions"], f["atom_mask"] * f["atom_resolved"]
    xs = x[:, None].expand(2, 5, *x.shape[1:])
    plain_aug = centre_random_augmentation(xs, mask, 1.0, G(1))
    plain = noisy_training_samples(x, mask, 5, CFG.diffusion, G(2))
    with torch.autocast(**BF16):
        aug = centre_random_augmentation(xs, mask, 1.0, G(1))
        auto = noisy_training_samples(x, mask, 5, CFG.diffusion, G(2))
        # bf16 input coordinates come back as fp32 (computed from the bf16 values).
        from_bf16 = noisy_training_samples(x.bfloat16(), mask, 5, CFG.diffusion, G(2))
    assert aug.dtype == torch.float32 and rel_err(aug, plain_aug) < 1e-6
    for a, p in zip(auto, plain):
        assert a.dtype == torch.float32 and rel_err(a, p) < 1e-6
    assert all(t.dtype == torch.float32 for t in from_bf16)
    # The augmented copies are rigid copies of the (far) ground truth to fp32 precision.
    real = mask[0].bool()
    d0 = torch.cdist(x[0][real].double(), x[0][real].double())
    for s in range(5):
        xa = auto[0][0, s][real].double()
        assert rel_err(torch.cdist(xa, xa), d0) < 1e-5


def _module():
    cfg = CFG
    mod = DiffusionModule(cfg.diffusion, cfg.atom, cfg.relpos, cfg.c_s, cfg.c_z, cfg.c_s_inputs)
    return randomize_(mod, scale=0.5)


def test_diffusion_module_preconditioning_fp32_under_autocast():
    """``x_denoised`` is fp32 with the network's ``r_update`` in bf16; close to the fp32 module
    (bf16 network: ~1e-2) and, as ``t -> 0`` (``c_skip -> 1``, ``c_out -> 0``), equal to the
    input at 50 A to fp32 precision."""
    mod = _module()
    f = random_features(n_token=8, seed=4)
    n, A = f["token_mask"].shape[-1], f["atom_mask"].shape[-1]
    g = G(0)
    s_in = torch.randn(1, n, CFG.c_s_inputs, generator=g)
    s_tr = torch.randn(1, n, CFG.c_s, generator=g)
    z_tr = torch.randn(1, n, n, CFG.c_z, generator=g)
    x = torch.randn(1, 3, A, 3, generator=g) * 10 + 50.0
    t = torch.tensor([[0.5, 4.0, 30.0]])
    r_updates = []
    hook = mod.decoder.register_forward_hook(lambda m, i, o: r_updates.append(o.dtype))
    plain = mod(x, t, f, s_in, s_tr, z_tr)
    with torch.autocast(**BF16):
        auto = mod(x, t, f, s_in, s_tr, z_tr)
        tiny = mod(x, torch.full((1, 3), 1e-4), f, s_in, s_tr, z_tr)
        from_bf16 = mod(x.bfloat16(), t, f, s_in, s_tr, z_tr)
    hook.remove()
    assert r_updates == [torch.float32, torch.bfloat16, torch.bfloat16, torch.bfloat16]
    assert auto.dtype == tiny.dtype == from_bf16.dtype == torch.float32
    assert plain.dtype == torch.float32 and torch.isfinite(auto).all()
    assert rel_err(auto, plain) < 2e-2
    # c_skip = 1 - 4e-11, c_out * r_update ~ 1e-4 * O(1): fp32 keeps x (rel 6e-8), bf16 would
    # round 50 A to 0.25 A steps (rel 2e-3).
    assert rel_err(tiny, x) < 1e-5


def _model(**kw):
    torch.manual_seed(0)
    return randomize_(AlphaFold3(config("tiny", **kw)), scale=0.5)


def test_training_coordinates_fp32_and_loss_close_under_autocast():
    model = _model()
    model.train()
    f = _far(random_features(n_token=9, batch=2, seed=1, n_pad_token=2, n_pad_atom=3))
    seen = []
    hooks = [
        model.diffusion.register_forward_pre_hook(
            lambda m, args: seen.append(("x_noisy", args[0].dtype, args[1].dtype))),
        model.diffusion.decoder.register_forward_hook(
            lambda m, i, o: seen.append(("r_update", o.dtype))),
    ]
    results = []
    for autocast in (False, True):
        seen.clear()
        torch.manual_seed(5)  # the same dropout masks (drawn from the global RNG) both times
        with torch.autocast(enabled=autocast, **BF16):
            out = model(f, generator=G(0))
            loss, parts = model.loss(out, f)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        results.append((out, loss, parts, grads, list(seen)))
    for h in hooks:
        h.remove()
    (out32, loss32, parts32, g32, seen32), (out, loss, parts, g16, seen16) = results
    for k in ("x_denoised", "x_gt_augmented", "sigma", "x_rollout"):
        assert out[k].dtype == torch.float32, k
    # Every call of the diffusion module (training batch, then the mini-rollout's steps) gets
    # fp32 noisy coordinates and noise levels; the network's r_update is bf16 under autocast.
    n_calls = 1 + model.config.confidence.rollout_steps
    assert [e for e in seen16 if e[0] == "x_noisy"] == [
        ("x_noisy", torch.float32, torch.float32)] * n_calls
    assert [e for e in seen16 if e[0] == "r_update"] == [("r_update", torch.bfloat16)] * n_calls
    assert all(e[1] == torch.float32 for e in seen32)
    # Same RNG draws: the augmented ground truth and the noise levels are the fp32 ones exactly.
    assert rel_err(out["x_gt_augmented"], out32["x_gt_augmented"]) < 1e-6
    assert rel_err(out["sigma"], out32["sigma"]) < 1e-6
    # Through the bf16 network: ~1e-2 (the loss is a mean of many terms, tighter than that).
    assert rel_err(out["x_denoised"], out32["x_denoised"]) < 2e-2
    for k in ("diffusion", "mse", "smooth_lddt", "distogram"):
        assert abs(parts[k] - parts32[k]) <= 1e-2 * abs(parts32[k]) + 1e-6, k
    assert torch.isfinite(loss) and abs(loss - loss32) <= 1e-2 * abs(loss32)
    assert all(torch.isfinite(g).all() for g in g16)
    flat16, flat32 = torch.cat([g.flatten() for g in g16]), torch.cat([g.flatten() for g in g32])
    # Gradients of every parameter through the bf16 network (~20 bf16 layers deep, forward and
    # backward): a few % relative error, the same direction (cosine 0.998 observed).
    assert torch.nn.functional.cosine_similarity(flat16, flat32, dim=0) > 0.99


def test_sampler_fp32_and_finite_under_autocast():
    model = _model().eval()
    f = _far(random_features(n_token=7, batch=1, seed=2))
    steps = []
    hook = model.diffusion.register_forward_pre_hook(
        lambda m, args: steps.append((args[0].dtype, args[1].dtype)))
    with torch.no_grad(), torch.autocast(**BF16):
        out = model(f, generator=G(1))
    hook.remove()
    x = out["x_pred"]
    assert x.dtype == torch.float32 and torch.isfinite(x).all()
    assert x[..., f["atom_mask"][0] == 0, :].abs().max() == 0
    assert steps == [(torch.float32, torch.float32)] * model.config.sampler.no_steps
    # A denoiser that answers in bf16 (as a bf16 network would): the trajectory stays fp32.
    mask = f["atom_mask"]
    w = mask[:, None, :, None]

    def denoise(x_noisy, t):
        assert x_noisy.dtype == torch.float32 and t.dtype == torch.float32
        mu = (x_noisy * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True)
        return ((mu + 0.5 * (x_noisy - mu)) * w).bfloat16()

    cfg = copy.deepcopy(CFG.sampler)
    with torch.autocast(**BF16):
        y = sample_diffusion(denoise, mask, 2, cfg, 16.0, no_steps=6, generator=G(3))
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    # With an fp32 denoiser the trajectory (noise, augmentation, updates; starting at ~2500 A)
    # is the same with and without autocast to fp32 precision; bf16 steps would give ~1e-3.
    def denoise32(x_noisy, t):
        return denoise(x_noisy, t).float()

    plain = sample_diffusion(denoise32, mask, 2, cfg, 16.0, no_steps=6, generator=G(4))
    with torch.autocast(**BF16):
        auto = sample_diffusion(denoise32, mask, 2, cfg, 16.0, no_steps=6, generator=G(4))
    assert auto.dtype == torch.float32 and rel_err(auto, plain) < 1e-5


def test_template_features_from_fp32_coordinates_under_autocast():
    """The template distogram (1.25 A bins) and unit vectors come from fp32 coordinates under
    autocast: bf16 coordinates 50 A out (0.25 A steps, squared distances in 16-unit steps) would
    move distances across bin edges."""
    from fold_model.af3.template import TemplateEmbedder

    cfg = CFG
    mod = randomize_(TemplateEmbedder(cfg.template, cfg.c_z), scale=0.5).eval()  # no dropout
    f = random_features(n_token=12, seed=6, n_templ=3)
    f["template_pseudo_beta"] = f["template_pseudo_beta"] * 3 + 50.0
    f["template_backbone"] = f["template_backbone"] * 3 + 50.0
    n = f["token_mask"].shape[-1]
    z = torch.randn(1, n, n, cfg.c_z, generator=G(2))
    pair_mask = f["token_mask"][..., :, None] * f["token_mask"][..., None, :]
    feats = []
    hook = mod.linear_a.register_forward_pre_hook(lambda m, args: feats.append(args[0]))
    plain = mod(f, z, pair_mask)
    with torch.autocast(**BF16):
        auto = mod(f, z.bfloat16(), pair_mask)  # the trunk's pair is bf16 under autocast
    hook.remove()
    nb = cfg.template.distogram_no_bins
    a32, a16 = feats[0], feats[1].float()
    assert a32[..., :nb].sum() > 0
    assert torch.equal(a16[..., :nb], a32[..., :nb])  # one-hot bins: exact in bf16
    assert rel_err(a16, a32) < 4e-3  # unit vectors rounded once to bf16 (2^-9)
    assert rel_err(auto, plain) < 2e-2
