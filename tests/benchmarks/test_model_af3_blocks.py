"""The AF3 block benchmark (benchmarks/model/af3_blocks.py) runs end to end on CPU in its tiny
smoke mode and writes its JSON and markdown results."""

from __future__ import annotations

import json
import math

from benchmarks.common import blocks
from benchmarks.model import af3_blocks


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "res" / "af3.json"
    rows = af3_blocks.main(["--device", "cpu", "--tiny", "--compare", "--reps", "1",
                            "--warmup", "0", "--out", str(out)])
    assert len(rows) == 6  # 3 shapes x (auto, torch)
    assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in rows)
    assert json.loads(out.read_text()) == rows
    table = out.with_suffix(".md").read_text()
    assert table.count("| pairformer |") == 4 and "diffusion_transformer" in table


def test_benchmark_graphs_mode_smoke(tmp_path):
    """--graphs (CUDA-graph replay on a GPU) takes the same autograd.grad body eagerly on CPU."""
    rows = af3_blocks.main(["--device", "cpu", "--tiny", "--compare", "--graphs", "--reps", "1",
                            "--blocks", "pairformer:13,diffusion_transformer:13:3"])
    assert [(r["block"], r["backend"], r["graphs"]) for r in rows] == [
        ("pairformer", "auto", True), ("pairformer", "torch", True),
        ("diffusion_transformer", "auto", True), ("diffusion_transformer", "torch", True)]
    assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in rows)


def test_benchmark_random_upstream_gradients(tmp_path):
    """--upstream random: the backward is seeded with fixed random output gradients (the block
    alone); the gradients it returns are those of <out, dY>, unlike the loss mode's."""
    import torch

    rows = af3_blocks.main(["--device", "cpu", "--tiny", "--graphs", "--reps", "1", "--upstream",
                            "random", "--blocks", "pairformer:13"])
    assert rows[0]["upstream"] == "random" and math.isfinite(rows[0]["ms"])
    block, args = blocks.build("pairformer", 13, 1, True, torch.device("cpu"), torch.float64)
    block.eval()  # no dropout: two forwards agree
    grads = blocks.upstream_grads(block, args)
    assert all(g.dtype == torch.float64 and g.abs().sum() > 0 for g in grads)
    got = blocks.backward(block, args, grads, [args[1]])[0]
    s, z = block(*args)
    want = torch.autograd.grad((s * grads[0]).sum() + (z * grads[1]).sum(), args[1])[0]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    from_loss = blocks.backward(block, args, None, [args[1]])[0]
    assert not torch.allclose(from_loss, got)
