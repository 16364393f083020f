"""AutoChunk in prediction: budgets, chunked stacks giving the same structure as unchunked ones
on a bundled real chain (fp32), and ``fold-train predict --autochunk``."""

from __future__ import annotations

import json

import fold_chunk
import gemmi
import numpy as np
import pytest
import torch
from _train_helpers import DEMO
from fold_train.autochunk import AutoChunkedStack, enable_autochunk, parse_memory_budget
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.config import preset
from fold_train.loop import CHECKPOINT_FORMAT
from fold_train.predict import load_trained_model, make_raw_features, predict_structure

MMCIF = DEMO / "mmcifs" / "1psm.cif"
MSA = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"


def test_parse_memory_budget():
    assert parse_memory_budget("auto") == "auto" and parse_memory_budget(" AUTO ") == "auto"
    assert parse_memory_budget("1500000") == 1_500_000
    assert parse_memory_budget("1.5e6") == 1_500_000
    assert parse_memory_budget("512MiB") == 512 * 2**20
    assert parse_memory_budget("2 GB") == 2 * 10**9
    assert parse_memory_budget("1.5GiB") == 3 * 2**29
    for bad in ("", "lots", "5x", "-3", "0", "12 parsecs"):
        with pytest.raises(ValueError, match="memory budget"):
            parse_memory_budget(bad)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny AF2 with random weights saved as a checkpoint, 1PSM chain A's features, the
    unchunked prediction and the stacks' example inputs."""
    if not MSA.exists():
        pytest.skip("bundled demo data not found")
    torch.set_num_threads(1)
    cfg = preset("tiny")
    torch.manual_seed(7)
    from fold_model.af2 import AlphaFold2

    model = AlphaFold2(cfg.model_config())
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(),
                           "model": {k: v.clone() for k, v in model.state_dict().items()}})
    model, cfg = load_trained_model(path)
    name, raw, _ = make_raw_features(mmcif=MMCIF, chain="A", msas=[MSA])
    inputs: dict[str, tuple] = {}
    hooks = [getattr(model, s).register_forward_hook(
        lambda mod, args, out, s=s: inputs.setdefault(s, args) and None)
        for s in ("evoformer", "extra_msa_stack")]
    ref = predict_structure(model, raw, cfg.data_preset())
    for h in hooks:
        h.remove()
    budget, peaks = _budget_between(model, inputs)
    return path, raw, cfg, ref, inputs, budget, peaks


def _budget_between(model, inputs) -> tuple[int, dict[str, int]]:
    """A budget that forces chunking in both stacks yet is reachable by both."""
    peaks, floors = {}, {}
    for s in ("evoformer", "extra_msa_stack"):
        peaks[s] = fold_chunk.estimate_peak_memory(getattr(model, s), inputs[s])
        floors[s] = fold_chunk.smallest_reachable_peak(getattr(model, s), inputs[s])
    budget = max(floors.values()) + (min(peaks.values()) - max(floors.values())) // 4
    assert budget < min(peaks.values())
    return budget, peaks


def test_autochunked_prediction_equals_unchunked(setup):
    path, raw, cfg, ref, inputs, budget, peaks = setup
    model, _ = load_trained_model(path)
    wrappers = enable_autochunk(model, budget)
    assert [type(w) for w in wrappers] == [AutoChunkedStack] * 2
    pred = predict_structure(model, raw, cfg.data_preset())
    for w, s in zip(wrappers, ("evoformer", "extra_msa_stack")):
        report = w.report
        assert len(report.regions) >= 1, s
        assert report.estimated_peak_before == peaks[s]
        assert report.simulated_peak_after <= budget < report.estimated_peak_before
    # chunking only splits independent rows: the same structure to fp32 rounding
    np.testing.assert_allclose(pred.positions, ref.positions, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(pred.plddt, ref.plddt, rtol=1e-5, atol=1e-4)
    assert np.isfinite(pred.positions).all()
    # the plan is made once and reused by every recycling pass and the next prediction
    plans = [w._chunked._plans for w in wrappers]
    assert [len(p) for p in plans] == [1, 1]
    with pytest.raises(ValueError, match="already AutoChunked"):
        enable_autochunk(model, budget)
    with pytest.raises(ValueError, match="alternatives"):
        model.set_chunk_size(8)
    model.train()
    with pytest.raises(RuntimeError, match="for inference"):
        model.evoformer(*inputs["evoformer"])


def test_predict_cli_autochunk(setup, tmp_path, capsys):
    path, _, _, ref, _, budget, _ = setup
    base = ["predict", "--checkpoint", str(path), "--mmcif", str(MMCIF), "--chain", "A",
            "--msa", str(MSA), "--no-ema"]
    out = tmp_path / "chunked.cif"
    assert main([*base, "--out", str(out), "--autochunk", str(budget)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for s in ("evoformer", "extra_msa_stack"):
        info = summary["autochunk"][s]
        assert info["budget_bytes"] == budget and info["regions"] >= 1
        assert info["estimated_peak_after"] <= budget < info["estimated_peak_before"]
    ca = np.array([[a.pos.x, a.pos.y, a.pos.z] for r in gemmi.read_structure(str(out))[0]["A"]
                   for a in r if a.name == "CA"])
    np.testing.assert_allclose(ca, ref.positions[:, 1], atol=2e-3)  # mmCIF keeps 3 decimals

    assert main([*base, "--out", str(tmp_path / "auto.cif"), "--autochunk", "auto"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["autochunk"]["evoformer"]["budget_bytes"] > 0

    assert main([*base, "--autochunk", "1KiB", "--out", str(tmp_path / "x.cif")]) == 1
    assert "cannot be met; the smallest reachable estimated peak" in capsys.readouterr().err
    assert main([*base, "--autochunk", "1GiB", "--chunk-size", "4"]) == 2
    assert "--autochunk and --chunk-size are alternatives" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main([*base, "--autochunk", "lots"])
    assert info.value.code == 2
    assert "memory budget 'lots'" in capsys.readouterr().err
