"""The demo as a user re-runs it: a second run with fewer steps into the same run directory is
refused without --overwrite, and with it the run directory holds only the new run and the
prediction uses the checkpoint the new run wrote (not an earlier run's higher-numbered one).
The training plot breaks its lines where a step logged no value of a term."""

from __future__ import annotations

import json
import math

import matplotlib
import pytest
from _train_helpers import CHAINS, DEMO, SMALL
from fold_train import cli
from fold_train.plot import plot_metrics


def _two_chain_data(root):
    """A data directory (OpenFold layout) with the two test chains of the bundled demo (every
    mmCIF, for the template hits)."""
    (root / "mmcifs").mkdir(parents=True)
    (root / "alignments").mkdir()
    for cif in (DEMO / "mmcifs").iterdir():
        (root / "mmcifs" / cif.name).symlink_to(cif)
    for chain in CHAINS:
        (root / "alignments" / chain).symlink_to(DEMO / "alignments" / chain)
    return root


def test_demo_rerun_with_fewer_steps(demo_cache, tmp_path, capsys, monkeypatch):
    data = _two_chain_data(tmp_path / "data")
    run = tmp_path / "demo"
    used = []
    real = cli.run_prediction

    def recording(args):  # the checkpoint the demo predicts with
        used.append(args.checkpoint)
        return real(args)

    monkeypatch.setattr(cli, "run_prediction", recording)
    common = ["demo", "--data", str(data), "--cache", demo_cache[0], "--run-dir", str(run),
              "--hold-out", "4zey_A", "--no-progress", "--cache-workers", "1"]
    assert cli.main([*common, "--steps", "3", *SMALL, "checkpoint_every=1",
                     "keep_checkpoints=3"]) == 0
    assert "EMA weights of step 3" in capsys.readouterr().out
    assert used[-1].endswith("step_00000003.ckpt")

    # again with fewer steps, without --overwrite: refused, the earlier run untouched
    metrics = (run / "metrics.jsonl").read_text()
    assert cli.main([*common, "--steps", "2", *SMALL]) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == metrics and len(used) == 1

    # with --overwrite: only the new run's metrics and checkpoints, predicted with step 2's
    assert cli.main([*common, "--steps", "2", "--overwrite", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "EMA weights of step 2" in out
    assert used[-1].endswith("step_00000002.ckpt")
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002.ckpt"]
    assert (run / "predictions" / "4zey_A.cif").stat().st_size > 0


def test_plot_breaks_lines_at_missing_values(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    records = [{"step": 1, "loss": 3.0, "diffusion": 2.0},
               {"step": 2, "loss": 2.5},  # no diffusion term logged at step 2
               {"step": 3, "loss": 2.0, "diffusion": float("nan")},  # not finite
               {"step": 4, "loss": 1.5, "diffusion": 1.0}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    matplotlib.use("Agg")
    plot_metrics(path, tmp_path / "training.png")
    assert (tmp_path / "training.png").stat().st_size > 0
    lines = {ln.get_label(): ln for ln in figures[0].axes[0].lines}
    x, y = lines["diffusion"].get_data()
    assert list(x) == [1, 2, 3, 4]
    # a gap, not a segment from step 1 to step 4
    assert y[0] == 2.0 and math.isnan(y[1]) and math.isnan(y[2]) and y[3] == 1.0
    assert list(lines["loss"].get_data()[1]) == pytest.approx([3.0, 2.5, 2.0, 1.5])
    assert "lddt" not in " ".join(lines)  # nothing logged: no line
