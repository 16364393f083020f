"""``activation_checkpointing=auto`` (fold_train.ckpt_plan) and the other switches of the
benchmarks as TrainConfig options: the plan for a given memory budget, the same training with
and without checkpointing, the options parsed and validated, ``tensor_fusion=false`` as the
flat optimizer's arithmetic, ``ops_backend`` in force during backward."""

from __future__ import annotations

import math

import pytest
import torch
from _train_helpers import NO_DROPOUT, SMALL
from fold_train.ckpt_plan import (
    CheckpointPlan,
    SavedTensorMemory,
    choose_uncheckpointed,
    plan_checkpointing,
)
from fold_train.config import ConfigError, apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import Trainer

MIB = 2**20


# -- the choice and the procedure, on a model whose memory is known ---------------------------
def test_choice_fills_the_room_stack_by_stack():
    stacks = [("pairformer", 10, 100.0), ("diffusion", 5, 30.0)]
    assert choose_uncheckpointed(stacks, 1000, 1650) == {"pairformer": 6, "diffusion": 1}
    assert choose_uncheckpointed(stacks, 1000, 5000) == {"pairformer": 10, "diffusion": 5}
    assert choose_uncheckpointed(stacks, 1000, 900) == {"pairformer": 0, "diffusion": 0}
    inf = [("pairformer", 10, float("inf")), ("diffusion", 5, 30.0)]
    assert choose_uncheckpointed(inf, 1000, 1100) == {"pairformer": 0, "diffusion": 3}


class _FakeModel:
    """Stacks whose exempt blocks cost known bytes; ``extra`` bytes appear only when both
    stacks are exempt together (a peak the per-stack probes cannot see)."""

    def __init__(self, extra: int = 0) -> None:
        self.counts = {"pairformer": 0, "diffusion": 0}
        self.extra = extra

    def checkpointed_stacks(self):
        return {"pairformer": 24, "diffusion": 12}

    def set_uncheckpointed_blocks(self, **counts):
        self.counts.update(counts)

    def bytes(self) -> int:
        c = self.counts
        both = self.extra if c["pairformer"] and c["diffusion"] else 0
        return 1000 * MIB + c["pairformer"] * 50 * MIB + c["diffusion"] * 20 * MIB + both


class _FakeMemory:
    def __init__(self, model: _FakeModel, budget: int, oom_above: int | None = None) -> None:
        self.model, self._budget, self.oom_above, self.calls = model, budget, oom_above, []

    def budget(self) -> int:
        return self._budget

    def measure(self, step) -> int:
        step()
        used = self.model.bytes()
        self.calls.append(dict(self.model.counts))
        if self.oom_above is not None and used > self.oom_above:
            raise torch.cuda.OutOfMemoryError("fake")
        return used


def test_plan_for_a_given_budget():
    model = _FakeModel()
    memory = _FakeMemory(model, budget=1000 * MIB + 560 * MIB)
    plan = plan_checkpointing(model, lambda: None, memory, device_type="cpu")
    # probes: 2 Pairformer blocks (24 // 12), 1 diffusion block
    assert memory.calls[:3] == [{"pairformer": 0, "diffusion": 0},
                                {"pairformer": 2, "diffusion": 0},
                                {"pairformer": 0, "diffusion": 1}]
    assert plan.per_block_bytes == {"pairformer": 50 * MIB, "diffusion": 20 * MIB}
    # 560 MiB of room: 11 Pairformer blocks (550 MiB), then no diffusion block (20 > 10)
    assert plan.uncheckpointed == {"pairformer": 11, "diffusion": 0} == model.counts
    assert plan.final_bytes == 1550 * MIB and plan.final_bytes <= plan.budget_bytes
    d = plan.to_dict()
    assert d["no_ckpt_pairformer"] == 11 and d["pairformer_block_mib"] == 50
    assert d["headroom_mib"] == 560 and "11 of 24 pairformer" in plan.describe()


def test_plan_scales_down_by_the_overshoot_or_halves_after_out_of_memory():
    model = _FakeModel(extra=400 * MIB)  # exempting both stacks costs 400 MiB more
    memory = _FakeMemory(model, budget=1000 * MIB + 24 * 50 * MIB + 100 * MIB)
    plan = plan_checkpointing(model, lambda: None, memory, device_type="cpu")
    # 24/5 measures 2700 MiB against 2300: room 1300 of 1700 used above the base -> x0.765:
    # 18/3 (2360 MiB, over) -> x1300/1360: 17/2 (2290 MiB, fits). Halving would stop at 12/2.
    assert [(t["pairformer"], t["diffusion"], t["mib"]) for t in plan.tried] == [
        (24, 5, 2700), (18, 3, 2360), (17, 2, 2290)]
    assert plan.uncheckpointed == {"pairformer": 17, "diffusion": 2}
    assert plan.final_bytes == 2290 * MIB <= plan.budget_bytes
    model = _FakeModel()
    memory = _FakeMemory(model, budget=10_000 * MIB, oom_above=1000 * MIB + 300 * MIB)
    plan = plan_checkpointing(model, lambda: None, memory, device_type="cpu")
    assert [t["mib"] for t in plan.tried[:-1]] == [None] * (len(plan.tried) - 1)
    # 24/12 -> 12/6 -> 6/3 (360 MiB over the 300 MiB limit) -> 3/1
    assert plan.uncheckpointed == {"pairformer": 3, "diffusion": 1}
    assert model.bytes() <= memory.oom_above


def test_nothing_to_plan_without_checkpointing():
    class NoCkpt(_FakeModel):
        def checkpointed_stacks(self):
            return {}

    model = NoCkpt()
    plan = plan_checkpointing(model, lambda: None, _FakeMemory(model, 10**12), device_type="cpu")
    assert plan.uncheckpointed == {} and plan.tried == [] and plan.final_bytes == 1000 * MIB


# -- through the Trainer, on the tiny AF2 -------------------------------------------------------
def _cfg(*extra: str):
    return apply_overrides(preset("tiny"), [*SMALL, "model.evoformer.no_blocks=3",
                                            "model.extra_msa.no_blocks=2", *extra])


def _trainer(cache, run_dir, cfg, **kw) -> Trainer:
    cache_dir, chains = cache
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, workers=0)
    return Trainer(cfg, run_dir, stream, progress=False, **kw)


def _batch(cache, cfg):
    cache_dir, chains = cache
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed, workers=0)
    batch, _ = next(stream.batches(1))
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def _step(trainer: Trainer, batch, n_cycle: int = 2):
    """One optimizer step in float64; the loss and every gradient before the update."""
    trainer.model.double()
    grads = {}
    handles = [p.register_hook(lambda g, n=n: grads.__setitem__(n, g.detach().clone()))
               for n, p in trainer.model.named_parameters()]
    loss, _, _ = trainer._forward_backward(batch, n_cycle)
    for h in handles:
        h.remove()
    return float(loss), grads


@pytest.mark.parametrize("ckpt", ["false", "true", "partial"])
def test_same_loss_and_gradients_with_and_without_checkpointing(demo_cache, tmp_path, ckpt):
    """float64, dropout on (checkpoint replays the RNG): every block recomputed, none, or all
    but the last of each stack give the loss and every gradient of the plain model."""
    extra = {"false": ["activation_checkpointing=false"],
             "true": ["activation_checkpointing=true"],
             "partial": ["activation_checkpointing=true", "model.uncheckpointed_blocks=1",
                         "model.uncheckpointed_extra_msa_blocks=1"]}[ckpt]
    results = []
    for overrides in (["activation_checkpointing=false", "tensor_fusion=false"],
                      [*extra, "tensor_fusion=false"]):
        cfg = _cfg(*overrides)
        trainer = _trainer(demo_cache, tmp_path / str(len(results)), cfg)
        torch.manual_seed(7)
        results.append(_step(trainer, _batch(demo_cache, cfg)))
    (loss_a, g_a), (loss_b, g_b) = results
    assert math.isfinite(loss_a) and abs(loss_b - loss_a) <= 1e-12 * abs(loss_a)
    assert set(g_a) == set(g_b) and len(g_a) > 50
    for name, g in g_a.items():
        assert torch.isfinite(g).all(), name
        assert (g_b[name] - g).norm() <= 1e-9 * g.norm() + 1e-300, name


def test_auto_plans_from_the_injected_memory_and_trains_as_the_plan(demo_cache, tmp_path):
    """auto with a budget of the fully checkpointed step plus 1.5 Evoformer blocks: one
    Evoformer block exempt, then no extra MSA block (each costs more than what is left); the
    step then equals a run given that plan as a setting (planning leaves RNG and gradients)."""
    base_cfg = _cfg("activation_checkpointing=true")
    batch = _batch(demo_cache, base_cfg)
    batch = {k: v.float() if v.is_floating_point() else v for k, v in batch.items()}
    probe = _trainer(demo_cache, tmp_path / "probe", base_cfg)
    memory = SavedTensorMemory(0)

    def run():
        probe._forward_backward(batch, 1)

    base = memory.measure(run)
    probe.model.set_uncheckpointed_blocks(evoformer=1)
    evo_block = memory.measure(run) - base
    probe.model.set_uncheckpointed_blocks(evoformer=0, extra_msa=1)
    extra_block = memory.measure(run) - base
    assert evo_block > 0 and extra_block > 0.5 * evo_block

    cfg = _cfg("activation_checkpointing=auto")
    assert cfg.model_config().checkpoint_blocks is False  # tiny: the preset's (off) ...
    cfg = _cfg("activation_checkpointing=auto", "model.checkpoint_blocks=true")  # ... so on
    auto = _trainer(demo_cache, tmp_path / "auto", cfg,
                    ckpt_memory=SavedTensorMemory(base + int(1.5 * evo_block)))
    rec_auto = auto.train_step(batch, n_cycle=2)
    plan = auto.ckpt_plan
    assert isinstance(plan, CheckpointPlan)
    assert plan.uncheckpointed == {"evoformer": 1, "extra_msa": 0}
    assert auto.model.uncheckpointed_blocks() == {"evoformer": 1, "extra_msa": 0}
    assert plan.per_block_bytes["evoformer"] == evo_block and plan.base_bytes == base
    given = _trainer(demo_cache, tmp_path / "given",
                     _cfg("activation_checkpointing=true", "model.uncheckpointed_blocks=1"))
    rec_given = given.train_step(batch, n_cycle=2)
    assert rec_auto["loss"] == rec_given["loss"] and rec_auto["n_cycle"] == 2
    assert torch.equal(auto.flat.groups[0].param, given.flat.groups[0].param)


def test_auto_on_cpu_keeps_the_presets_checkpointing(demo_cache, tmp_path):
    cfg = _cfg("activation_checkpointing=auto", "model.checkpoint_blocks=true")
    trainer = _trainer(demo_cache, tmp_path, cfg)
    batch = {k: v.float() if v.is_floating_point() else v
             for k, v in _batch(demo_cache, cfg).items()}
    record = trainer.train_step(batch)
    assert math.isfinite(record["loss"]) and trainer.ckpt_plan is None
    assert trainer.model.checkpointed_stacks() == {"evoformer": 3, "extra_msa": 2}
    assert trainer.model.uncheckpointed_blocks() == {"evoformer": 0, "extra_msa": 0}


# -- the options ------------------------------------------------------------------------------
def test_switch_options_parse_and_validate():
    cfg = apply_overrides(preset("af2_initial"), [
        "activation_checkpointing=auto", "ckpt_memory_fraction=0.5", "ops_backend=auto",
        "tensor_fusion=false", "model.uncheckpointed_blocks=38"])
    assert cfg.system.activation_checkpointing == "auto"
    assert cfg.system.ckpt_memory_fraction == 0.5
    assert cfg.model_config().checkpoint_blocks is True  # auto: the preset's, then planned
    assert cfg.model_config().uncheckpointed_blocks == 38
    assert apply_overrides(preset("tiny"), ["activation_checkpointing=on"]) \
        .system.activation_checkpointing is True  # booleans as before
    assert apply_overrides(preset("tiny"), ["ops_backend=attention=triton,layer_norm=torch"]) \
        .system.ops_backend == "attention=triton,layer_norm=torch"
    af3 = apply_overrides(preset("af3"), ["activation_checkpointing=auto",
                                          "model.uncheckpointed_diffusion_blocks=3"])
    assert af3.model_config().checkpoint is True
    assert af3.model_config().uncheckpointed_diffusion_blocks == 3
    bad = {
        "activation_checkpointing=sometimes": "expected true / false or auto or none",
        "ckpt_memory_fraction=1.5": "ckpt_memory_fraction must be in",
        "ops_backend=attenton=triton": "op=backend pairs",
        "ops_backend=,": "expected a backend",
        "model.uncheckpointed_blocks=49": "uncheckpointed_blocks must be in 0..48",
    }
    for item, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            apply_overrides(preset("af2_initial"), [item])
    for items, message in (
            (["activation_checkpointing=auto", "dap=2"], "auto with dap/bp > 1"),
            (["tensor_fusion=false", "cuda_graphs=true"], "does not go with cuda_graphs"),
            (["tensor_fusion=false", "bf16_weights=true"], "does not go with bf16_weights")):
        with pytest.raises(ConfigError, match=message):
            apply_overrides(preset("af2_initial"), items)


def test_tensor_fusion_off_is_the_flat_optimizers_arithmetic(demo_cache, tmp_path):
    """Two steps with torch.optim.Adam + clipping + EMA per tensor, and with FlatAdam over flat
    buffers: the same weights and EMA (fp32: the update order of additions differs)."""
    states = {}
    for fusion in ("true", "false"):
        cfg = _cfg(*NO_DROPOUT, f"tensor_fusion={fusion}", "optim.warmup_steps=0")
        trainer = _trainer(demo_cache, tmp_path / fusion, cfg)
        batch = {k: v.float() if v.is_floating_point() else v
                 for k, v in _batch(demo_cache, cfg).items()}
        records = trainer.run_steps([batch, batch], n_cycle=2)
        assert all(not r.get("skipped") for r in records)
        with trainer.opt.swap_ema():
            ema = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        states[fusion] = ({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                          ema, [r["loss"] for r in records], [r["grad_norm"] for r in records])
    (w_a, e_a, l_a, n_a), (w_b, e_b, l_b, n_b) = states["true"], states["false"]
    assert l_a == pytest.approx(l_b, rel=1e-5) and n_a == pytest.approx(n_b, rel=1e-5)
    for name in w_a:
        assert torch.allclose(w_b[name], w_a[name], rtol=1e-5, atol=1e-6), name
        assert torch.allclose(e_b[name], e_a[name], rtol=1e-5, atol=1e-6), name


def test_ops_backend_holds_during_the_step_and_backward(demo_cache, tmp_path, monkeypatch):
    """ops_backend is what fold-model's registry reads on every dispatch, forward and backward
    (autograd's threads included), and is restored after the step."""
    from fold_model.ops import registry

    seen = []
    real = registry._requested

    def spy(op):
        seen.append((op, real(op), torch.is_grad_enabled()))
        return real(op)

    monkeypatch.delenv("FOLD_OPS_BACKEND", raising=False)
    monkeypatch.setattr(registry, "_requested", spy)
    cfg = _cfg("ops_backend=torch", "activation_checkpointing=true")
    trainer = _trainer(demo_cache, tmp_path, cfg)
    batch = {k: v.float() if v.is_floating_point() else v
             for k, v in _batch(demo_cache, cfg).items()}
    trainer.train_step(batch, n_cycle=1)
    assert seen and all(name == "torch" for _, name, _ in seen)
    assert registry._requested("attention") == "auto"  # restored
    with pytest.raises(ValueError, match="n_cycle must be in 1..2"):
        trainer.train_step(batch, n_cycle=3)


def test_a_trainer_without_stream_trains_on_given_batches_only(demo_cache, tmp_path):
    cfg = _cfg("gc_off=true")
    trainer = Trainer(cfg, tmp_path, None, progress=False)
    batch = _batch(demo_cache, cfg)
    batch = {k: v.float() if v.is_floating_point() else v for k, v in batch.items()}
    import gc

    assert gc.isenabled()
    records = trainer.run_steps([batch], n_cycle=1)
    assert gc.isenabled() and len(records) == 1 and records[0]["n_cycle"] == 1
    with pytest.raises(ValueError, match="needs a sample stream"):
        trainer.fit()
