"""FlatParams / FlatAdam against torch.optim.Adam + clip_grad_norm_ + a manual EMA."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from _train_helpers import as_old_adaln
from fold_train.optim import AdamConfig, FlatAdam, FlatParams, learning_rate
from torch import nn


class _Net(nn.Module):
    """Odd sizes, a LayerNorm and a bias-free layer: several parameter shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(7, 13)
        self.norm = nn.LayerNorm(13)
        self.b = nn.Linear(13, 5, bias=False)
        self.scale = nn.Parameter(torch.randn(3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.tanh(self.norm(self.a(x))))  # [B, 5]
        return (h[:, None, :] * self.scale).sum(-1)  # [B, 3]


def _loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (((net(x) - y) ** 2).sum(-1) * mask).sum() / mask.sum()


def _data(seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(11, 7, generator=g)
    y = torch.randn(11, 3, generator=g)
    mask = (torch.rand(11, generator=g) > 0.3).float()
    assert 0 < mask.sum() < 11  # a mask with holes
    return x.to(dtype), y.to(dtype), mask.to(dtype)


def _reference_run(net, cfg: AdamConfig, steps: int):
    """torch.optim.Adam with the AF2 schedule, clip_grad_norm_, EMA by hand, all in float64."""
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                           eps=cfg.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: learning_rate(s + 1, cfg) / cfg.lr)  # LambdaLR counts from 0
    ema = {n: p.detach().clone() for n, p in net.named_parameters()}
    norms = []
    for s in range(steps):
        opt.zero_grad()
        _loss(net, *_data(s, torch.float64)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.clip_norm)))
        opt.step()
        sched.step()
        with torch.no_grad():
            for n, p in net.named_parameters():
                ema[n].mul_(cfg.ema_decay).add_(p, alpha=1 - cfg.ema_decay)
    return norms, ema


def _flat_run(net, cfg: AdamConfig, steps: int, **kw):
    flat = FlatParams(net)
    opt = FlatAdam(flat, cfg, **kw)
    norms = []
    for s in range(steps):
        flat.zero_grad()
        _loss(net, *_data(s)).backward()
        flat.check()
        norm = opt.grad_norm()
        norms.append(float(norm))
        opt.step(norm)
    return norms, opt


@pytest.mark.parametrize("clip_norm", [0.1, 100.0])  # clipping active / inactive
def test_flat_adam_matches_torch_adam_clip_and_ema(clip_norm):
    torch.manual_seed(0)
    net = _Net()
    ref_net = copy.deepcopy(net).double()
    # warm-up of 3 steps and a decay every 4 steps: both parts of the schedule are exercised
    cfg = AdamConfig(lr=3e-2, warmup_steps=3, decay_every=4, decay_factor=0.5,
                     clip_norm=clip_norm, ema_decay=0.9)
    ref_norms, ref_ema = _reference_run(ref_net, cfg, steps=9)
    norms, opt = _flat_run(net, cfg, steps=9)
    assert opt.step_count == 9 and not opt.uses_kernels
    torch.testing.assert_close(torch.tensor(norms, dtype=torch.float64),
                               torch.tensor(ref_norms, dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)
    for (name, p), (_, q) in zip(net.named_parameters(), ref_net.named_parameters()):
        torch.testing.assert_close(p.double(), q, rtol=1e-5, atol=1e-6, msg=name)
    ema = opt.ema_state_dict()
    for name, e in ref_ema.items():
        torch.testing.assert_close(ema[name].double(), e, rtol=1e-5, atol=1e-6, msg=name)
    if clip_norm == 0.1:
        assert max(ref_norms) > 0.1  # the clipping really happened


def test_parameters_and_grads_are_views_of_one_buffer():
    net = _Net()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    flat = FlatParams(net)
    assert len(flat.groups) == 1
    g = flat.groups[0]
    n_params = sum(p.numel() for p in net.parameters())
    assert flat.numel >= n_params
    for (name, p), off in zip(net.named_parameters(), g.offsets):
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)
        assert p.data_ptr() == g.param[off:].data_ptr()
        assert (off * 4) % 512 == 0  # every parameter starts 512-byte aligned
    _loss(net, *_data(0)).backward()
    manual = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    packed = torch.cat([g.grad[o:o + p.numel()] for p, o in zip(net.parameters(), g.offsets)])
    torch.testing.assert_close(packed, manual, rtol=0, atol=0)
    assert torch.isfinite(g.grad).all() and g.grad.abs().sum() > 0
    # the alignment gaps hold no gradient: the flat norm is the norm of the parameters' grads
    torch.testing.assert_close(g.grad.double().norm(), manual.double().norm(),
                               rtol=1e-12, atol=0)
    dense = FlatParams(copy.deepcopy(net), align_bytes=1)
    assert dense.numel == n_params and dense.groups[0].offsets[-1] == n_params - 5 * 13
    flat.zero_grad()
    assert all(float(p.grad.abs().sum()) == 0 for p in net.parameters())
    flat.check()
    net.a.weight.grad = None
    with pytest.raises(RuntimeError, match="a.weight"):
        flat.check()


def test_schedule_is_af2():
    cfg = AdamConfig()
    assert learning_rate(1, cfg) == pytest.approx(1e-6)
    assert learning_rate(500, cfg) == pytest.approx(5e-4)
    assert learning_rate(1000, cfg) == pytest.approx(1e-3)
    assert learning_rate(49_999, cfg) == pytest.approx(1e-3)
    assert learning_rate(50_000, cfg) == pytest.approx(0.95e-3)
    assert learning_rate(100_000, cfg) == pytest.approx(0.95**2 * 1e-3)


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(1)
    net_a = _Net()
    net_b = copy.deepcopy(net_a)
    cfg = AdamConfig(lr=1e-2, warmup_steps=2)
    _, opt_a = _flat_run(net_a, cfg, steps=3)
    # b: three steps, then its state goes through a state dict into a fresh optimizer
    _, opt_b = _flat_run(net_b, cfg, steps=3)
    state = opt_b.state_dict()
    flat_c = FlatParams(net_b)
    opt_c = FlatAdam(flat_c, cfg)
    opt_c.load_state_dict(state)
    for opt, net, flat in ((opt_a, net_a, opt_a.flat), (opt_c, net_b, flat_c)):
        for s in range(3, 5):
            flat.zero_grad()
            _loss(net, *_data(s)).backward()
            opt.step()
    for p, q in zip(net_a.parameters(), net_b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    other = FlatAdam(FlatParams(nn.Linear(2, 2)), cfg)
    with pytest.raises(ValueError, match="different parameters"):
        other.load_state_dict(state)


def test_swap_ema_restores_weights():
    net = _Net()
    cfg = AdamConfig(lr=1e-2, warmup_steps=0, ema_decay=0.5)
    _, opt = _flat_run(net, cfg, steps=2)
    live = [p.detach().clone() for p in net.parameters()]
    with opt.swap_ema():
        for p, e in zip(net.parameters(), opt.ema_state_dict().values()):
            torch.testing.assert_close(p.detach(), e)
        assert any(not torch.equal(p, q) for p, q in zip(net.parameters(), live))
    for p, q in zip(net.parameters(), live):
        assert torch.equal(p.detach(), q)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="clip_norm"):
        AdamConfig(clip_norm=0.0)
    with pytest.raises(ValueError, match="ema_decay"):
        AdamConfig(ema_decay=1.5)


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="fold_kernels' fused Adam needs CUDA or TRITON_INTERPRET=1")
def test_fused_kernel_path_matches_torch_path():
    pytest.importorskip("fold_kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(2)
    net_k = _Net().to(device)
    net_t = copy.deepcopy(net_k)
    cfg = AdamConfig(lr=2e-2, warmup_steps=2, ema_decay=0.9)
    norms_k, opt_k = _flat_run(net_k, cfg, steps=4, use_kernels=True)
    norms_t, opt_t = _flat_run(net_t, cfg, steps=4, use_kernels=False)
    assert opt_k.uses_kernels and not opt_t.uses_kernels
    torch.testing.assert_close(torch.tensor(norms_k), torch.tensor(norms_t), rtol=1e-5, atol=1e-6)
    for p, q in zip(net_k.parameters(), net_t.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for a, b in zip(opt_k.ema, opt_t.ema):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_swa_is_the_mean_of_the_weights_after_each_update():
    torch.manual_seed(3)
    net = _Net()
    cfg = AdamConfig(lr=1e-2, warmup_steps=0, averaging="swa")
    flat = FlatParams(net)
    opt = FlatAdam(flat, cfg)
    history = []
    for s in range(5):
        flat.zero_grad()
        _loss(net, *_data(s)).backward()
        opt.step()
        history.append(flat.groups[0].param.double().clone())
    torch.testing.assert_close(opt.ema[0].double(), torch.stack(history).mean(0),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="averaging"):
        AdamConfig(averaging="polyak")


def test_bf16_parameters_with_fp32_master_weights():
    """bf16 parameters: Adam runs on an fp32 master copy (equal to an fp32 run fed the same
    gradients) and the parameters are its bf16 rounding; the master survives a checkpoint."""
    torch.manual_seed(5)
    ref = _Net()
    low = copy.deepcopy(ref).to(torch.bfloat16)
    with torch.no_grad():  # start both from bf16-representable weights
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16))
    cfg = AdamConfig(lr=3e-2, warmup_steps=0, clip_norm=0.5, ema_decay=0.8)
    flat_ref, flat_low = FlatParams(ref), FlatParams(low)
    opt_ref, opt_low = FlatAdam(flat_ref, cfg), FlatAdam(flat_low, cfg)
    assert flat_low.groups[0].param.dtype == torch.bfloat16
    # fp32 and bf16 groups are aligned in elements differently: compare parameter by parameter
    assert flat_ref.offsets() != flat_low.offsets()
    n_params = sum(p.numel() for p in ref.parameters())
    gen = torch.Generator().manual_seed(9)
    for _ in range(4):
        g = torch.randn(n_params, generator=gen).to(torch.bfloat16)  # packed densely
        flat_ref.load_group(0, flat_ref.groups[0].grad, g.float())
        flat_low.load_group(0, flat_low.groups[0].grad, g)
        opt_ref.step()
        opt_low.step()
    master = opt_low.master[0]
    ref_w = flat_ref.views([flat_ref.groups[0].param])
    for name, m in flat_low.views([master]).items():
        torch.testing.assert_close(m, ref_w[name], rtol=1e-6, atol=1e-7, msg=name)
    assert torch.equal(flat_low.groups[0].param, master.to(torch.bfloat16))
    ref_ema = flat_ref.views(opt_ref.ema)
    for name, e in flat_low.views(opt_low.ema).items():
        torch.testing.assert_close(e, ref_ema[name], rtol=1e-6, atol=1e-7, msg=name)
    # bf16 rounding of each update would have lost most small steps: the master did not
    assert not torch.equal(master, flat_low.groups[0].param.float())

    state = opt_low.state_dict()
    again = copy.deepcopy(low)
    flat_again = FlatParams(again)
    opt_again = FlatAdam(flat_again, cfg)
    opt_again.load_state_dict(state)
    assert torch.equal(opt_again.master[0], master) and opt_ref.master == [None]


def test_dense_checkpoint_loads_into_aligned_buffers():
    """Optimizer state written before the alignment (parameters packed densely, no "offsets")
    loads parameter by parameter into aligned buffers and continues as the dense run does."""
    torch.manual_seed(3)
    net_dense = _Net()
    net_aligned = copy.deepcopy(net_dense)
    cfg = AdamConfig(lr=1e-2, warmup_steps=2, ema_decay=0.7)
    flat_d = FlatParams(net_dense, align_bytes=1)
    opt_d = FlatAdam(flat_d, cfg)
    for s in range(3):
        flat_d.zero_grad()
        _loss(net_dense, *_data(s)).backward()
        opt_d.step()
    state = opt_d.state_dict()
    del state["offsets"]  # as written by the dense FlatParams of earlier versions
    net_aligned.load_state_dict(net_dense.state_dict())
    flat_a = FlatParams(net_aligned)
    opt_a = FlatAdam(flat_a, cfg)
    opt_a.load_state_dict(state)
    assert opt_a.step_count == 3 and flat_a.offsets() != flat_d.offsets()
    for s in range(3, 5):
        for flat, opt, net in ((flat_d, opt_d, net_dense), (flat_a, opt_a, net_aligned)):
            flat.zero_grad()
            _loss(net, *_data(s)).backward()
            opt.step()
    # the same arithmetic per element; only the global norm's summation order differs
    for (name, p), q in zip(net_dense.named_parameters(), net_aligned.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)
    ema_d, ema_a = opt_d.ema_state_dict(), opt_a.ema_state_dict()
    for name, e in ema_d.items():
        torch.testing.assert_close(ema_a[name], e, rtol=1e-6, atol=1e-7, msg=name)
    assert all(float(t[o + n:o2].abs().sum()) == 0  # gaps of moments and EMA stayed zero
               for t in (*opt_a.exp_avg, *opt_a.exp_avg_sq, *opt_a.ema)
               for o, n, o2 in zip(flat_a.groups[0].offsets,
                                   [math.prod(sh) for sh in flat_a.groups[0].shapes],
                                   flat_a.groups[0].offsets[1:]))
    state["exp_avg"] = [state["exp_avg"][0][:-1]]  # a buffer too short for its layout
    with pytest.raises(ValueError, match="flat buffer 0 holds"):
        FlatAdam(FlatParams(copy.deepcopy(net_aligned)), cfg).load_state_dict(state)


class _AdaNet(nn.Module):
    """AF3's AdaLN beside a plain layer: a parameter layout fold-model has changed since."""

    def __init__(self) -> None:
        super().__init__()
        from fold_model.af3.conditioning import AdaLN

        self.a = nn.Linear(7, 6)
        self.ada = AdaLN(3, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.tanh(self.a(x))  # [B, 6]
        return self.ada(x[:, :3], s)  # [B, 3]


def test_state_saved_under_the_old_adaln_layout_loads_by_name():
    """Moments and EMA written when AdaLN had separate gate and shift layers (old names, packed
    densely in that order) load into the stacked layout, each value where its parameter is
    now; a state that does not convert names what is missing."""
    torch.manual_seed(4)
    net = _AdaNet()
    cfg = AdamConfig(lr=1e-2, warmup_steps=1, ema_decay=0.6)
    flat = FlatParams(net)
    opt = FlatAdam(flat, cfg)
    for s in range(3):
        flat.zero_grad()
        x, y, mask = _data(s)
        (((net(x) - y) ** 2).sum(-1) * mask).sum().backward()
        opt.step()
    old = {key: as_old_adaln(flat.views(getattr(opt, key))) for key in ("exp_avg",
                                                                         "exp_avg_sq", "ema")}
    names = list(old["ema"])
    assert "ada.linear_gate.bias" in names and "ada.gate_bias" not in names
    state = {"step": 3, "layout": [[(n, list(old["ema"][n].shape)) for n in names]],
             **{key: [torch.cat([v[n].reshape(-1) for n in names])] for key, v in old.items()},
             "master": [None]}  # dense, no "offsets": any earlier writer
    again = _AdaNet()
    opt_again = FlatAdam(FlatParams(again), cfg)
    opt_again.load_state_dict(state)
    assert opt_again.step_count == 3
    for key in ("exp_avg", "exp_avg_sq", "ema"):
        want, got = flat.views(getattr(opt, key)), opt_again.flat.views(getattr(opt_again, key))
        for name, t in want.items():
            assert torch.equal(got[name], t), (key, name)
    state["layout"][0][names.index("ada.linear_shift.weight")] = ("ada.shift.weight", [3, 6])
    with pytest.raises(ValueError, match="saved for different parameters: .*missing"):
        FlatAdam(FlatParams(_AdaNet()), cfg).load_state_dict(state)
