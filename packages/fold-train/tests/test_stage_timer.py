"""The summary's per-stage seconds: stages add up across calls and ``take`` starts over."""

from __future__ import annotations

import time

import pytest
from fold_train.stage_timer import StageTimer


def test_stages_add_up_and_take_starts_over():
    timer = StageTimer()
    with timer("model"):
        time.sleep(0.01)
    with timer("model"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError), timer("write"):  # a failing stage is still counted
        raise RuntimeError("disk full")
    got = timer.take()
    assert set(got) == {"model", "write"} and got["model"] >= 0.02
    assert timer.take() == {}
