"""TrainConfig presets and key=value overrides."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fold_train.config import (
    FLAT_KEYS,
    SECTIONS,
    ConfigError,
    TrainConfig,
    apply_overrides,
    preset,
)


def test_presets_follow_af2():
    cfg = preset("af2_initial")
    assert cfg.optim.lr == 1e-3 and cfg.optim.warmup_steps == 1000
    assert cfg.optim.clip_norm == 0.1 and cfg.optim.ema_decay == 0.999
    assert cfg.system.precision == "bf16"
    assert cfg.model_config().loss.violation_weight == 0.0
    assert cfg.data_preset().n_res == 256
    fine = preset("af2_finetune")
    assert fine.optim.lr == 5e-4 and fine.model_config().loss.violation_weight == 1.0
    tiny = preset("tiny")
    assert tiny.model_config().evoformer.c_m == 16 and tiny.data_preset().n_res == 64
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")


def test_overrides_are_typed_and_reach_every_config():
    cfg = apply_overrides(preset("tiny"), [
        "steps=7", "optim.lr=5e-4", "optim.ema_decay=none", "precision=bf16",
        "model.evoformer.no_blocks=3", "model.block_order=parallel", "data.n_res=48",
        "max_recycling_iters=1", "use_kernels=false", "activation_checkpointing=true",
    ])
    assert cfg.run.steps == 7 and cfg.optim.lr == 5e-4 and cfg.optim.ema_decay is None
    assert cfg.system.precision == "bf16" and cfg.system.use_kernels is False
    model = cfg.model_config()
    assert model.evoformer.no_blocks == 3 and model.block_order == "parallel"
    assert model.checkpoint_blocks is True
    data = cfg.data_preset()
    assert data.n_res == 48 and data.n_cycle == 2
    # the original preset object is untouched
    assert preset("tiny").run.steps == 20


@pytest.mark.parametrize("item, message", [
    ("steps=many", "steps='many': expected an integer"),
    ("optim.lr=fast", "expected a number"),
    ("precision=fp16", r"expected one of \['fp32', 'bf16'\]"),
    ("gc_off=maybe", "expected a boolean"),
    ("stepz=3", "unknown field 'stepz'"),
    ("model.evoformer.no_blockz=3", "unknown field 'no_blockz' of EvoformerConfig"),
    ("model.evoformer.no_blocks=2.5", "expected an integer"),
    ("data.n_res=big", "expected an integer"),
    ("steps", "expected key=value"),
    ("steps=0", "steps must be >= 1"),
    ("optim.clip_norm=-1", "clip_norm"),
    ("model.block_order=sideways", "block_order"),
])
def test_bad_overrides_are_refused_clearly(item, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(preset("tiny"), [item])


def test_round_trip_through_json():
    cfg = apply_overrides(preset("tiny"), ["model.evoformer.no_blocks=1", "optim.lr=2e-3"])
    back = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg


def test_nested_keys_and_their_flat_names_set_the_same_field():
    nested = apply_overrides(preset("tiny"), [
        "run.steps=7", "system.precision=bf16", "parallel.dap=1", "data.workers=0",
        "data.prefetch=2", "run.max_recycling_iters=1", "system.gc_off=false"])
    flat = apply_overrides(preset("tiny"), [
        "steps=7", "precision=bf16", "dap=1", "loader_workers=0", "prefetch=2",
        "max_recycling_iters=1", "gc_off=false"])
    assert nested == flat
    assert nested.data.workers == 0 and nested.data_preset().max_recycling_iters == 1
    # every flat key names a field of its section
    for old, new in FLAT_KEYS.items():
        section, name = new.split(".")
        assert name in {f.name for f in dataclasses.fields(SECTIONS[section])}, old


@pytest.mark.parametrize("item, message", [
    ("run.preset=af3", "choose it with --preset"),
    ("family=af3", "choose it with --preset"),
    ("model.overrides=1", "use model.<field>"),
    ("system.stepz=1", "unknown field 'stepz' of SystemConfig"),
    ("run=3", "expected run.<field>"),
])
def test_bad_nested_keys_are_refused_clearly(item, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(preset("tiny"), [item])


# The config of a checkpoint written before the sections (flat keys; the AF3 tiny preset).
OLD_FLAT_CONFIG = {
    "preset": "af3_tiny", "family": "af3", "steps": 20, "batch_size": 1, "seed": 3,
    "precision": "fp32", "bf16_weights": False, "max_recycling_iters": None,
    "checkpoint_every": 10, "keep_checkpoints": 2, "log_every": 1, "eval_every": 0,
    "max_nonfinite_steps": 10, "loader_workers": 0, "prefetch": 4,
    "activation_checkpointing": None, "ckpt_memory_fraction": 0.6, "ops_backend": None,
    "tensor_fusion": True, "use_kernels": None, "dap": 1, "bp": 1, "gc_off": True,
    "overlap_clip": True, "compile_structure_module": False, "async_eval": False,
    "cuda_graphs": False,
    "optim": {"lr": 5e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
              "warmup_steps": 5, "decay_factor": 0.95, "decay_every": 50000,
              "clip_norm": 10.0, "ema_decay": 0.9, "averaging": "ema"},
    "model_overrides": {"pairformer.no_blocks": 1}, "data_overrides": {"n_token": 48},
}


def test_a_flat_config_of_an_older_checkpoint_maps_to_the_sections():
    cfg = TrainConfig.from_dict(OLD_FLAT_CONFIG)
    assert cfg == apply_overrides(preset("af3_tiny"), [
        "seed=3", "loader_workers=0", "model.pairformer.no_blocks=1", "data.n_token=48"])
    assert cfg.model.family == "af3" and cfg.run.seed == 3 and cfg.data.workers == 0
    assert cfg.model_config().pairformer.no_blocks == 1 and cfg.data_preset().n_token == 48
    with pytest.raises(ConfigError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({**OLD_FLAT_CONFIG, "stepz": 1})
