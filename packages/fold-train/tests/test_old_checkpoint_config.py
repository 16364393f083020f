"""A checkpoint written before the config had sections stores the flat config; it still loads:
each flat key maps to its section (``fold_train.config.FLAT_KEYS``), for prediction and for
``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _train_helpers import SMALL, as_old_adaln
from fold_train.checkpoint import load_checkpoint, save_checkpoint
from fold_train.cli import main
from fold_train.config import FLAT_KEYS, apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.families import make_family
from fold_train.loop import Trainer
from fold_train.predict import load_trained_model


def _flat(nested: dict) -> dict:
    """The config as fold-train wrote it before the sections (``optim`` was already nested)."""
    flat = {"optim": nested["optim"]}
    for old, new in FLAT_KEYS.items():
        section, name = new.split(".")
        flat[old] = nested[section][name]
    return flat


def test_prediction_from_a_checkpoint_with_a_flat_config(tmp_path, capsys):
    cfg = apply_overrides(preset("tiny"), [*SMALL, "seed=5", "precision=fp32"])
    torch.manual_seed(0)
    model = make_family("af2", cfg.model_config()).build_model(cfg.model_config())
    path = save_checkpoint(tmp_path / "old.ckpt", {"config": _flat(cfg.to_dict()),
                                                   "model": model.state_dict()})
    assert "run" not in load_checkpoint(path)["config"]  # really the old form
    loaded, loaded_cfg = load_trained_model(path)
    assert loaded_cfg == cfg
    fasta = tmp_path / "q.fasta"
    fasta.write_text(">q\nMKTAYIAKQRQISFVKSHFSRQ\n")
    out = tmp_path / "q.cif"
    assert main(["predict", "--checkpoint", str(path), "--device", "cpu", "--fasta", str(fasta),
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert Path(summary["out"]) == out and out.exists()


def _trainer(cache, run_dir, extra) -> Trainer:
    cache_dir, chains = cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *extra])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed, workers=0)
    return Trainer(cfg, run_dir, stream, progress=False)


def test_resume_from_a_checkpoint_with_a_flat_config(demo_cache, tmp_path):
    first = _trainer(demo_cache, tmp_path / "a", ["steps=2", "checkpoint_every=1"])
    first.fit(stop_at=1)
    path = sorted((tmp_path / "a" / "checkpoints").glob("step_*.ckpt"))[-1]
    state = load_checkpoint(path)
    state["config"] = _flat(state["config"])
    old = save_checkpoint(tmp_path / "old.ckpt", state)
    second = _trainer(demo_cache, tmp_path / "b", ["steps=2", "checkpoint_every=1"])
    assert second.resume(old) == 1
    records = second.fit()
    assert [r["step"] for r in records] == [2]


def test_af3_checkpoint_with_separate_adaln_layers_predicts_with_its_ema(tmp_path):
    """An AF3 checkpoint written when AdaLN had separate gate and shift layers: the weights load
    through AdaLN's pre-hook and the averaged weights (flat buffers under the old names, which
    prediction uses) by name, each value where its parameter is now."""
    cfg = apply_overrides(preset("af3_tiny"), [])
    torch.manual_seed(0)
    model = make_family("af3", cfg.model_config()).build_model(cfg.model_config())

    ema = {n: p.detach() + 0.25 for n, p in model.named_parameters()}  # unlike the live weights
    old_ema = as_old_adaln(ema)
    names = list(old_ema)
    optimizer = {"step": 1, "layout": [[(n, list(old_ema[n].shape)) for n in names]],
                 "ema": [torch.cat([old_ema[n].reshape(-1) for n in names])]}
    path = save_checkpoint(tmp_path / "old_af3.ckpt", {
        "config": cfg.to_dict(), "model": as_old_adaln(dict(model.state_dict())),
        "optimizer": optimizer})
    assert any(k.endswith("linear_gate.weight") for k in load_checkpoint(path)["model"])
    loaded, _ = load_trained_model(path, family="af3")
    for name, p in loaded.named_parameters():
        assert torch.equal(p, ema[name]), name
