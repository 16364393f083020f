"""AF3 training at an absurd learning rate reaches the non-finite guard (skipped steps, then a
NonFiniteError naming the limit) instead of crashing in the alignment's SVD, and leaves only
finite checkpoints."""

from __future__ import annotations

import pytest
import torch
from _af3_helpers import needs_af3_demo, train_args
from fold_train.checkpoint import load_checkpoint
from fold_train.cli import main

pytestmark = pytest.mark.slow


def test_lr_1e6_stops_at_the_guard_with_finite_checkpoints(tmp_path, capsys):
    needs_af3_demo()
    run = tmp_path / "run"
    code = main(train_args(run, "steps=8", "checkpoint_every=1", "keep_checkpoints=8",
                           "optim.lr=1e6", "optim.warmup_steps=0", "max_nonfinite_steps=1",
                           cache=tmp_path / "cache"))
    err = capsys.readouterr().err
    assert "LinAlgError" not in err
    assert code == 1 and ("max_nonfinite_steps=1" in err or "parameters are non-finite" in err)
    for path in sorted((run / "checkpoints").glob("step_*.ckpt")):
        weights = load_checkpoint(path)["model"]
        assert all(bool(torch.isfinite(v).all()) for v in weights.values() if v.is_floating_point())
