"""AF3 diffusion: weighted rigid alignment recovers a known rotation, smooth lDDT against lDDT,
bond / MSE / distogram losses on known cases, the noise schedule, the sampler's output rotating
with the augmentation, training noise and augmentation, the diffusion module (EDM limit, samples
independent, padding, fp32 == fp64)."""

from __future__ import annotations

import copy
import math

import torch
from _af3_helpers import random_features, randomize_, rel_err
from fold_model.af3.alignment import weighted_rigid_align, weighted_rigid_transform
from fold_model.af3.config import config
from fold_model.af3.diffusion import (
    DiffusionModule,
    DiffusionTransformer,
    centre_random_augmentation,
    noise_schedule,
    noisy_training_samples,
    random_rotation,
    sample_diffusion,
)
from fold_model.af3.loss import (
    bond_loss,
    diffusion_loss,
    distogram_loss,
    lddt,
    smooth_lddt_loss,
    weighted_mse_loss,
)

CFG = config("tiny")
G = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731


def test_weighted_rigid_align_recovers_known_rotation():
    x = torch.randn(2, 3, 11, 3, generator=G(0), dtype=torch.float64) * 5
    rot = random_rotation((2, 3), G(1), torch.float64)
    t = torch.randn(2, 3, 1, 3, generator=G(2), dtype=torch.float64) * 10
    y = torch.einsum("bsij,bsaj->bsai", rot, x) + t
    w = torch.rand(2, 3, 11, generator=G(3), dtype=torch.float64) + 0.5
    w[..., 4] = 0.0  # a zero-weight atom may be anywhere
    y_out = y.clone()
    y_out[..., 4, :] += 100.0
    r_est, mu_m, mu_f = weighted_rigid_transform(x, y_out, w)
    assert rel_err(r_est, rot) < 1e-10
    aligned = weighted_rigid_align(x, y_out, w)
    keep = w > 0
    assert rel_err(aligned[keep], y[keep]) < 1e-10
    assert not aligned.requires_grad
    # A mirror image is matched by a proper rotation (det +1), never a reflection.
    mirror = y * torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    r_m, _, _ = weighted_rigid_transform(x, mirror, w)
    assert torch.allclose(torch.linalg.det(r_m), torch.ones(2, 3, dtype=torch.float64))


def test_weighted_rigid_align_fp32_under_autocast():
    """Under bf16 autocast (how training runs the loss) the superposition still runs in fp32: the
    same result as without autocast (a bf16 covariance would be 3 significant digits, and has no
    SVD at all on CUDA or CPU)."""
    x = torch.cumsum(torch.randn(1, 4, 37, 3, generator=G(5)) * 2.0, -2) * 4.0
    rot = random_rotation((1, 4), G(6))
    y = torch.einsum("bsij,bsaj->bsai", rot, x) + 20.0 + 0.3 * torch.randn(x.shape, generator=G(7))
    w = torch.rand(1, 4, 37, generator=G(8)) + 0.5
    w[..., 3] = 0.0
    plain = weighted_rigid_align(x, y, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r_auto, _, _ = weighted_rigid_transform(x, y, w)
        auto = weighted_rigid_align(x, y, w)
    assert r_auto.dtype == torch.float32 and auto.dtype == torch.float32
    # fp32 arithmetic both ways: differences at fp32 rounding of ~100 A coordinates
    assert rel_err(auto, plain) < 1e-5


def _structures(n=40, seed=0):
    x = torch.cumsum(torch.randn(1, 1, n, 3, generator=G(seed), dtype=torch.float64) * 2.2, -2)
    mask = torch.ones(1, n, dtype=torch.float64)
    mask[0, 5] = 0
    nuc = torch.zeros(1, n, dtype=torch.bool)
    return x, mask, nuc


def test_smooth_lddt_close_to_lddt():
    x, mask, nuc = _structures()
    rot = random_rotation((1, 1), G(4), torch.float64)
    moved = torch.einsum("bsij,bsaj->bsai", rot, x) + 3.0
    # Identical up to a rigid motion: lDDT 1; smooth lDDT is the mean of sigmoid(t) exactly.
    assert lddt(moved, x, nuc, mask).item() == 1.0
    expect = sum(1 / (1 + math.exp(-t)) for t in (0.5, 1, 2, 4)) / 4
    assert abs(1 - smooth_lddt_loss(moved, x, nuc, mask).item() - expect) < 1e-12
    # Sharp sigmoids give lDDT itself; AF3's k = 1 orders perturbations as lDDT does.
    hard, smooth = [], []
    for i, scale in enumerate((0.1, 0.5, 1.0, 2.0, 4.0)):
        noisy = x + scale * torch.randn(x.shape, generator=G(10 + i), dtype=torch.float64)
        score = lddt(noisy, x, nuc, mask).item()
        assert abs(1 - smooth_lddt_loss(noisy, x, nuc, mask, sharpness=1e4).item() - score) < 2e-3
        hard.append(score)
        smooth.append(1 - smooth_lddt_loss(noisy, x, nuc, mask).item())
    assert hard == sorted(hard, reverse=True) and smooth == sorted(smooth, reverse=True)
    assert hard[0] > 0.9 and hard[-1] < 0.5
    # The masked atom does not count.
    far = x.clone()
    far[..., 5, :] += 50
    assert lddt(far, x, nuc, mask).item() == 1.0


def test_mse_after_alignment_and_bond_loss_known_cases():
    f = random_features(n_token=8, batch=1, seed=2)
    f = {k: v.double() if v.is_floating_point() else v for k, v in f.items()}
    lig = int(f["token_center_atom"][0, 7])
    prev = int(f["token_center_atom"][0, 6])
    f["atom_resolved"][0, [lig, prev]] = 1.0
    gt = f["atom_positions"][:, None].expand(1, 2, -1, 3)
    rot = random_rotation((1, 2), G(5), torch.float64)
    moved = torch.einsum("bsij,bsaj->bsai", rot, gt) - 4.0
    mask = f["atom_mask"] * f["atom_resolved"]
    w = torch.ones_like(mask)
    assert weighted_mse_loss(moved, gt, w, mask).abs().max() < 1e-20
    assert bond_loss(moved, gt, f).abs().max() < 1e-20
    # Move the ligand atom (last real token, bonded to the token before) 1 A along the bond.
    shifted = gt.clone()
    u = gt[0, 0, lig] - gt[0, 0, prev]
    shifted[:, :, lig] += u / u.norm()
    assert torch.allclose(bond_loss(shifted, gt, f), torch.ones(1, 2, dtype=torch.float64))
    # One atom displaced by d (unit weight, others fixed): after alignment the loss is positive
    # and below the unaligned d^2 / (3 n).
    disp = gt.clone()
    disp[:, :, 0] += torch.tensor([3.0, 0, 0], dtype=torch.float64)
    loss = weighted_mse_loss(disp, gt, w, mask)
    assert (loss > 0).all() and (loss <= 9.0 / (3 * mask.sum()) + 1e-12).all()


def test_distogram_loss_prefers_true_bins():
    f = random_features(n_token=8, batch=1, seed=3)
    f["atom_resolved"] = f["atom_mask"].clone()
    n = 9
    rep = f["token_pseudo_beta_atom"].long()  # the representative atoms (not the centres)
    assert (rep != f["token_center_atom"]).any()
    pos = torch.gather(f["atom_positions"], 1, rep[..., None].expand(-1, -1, 3))
    target = torch.bucketize(torch.cdist(pos, pos), torch.linspace(2, 22, 63))
    good = torch.nn.functional.one_hot(target, 64).float() * 20
    bad = torch.zeros(1, n, n, 64)
    assert distogram_loss(good, f) < 1e-6 and abs(distogram_loss(bad, f) - math.log(64)) < 1e-5
    # Bins of the centre atoms' distances are not the target.
    center = f["token_center_atom"].long()
    cpos = torch.gather(f["atom_positions"], 1, center[..., None].expand(-1, -1, 3))
    wrong = torch.bucketize(torch.cdist(cpos, cpos), torch.linspace(2, 22, 63))
    assert (wrong != target).any()
    assert distogram_loss(torch.nn.functional.one_hot(wrong, 64).float() * 20, f) > 1.0


def test_distogram_loss_against_float64_reference():
    """Random logits, representative atoms with holes in their resolution, a padded token: the
    loss equals a per-pair float64 cross-entropy over pairs of resolved representative atoms."""
    f = random_features(n_token=10, batch=2, seed=4, n_pad_token=2)
    g = torch.Generator().manual_seed(5)
    rep = f["token_pseudo_beta_atom"].long()
    f["atom_resolved"][0, rep[0, 3]] = 0.0  # an unresolved CB-like atom: its pairs drop out
    n = f["token_mask"].shape[1]
    logits = torch.randn(2, n, n, 64, generator=g)
    got = distogram_loss(logits, f, 2.3125, 21.6875)
    edges = torch.linspace(2.3125, 21.6875, 63, dtype=torch.float64)
    for b in range(2):
        num, den = 0.0, 0.0
        for i in range(n):
            for j in range(n):
                ai, aj = int(rep[b, i]), int(rep[b, j])
                w = float(f["token_mask"][b, i] * f["token_mask"][b, j]
                          * f["atom_resolved"][b, ai] * f["atom_resolved"][b, aj])
                if w == 0:
                    continue
                d = (f["atom_positions"][b, ai].double() - f["atom_positions"][b, aj].double()
                     ).norm()
                k = int((d > edges).sum())  # bin k: edges[k-1] < d <= edges[k]
                num += -torch.log_softmax(logits[b, i, j].double(), -1)[k].item() * w
                den += w
        assert abs(got[b].item() - num / den) < 1e-5 * max(1.0, num / den)


def test_noise_schedule():
    c = noise_schedule(CFG.sampler, 16.0, no_steps=200, dtype=torch.float64)
    assert c.shape == (201,) and (c[1:] < c[:-1]).all()
    assert abs(c[0] - 16 * 160) < 1e-9 and abs(c[-1] - 16 * 4e-4) < 1e-12


def _equivariant_denoiser(mask):
    w = mask[:, None, :, None]

    def denoise(x, t):
        mu = (x * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True)
        return (mu + 0.5 * (x - mu)) * w

    return denoise


def test_sampler_output_rotates_with_the_augmentation():
    mask = torch.ones(1, 10, dtype=torch.float64)
    mask[0, -1] = 0
    cfg = copy.deepcopy(CFG.sampler)
    q = random_rotation((), G(7), torch.float64)
    rots = random_rotation((12, 1, 2), G(8), torch.float64)  # one rotation per step and sample
    step = {"i": 0}

    def augment(extra_last):
        def f(x):
            i = step["i"]
            step["i"] += 1
            x = torch.einsum("bsij,bsaj->bsai", rots[i], x) + float(i)
            return torch.einsum("ij,bsaj->bsai", q, x) if extra_last and i == 7 else x
        return f

    outs = []
    for extra in (False, True):
        step["i"] = 0
        with torch.random.fork_rng():
            torch.set_default_dtype(torch.float64)
            try:
                outs.append(sample_diffusion(_equivariant_denoiser(mask), mask, 2, cfg, 16.0,
                                             no_steps=8, generator=G(9), augment=augment(extra)))
            finally:
                torch.set_default_dtype(torch.float32)
    plain, rotated = outs
    assert torch.isfinite(plain).all() and plain[..., -1, :].abs().max() == 0
    assert rel_err(rotated, torch.einsum("ij,bsaj->bsai", q, plain)) < 1e-12
    # The default augmentation centres, rotates and translates by ~1 A.
    x = torch.randn(1, 2, 10, 3, generator=G(3), dtype=torch.float64) + 20
    y = centre_random_augmentation(x, mask, 1.0, G(4))
    d = lambda v: torch.cdist(v[..., :9, :], v[..., :9, :])  # noqa: E731
    assert rel_err(d(y), d(x)) < 1e-12
    assert y[..., :9, :].mean(-2).norm(dim=-1).max() < 5


def test_training_samples_are_rigid_copies_with_edm_noise():
    f = random_features(n_token=6, batch=1, seed=1)
    x_gt = f["atom_positions"].double()
    mask = f["atom_mask"]
    gt_aug, noisy, sigma = noisy_training_samples(x_gt, mask, 400, CFG.diffusion, G(0))
    real = mask[0].bool()
    d0 = torch.cdist(x_gt[0][real], x_gt[0][real])
    for s in range(3):
        assert rel_err(torch.cdist(gt_aug[0, s][real], gt_aug[0, s][real]), d0) < 1e-10
    log_s = torch.log(sigma / 16.0)
    assert abs(log_s.mean() + 1.2) < 0.25 and abs(log_s.std() - 1.5) < 0.2
    assert noisy.shape == gt_aug.shape


def _module():
    cfg = CFG
    mod = DiffusionModule(cfg.diffusion, cfg.atom, cfg.relpos, cfg.c_s, cfg.c_z, cfg.c_s_inputs)
    return randomize_(mod, scale=0.5).double()


def _trunk(f, seed=0):
    n = f["token_mask"].shape[-1]
    g = G(seed)
    return (torch.randn(1, n, CFG.c_s_inputs, generator=g, dtype=torch.float64),
            torch.randn(1, n, CFG.c_s, generator=g, dtype=torch.float64),
            torch.randn(1, n, n, CFG.c_z, generator=g, dtype=torch.float64))


def test_diffusion_module_edm_limit_samples_and_precision():
    mod = _module()
    f = {k: v.double() if v.is_floating_point() else v
         for k, v in random_features(n_token=8, seed=4).items()}
    s_in, s_tr, z_tr = _trunk(f)
    A = f["atom_mask"].shape[-1]
    x = torch.randn(1, 3, A, 3, generator=G(1), dtype=torch.float64) * 10
    t = torch.tensor([[0.5, 4.0, 30.0]], dtype=torch.float64)
    out = mod(x, t, f, s_in, s_tr, z_tr)
    assert out.shape == x.shape and torch.isfinite(out).all()
    # Each sample is denoised independently of the others.
    one = mod(x[:, 1:2], t[:, 1:2], f, s_in, s_tr, z_tr)
    assert rel_err(one, out[:, 1:2]) < 1e-12
    # EDM: as t -> 0 the denoiser returns its input.
    tiny_t = torch.full((1, 3), 1e-6, dtype=torch.float64)
    assert rel_err(mod(x, tiny_t, f, s_in, s_tr, z_tr), x) < 1e-6
    f32 = {k: v.float() if v.is_floating_point() else v for k, v in f.items()}
    out32 = copy.deepcopy(mod).float()(x.float(), t.float(), f32, s_in.float(), s_tr.float(),
                                       z_tr.float())
    assert rel_err(out32, out) < 1e-5


def test_prepared_context_gives_the_same_denoiser_and_is_not_recomputed(monkeypatch):
    """``DiffusionModule.prepare``: the noise-independent terms made once give the per-step
    network's numbers (odd sizes, masked atoms and tokens), in sample groups too; a step with
    the context makes no pair bias and no pair or atom conditioning of its own."""
    from fold_model.af3.conditioning import AttentionPairBias

    mod = _module().eval()
    f = {k: v.double() if v.is_floating_point() else v
         for k, v in random_features(n_token=7, seed=5).items()}
    f["token_mask"][..., 5] = 0  # a hole in the tokens
    f["atom_mask"][..., 3] = 0  # and in the atoms
    s_in, s_tr, z_tr = _trunk(f, seed=3)
    A = f["atom_mask"].shape[-1]
    x = torch.randn(1, 3, A, 3, generator=G(6), dtype=torch.float64) * 10
    t = torch.tensor([[0.7, 3.0, 11.0]], dtype=torch.float64)
    with torch.no_grad():
        plain = mod(x, t, f, s_in, s_tr, z_tr)
        ctx = mod.prepare(f, s_in, s_tr, z_tr)
    n_blocks = len(mod.transformer.blocks)
    assert set(ctx) == {"z_cond", "s_cond", "atom_c", "atom_p", "encoder_bias", "decoder_bias",
                        "token_bias"}
    assert ctx["token_bias"].shape[:2] == (n_blocks, 1)
    assert ctx["encoder_bias"].shape[0] == len(mod.encoder.transformer.attention)
    made = []
    for name in ("bias_from_pair",):
        plain_fn = getattr(AttentionPairBias, name)
        monkeypatch.setattr(AttentionPairBias, name,
                            lambda self, *a, _f=plain_fn, **k: made.append(1) or _f(self, *a, **k))
    for owner, name in ((mod.conditioning, "pair"), (mod.conditioning, "single_trunk"),
                        (mod.encoder, "condition")):
        plain_fn = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _f=plain_fn, **k: made.append(1) or _f(*a, **k))
    with torch.no_grad():
        got = mod(x, t, f, s_in, s_tr, z_tr, ctx)
        assert not made  # nothing of the context made again
        mod.sample_group_size = 2
        grouped = mod(x, t, f, s_in, s_tr, z_tr, ctx)
    assert rel_err(got, plain) < 1e-12 and rel_err(grouped, plain) < 1e-12
    # an inference chunk size: the transformer's biases are left out (made per step, chunked)
    mod.sample_group_size = None
    mod.transformer.set_chunk_size(3)
    with torch.no_grad():
        chunked_ctx = mod.prepare(f, s_in, s_tr, z_tr)
        assert "token_bias" not in chunked_ctx
        chunked = mod(x, t, f, s_in, s_tr, z_tr, chunked_ctx)
    assert rel_err(chunked, plain) < 1e-12


def test_diffusion_transformer_checkpointing_same_grads():
    mod = randomize_(DiffusionTransformer(30, CFG.c_s, CFG.c_z, 2, 3), scale=0.5).double()
    ck = copy.deepcopy(mod)
    ck.use_checkpoint = True
    g = G(2)
    a = torch.randn(1, 2, 7, 30, generator=g, dtype=torch.float64)
    s = torch.randn(1, 2, 7, CFG.c_s, generator=g, dtype=torch.float64)
    z = torch.randn(1, 7, 7, CFG.c_z, generator=g, dtype=torch.float64)
    m = torch.ones(1, 7, dtype=torch.float64)
    m[0, 3] = 0
    res = []
    for mm in (mod, ck):
        mm.train()
        out = mm(a, s, z, m)
        (out * torch.cos(out)).sum().backward()
        res.append((out, [p.grad.clone() for p in mm.parameters()]))
    assert rel_err(res[1][0], res[0][0]) < 1e-12
    for g1, g0 in zip(res[1][1], res[0][1]):
        assert rel_err(g1, g0) < 1e-10 or g0.abs().max() == 0


def test_diffusion_loss_finite_and_backpropagates():
    mod = _module()
    f = {k: v.double() if v.is_floating_point() else v
         for k, v in random_features(n_token=8, seed=5).items()}
    s_in, s_tr, z_tr = _trunk(f, 1)
    cfg = copy.deepcopy(CFG.loss)
    cfg.bond_weight = 1.0
    gt_aug, noisy, sigma = noisy_training_samples(f["atom_positions"], f["atom_mask"], 3,
                                                  CFG.diffusion, G(3))
    out = mod(noisy, sigma, f, s_in, s_tr, z_tr)
    losses = diffusion_loss(out, gt_aug, sigma, f, cfg, 16.0)
    assert all(torch.isfinite(v) for v in losses.values())
    losses["diffusion"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mod.parameters())
