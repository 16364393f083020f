"""The AF3 pair-loss benchmark (``benchmarks/model/loss_af3_pairs.py``) in its CPU smoke mode:
dense and sparse smooth lDDT / bond loss / lDDT on the issue-10 synthetic batch (shrunk) agree,
the sparse smooth lDDT saves far less than the dense one, and JSON + Markdown are written."""

from __future__ import annotations

import json

from benchmarks.model import loss_af3_pairs


def test_smoke_mode_dense_equals_sparse_and_saves_less(tmp_path):
    result = loss_af3_pairs.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    rows = {(r["loss"], r["impl"]): r for r in result["rows"]}
    assert result["pairs_unordered"] > 0 and result["nucleotide_atoms"] > 0
    smooth_d, smooth_s = rows["smooth_lddt", "dense"], rows["smooth_lddt", "sparse"]
    # fp32: sums over ~1e5 pairs in different orders
    assert smooth_d["max_abs_value_diff"] < 1e-5 and smooth_d["grad_rel_diff"] < 1e-5
    assert smooth_s["saved_mib"] < 0.2 * smooth_d["saved_mib"]
    assert rows["bond", "dense"]["max_abs_value_diff"] < 1e-5
    assert rows["lddt", "sparse"]["max_abs_value_diff"] < 1e-4  # a step function: rare flips
    saved = json.loads((tmp_path / "loss_af3_pairs_smoke.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    assert (tmp_path / "loss_af3_pairs_smoke.md").read_text().startswith("# AF3 pair losses")
