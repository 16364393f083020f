"""Nothing is lost or mixed: a run directory holds one run (refused without --resume /
--overwrite), pruning touches only the run's own checkpoints, no checkpoint is written while
updates are skipped or after the weights went non-finite, resume falls back to the newest valid
checkpoint and cleans stale temporary files, SIGTERM/SIGINT stop after a final checkpoint."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from _train_helpers import SMALL
from fold_train.checkpoint import CheckpointWarning, save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import NonFiniteError, Trainer, TrainingInterrupted


def _trainer(cache, run_dir, extra=()) -> Trainer:
    cache_dir, chains = cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *extra])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, workers=0)
    return Trainer(cfg, run_dir, stream, progress=False)


def _ckpts(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_prune_keeps_what_is_not_this_runs(demo_cache, tmp_path):
    foreign = tmp_path / "checkpoints" / "step_00000009.ckpt"
    save_checkpoint(foreign, {"note": "another run's"})
    _trainer(demo_cache, tmp_path, ["steps=3", "checkpoint_every=1", "keep_checkpoints=1"]).fit()
    # the newest of this run stays (the higher-numbered foreign file used to win), and the
    # foreign file is not this run's to delete
    assert _ckpts(tmp_path) == ["step_00000003.ckpt", "step_00000009.ckpt"]


def _poison_from(trainer: Trainer, step: int) -> None:
    """NaN loss from training step ``step`` on."""
    real = trainer.loss_fn.forward
    calls = {"n": 0}

    def poisoned(out, batch):
        calls["n"] += 1
        loss, terms = real(out, batch)
        if calls["n"] >= step:
            loss = loss * float("nan")
            terms = {**terms, "loss": loss}
        return loss, terms

    trainer.loss_fn.forward = poisoned


def test_no_checkpoint_while_steps_are_skipped(demo_cache, tmp_path, capsys):
    trainer = _trainer(demo_cache, tmp_path, ["steps=4", "checkpoint_every=1",
                                              "keep_checkpoints=1", "max_nonfinite_steps=5"])
    _poison_from(trainer, 2)
    records = trainer.fit()
    assert [r.get("skipped", False) for r in records] == [False, True, True, True]
    # the good checkpoint of step 1 is neither replaced nor pruned
    assert _ckpts(tmp_path) == ["step_00000001.ckpt"]
    good = _trainer(demo_cache, tmp_path, ["steps=4"])
    assert good.resume() == 1
    assert "no checkpoint while updates are being skipped" in capsys.readouterr().out


def test_non_finite_parameters_after_an_update_stop_before_a_checkpoint(demo_cache, tmp_path):
    trainer = _trainer(demo_cache, tmp_path, ["steps=3", "checkpoint_every=1"])
    real_step = trainer.opt.step

    def step_then_blow_up(norm):
        info = real_step(norm)
        if trainer.step == 1:  # the second update leaves a finite loss but NaN weights
            trainer.flat.groups[0].param[0] = float("nan")
        return info

    trainer.opt.step = step_then_blow_up
    with pytest.raises(NonFiniteError, match="parameters are non-finite after the update of "
                                             "step 2"):
        trainer.fit()
    assert _ckpts(tmp_path) == ["step_00000001.ckpt"]
    resumed = _trainer(demo_cache, tmp_path, ["steps=3"])
    assert resumed.resume() == 1  # the kept checkpoint has finite weights
    assert all(bool(torch.isfinite(g.param).all()) for g in resumed.flat.groups)


def test_resume_falls_back_to_the_newest_valid_checkpoint(demo_cache, tmp_path):
    _trainer(demo_cache, tmp_path, ["steps=2", "checkpoint_every=1",
                                    "keep_checkpoints=3"]).fit()
    newest = tmp_path / "checkpoints" / "step_00000002.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])  # cut short
    stale = tmp_path / "checkpoints" / ".step_00000003.ckpt.x1y2.tmp"
    stale.write_bytes(b"half a checkpoint")
    trainer = _trainer(demo_cache, tmp_path, ["steps=3", "checkpoint_every=1",
                                              "keep_checkpoints=3"])
    with pytest.warns(CheckpointWarning, match="step_00000002.ckpt: corrupt checkpoint"):
        assert trainer.resume() == 1
    assert not stale.exists()
    trainer.fit()
    assert _ckpts(tmp_path) == ["step_00000001.ckpt", "step_00000002.ckpt",
                                "step_00000003.ckpt"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_after_the_step_with_a_checkpoint(demo_cache, tmp_path, sig):
    trainer = _trainer(demo_cache, tmp_path, ["steps=5", "checkpoint_every=100"])
    real = trainer.train_step

    def step_then_signal(batch):
        record = real(batch)
        if trainer.step == 2:
            os.kill(os.getpid(), sig)  # a real signal, handled by the trainer
        return record

    trainer.train_step = step_then_signal
    before = signal.getsignal(sig)
    with pytest.raises(TrainingInterrupted, match=f"stopped by {signal.Signals(sig).name} after "
                                                  "step 2") as err:
        trainer.fit()
    assert err.value.signum == sig and signal.getsignal(sig) == before  # handlers restored
    assert _ckpts(tmp_path) == ["step_00000002.ckpt"]
    assert _trainer(demo_cache, tmp_path, ["steps=5"]).resume() == 2


def _train(cache_dir, run, *extra) -> int:
    return main(["train", "--cache", cache_dir, "--run-dir", str(run), "--no-progress", *SMALL,
                 "steps=1", *extra])


def test_a_run_directory_holds_one_run(demo_cache, tmp_path, capsys):
    cache_dir, _ = demo_cache
    run = tmp_path / "run"
    assert _train(cache_dir, run) == 0
    metrics = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _train(cache_dir, run, "optim.lr=1e-4") == 1
    err = capsys.readouterr().err
    assert f"{run} [--run-dir]: already holds a run" in err
    assert "--resume" in err and "--overwrite" in err
    # nothing of the refused run was written
    assert (run / "metrics.jsonl").read_text() == metrics
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] != 1e-4
    assert _train(cache_dir, run, "optim.lr=1e-4", "--overwrite") == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1]  # the new run only
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] == 1e-4
    assert _ckpts(run) == ["step_00000001.ckpt"]
    capsys.readouterr()
    assert _train(cache_dir, run, "--resume", "--overwrite") == 1
    assert "give one of them" in capsys.readouterr().err


def test_a_cache_inside_the_run_directory_is_not_a_run(tmp_path):
    from fold_train.run_dir import prepare_run_dir

    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "index.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()  # empty: nothing to lose
    prepare_run_dir(tmp_path, resume=False, overwrite=False)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert not (tmp_path / "metrics.jsonl").exists()
    assert (tmp_path / "cache" / "index.json").exists()
