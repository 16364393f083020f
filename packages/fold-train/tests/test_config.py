"""TrainConfig presets and key=value overrides."""

from __future__ import annotations

import json

import pytest
from fold_train.config import ConfigError, TrainConfig, apply_overrides, preset


def test_presets_follow_af2():
    cfg = preset("af2_initial")
    assert cfg.optim.lr == 1e-3 and cfg.optim.warmup_steps == 1000
    assert cfg.optim.clip_norm == 0.1 and cfg.optim.ema_decay == 0.999
    assert cfg.precision == "bf16"
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
    assert cfg.steps == 7 and cfg.optim.lr == 5e-4 and cfg.optim.ema_decay is None
    assert cfg.precision == "bf16" and cfg.use_kernels is False
    model = cfg.model_config()
    assert model.evoformer.no_blocks == 3 and model.block_order == "parallel"
    assert model.checkpoint_blocks is True
    data = cfg.data_preset()
    assert data.n_res == 48 and data.n_cycle == 2
    # the original preset object is untouched
    assert preset("tiny").steps == 20


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
