"""``fold_train.distributed.layout_context``: a Trainer on the first ranks of a larger world
(torchrun, gloo on CPU). A DAP-2 layout on ranks 0 and 1 of a 3-rank world trains one step with
the same loss and gradient norm as one process on the same batch, with DAO on and off; rank 2 is
in none of its groups."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _train_helpers import NO_DROPOUT, SMALL
from fold_train.config import apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import Trainer

WORKER = Path(__file__).resolve().parent / "_layout_worker.py"


@pytest.mark.distributed
def test_dap_layout_on_two_of_three_ranks_equals_one_process(demo_cache, tmp_path):
    cache_dir, chains = demo_cache
    overrides = [*SMALL, *NO_DROPOUT, "steps=1"]
    cfg = apply_overrides(preset("tiny"), overrides)
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed, workers=0)
    batch, _ = next(stream.batches(1))
    n_cycle = batch["aatype"].shape[1]  # every recycling pass: DAP in the no-grad ones too
    torch.save(batch, tmp_path / "batch.pt")

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "3", str(WORKER), str(tmp_path / "batch.pt"), str(tmp_path), str(n_cycle),
           *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(3)]

    single = Trainer(cfg, tmp_path / "single", None, progress=False)
    ref = single.train_step(batch, n_cycle=n_cycle)
    assert got[2] == {"in_layout": False}
    for g in got[:2]:
        assert g["in_layout"] and g["world_size"] == 2 and g["dp_size"] == 1
        assert g["group"] == g["dap_group"] == [0, 1]  # rank 2 is not a member
        for dao in (True, False):
            step = g[f"dao={dao}"]
            assert step["handles"] == 3  # Evoformer, extra MSA and template pair stacks
            assert step["overlap"] == (dao, dao)
            # fp32 sums in another order (split triangle updates, outer product mean)
            assert step["loss"] == pytest.approx(ref["loss"], rel=1e-5)
            assert step["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
