"""The switch A/B tool (benchmarks/tools/switch_ab.py) on CPU: a smoke run of a training step
and a forward target with a switch off and on. Every row has both settings' rounds and the
ratios, and the switch's own value is restored. On CPU a "replay" is the eager step."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.tools import switch_ab


def test_parse_switch():
    assert switch_ab.parse_switch("FOLD_KERNELS_PDL=0,1") == ("FOLD_KERNELS_PDL", ("0", "1"))
    for bad in ("FOLD_KERNELS_PDL", "FOLD_KERNELS_PDL=1", "=0,1", "X=0,", "X=0,1,2"):
        with pytest.raises(SystemExit, match="NAME=OFF,ON"):
            switch_ab.parse_switch(bad)


def test_smoke_run_writes_both_settings_and_restores_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_KERNELS_PDL", "keep")
    out = tmp_path / "ab.json"
    rows = switch_ab.main(["FOLD_KERNELS_PDL=0,1", "pairformer:5", "fwd pairformer:5",
                           "--rounds", "2", "--reps", "1", "--out", str(out)])
    assert os.environ["FOLD_KERNELS_PDL"] == "keep"
    doc = json.loads(out.read_text())
    assert doc["switch"] == "FOLD_KERNELS_PDL" and doc["values"] == ["0", "1"]
    assert [r["target"] for r in doc["rows"]] == ["pairformer:5", "fwd pairformer:5"] == [
        r["target"] for r in rows]
    for r in doc["rows"]:
        for mode in ("replay_ms", "eager_ms"):
            assert all(len(r[mode][v]) == 2 and min(r[mode][v]) > 0 for v in ("0", "1"))
        assert r["replay_off_over_on"] > 0 and r["eager_off_over_on"] > 0
    assert "| fwd pairformer:5 |" in out.with_suffix(".md").read_text()


def test_bad_forward_target_names_what_is_accepted():
    import torch

    with pytest.raises(SystemExit, match="fwd pairformer:N"):
        switch_ab.steps("fwd evoformer:8,8", torch.device("cpu"))


def test_mask_patterns_of_the_targets():
    """``/padded`` and ``/none`` targets: a padded input's masks (each row keeps a prefix of its
    keys, padded rows nothing) or none; the default keeps the benchmarks' random holes."""
    import torch

    from benchmarks.common import blocks, targets

    g = torch.Generator().manual_seed(0)
    holes = blocks.pattern_mask((1, 20, 30), g, "holes")
    assert not holes.all()
    padded = blocks.pattern_mask((1, 20, 30), torch.Generator().manual_seed(0), "padded")
    assert padded[0, :18, :27].all() and not padded[0, 18:].any() and not padded[:, :, 27:].any()
    assert blocks.pattern_mask((2, 5), g, "none").all()
    tm = blocks.token_mask(10, torch.Generator().manual_seed(0), torch.device("cpu"), "padded")
    assert tm.tolist() == [[1.0] * 9 + [0.0]]
    with pytest.raises(SystemExit, match="holes, padded, none"):
        blocks.pattern_mask((2, 5), g, "random")
    for target in ("pairformer:6/padded", "fwd pairformer:6/none", "attention:4,8,2,8/padded",
                   "evoformer:4,6/padded", "trimul:5,0/padded"):
        step = targets.build(target, torch.device("cpu"), torch.float32)
        step()


def test_mixed_precision_targets():
    """``@mixed``: fp32 parameters and streams under bf16 autocast, whatever dtype is asked for
    (fold-train's precision=bf16); the gradients come back fp32. A wrong suffix is named."""
    import torch

    from benchmarks.common import targets

    loss, tensors = targets.loss_and_tensors("pairformer:5/padded@mixed", torch.device("cpu"),
                                             torch.bfloat16)
    assert all(t.dtype == torch.float32 for t in tensors)
    loss().backward()
    assert all(t.grad is None or t.grad.dtype == torch.float32 for t in tensors)
    assert any(t.grad is not None for t in tensors)
    targets.build("diffusion:5,2@mixed", torch.device("cpu"), torch.bfloat16)()
    with pytest.raises(SystemExit, match="@mixed"):
        targets.loss_and_tensors("pairformer:5@fp8", torch.device("cpu"), torch.float32)


def test_triangle_multiplication_target():
    """``trimul:N,1|0``: the layer's update and z passed on, every parameter with a gradient."""
    import torch

    from benchmarks.common import targets

    for outgoing in (1, 0):
        loss, tensors = targets.loss_and_tensors(f"trimul:6,{outgoing}", torch.device("cpu"),
                                                 torch.float32)
        loss().backward()
        assert tensors[0].shape == (1, 6, 6, 128)
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in tensors)
