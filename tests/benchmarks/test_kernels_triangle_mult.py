"""The triangle multiplication benchmark (benchmarks/kernels/triangle_mult.py) runs end to end on
CPU in its tiny mode (fold alone) and writes its JSON and Markdown; a missing peer is a row's
error text, never a number."""

from __future__ import annotations

import json
import math

from benchmarks.kernels import triangle_mult


def test_tiny_fold_rows_and_results_files(tmp_path):
    out = tmp_path / "tm.json"
    doc = triangle_mult.main(["--device", "cpu", "--tiny", "--reps", "1", "--out", str(out)])
    assert [(r["n"], r["direction"]) for r in doc["rows"]] == [(12, "outgoing"), (12, "incoming")]
    for r in doc["rows"]:
        res = r["results"]["fold"]
        assert "error" not in res and all(math.isfinite(res[m]) and res[m] > 0
                                          for m in ("fwd_ms", "fwd_bwd_ms"))
    assert json.loads(out.read_text())["rows"] == doc["rows"]
    assert "| 12 | outgoing |" in out.with_suffix(".md").read_text()


def test_missing_cueq_is_an_error_not_a_number(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cueq(name, *a, **k):
        if name.startswith("cuequivariance"):
            raise ImportError("no cuequivariance here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cueq)
    doc = triangle_mult.run([8], __import__("torch").device("cpu"), 1, ["fold", "cueq"], n_c=16)
    for r in doc["rows"]:
        assert r["results"]["cueq"]["error"].startswith("not installed")
        assert "fwd_ms" not in r["results"]["cueq"]


def test_every_rows_eager_timings_run_before_any_replay(monkeypatch):
    """Phase one times every row and contender eagerly, phase two captures and replays them; a
    contender not built in phase one is not tried again (a peer's eager step was slower after
    captures in the same process)."""
    import torch

    calls = []

    def fake_measure(fwd, leaves, dout, device, reps, graph=False):
        calls.append(("graph" if graph else "eager", len(leaves)))
        if graph:
            return {"fwd_bwd_graph_ms": 2.0}, None
        return {"fwd_ms": 1.0, "fwd_bwd_ms": 1.5}, fwd().detach().float()

    monkeypatch.setattr(triangle_mult, "measure", fake_measure)
    monkeypatch.setattr(triangle_mult, "phases", lambda device: (False, True))
    monkeypatch.setattr(triangle_mult, "cueq_case", lambda *a: (_ for _ in ()).throw(
        ImportError("no cuequivariance here")))
    doc = triangle_mult.run([8, 10], torch.device("cpu"), 1, ["fold", "cueq"], n_c=16)
    assert [c[0] for c in calls] == ["eager"] * 4 + ["graph"] * 4  # 2 sizes x 2 directions
    for r in doc["rows"]:
        assert r["results"]["fold"] == {"fwd_ms": 1.0, "fwd_bwd_ms": 1.5, "fwd_bwd_graph_ms": 2.0}
        assert r["results"]["cueq"]["error"].startswith("not installed")
