"""The AF3 training-iteration benchmark (``benchmarks/train/af3.py``): its synthetic batch
(``benchmarks/common/af3_batch.py``) holds fold-data's AF3 sample contract, its crop search finds
the right size against a known limit, and its CPU smoke mode runs every row and both searches
with finite losses and writes JSON + Markdown.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from benchmarks.common.af3_batch import synthetic_sample
from benchmarks.train import af3 as bench


def test_synthetic_sample_holds_the_af3_contract():
    from fold_data.af3.schema import SAMPLE_FEATURES
    from fold_data.schema import validate

    n = 384
    f = synthetic_sample(n, 12 * n, 9, 4, seed=3)
    validate(f, SAMPLE_FEATURES, where="synthetic", allow_extra=False,
             sizes={"N_token": n, "N_atom": 12 * n, "N_msa": 9, "N_templ": 4})
    real = f["atom_mask"] > 0
    tok = f["atom_to_token"][real]
    assert np.all(np.diff(tok) >= 0) and tok[0] == 0 and tok[-1] == n - 1  # contiguous tokens
    assert 2500 < real.sum() < 12 * n  # a protein-like crop, then padding
    centre = f["token_center_atom"]
    assert np.all(f["atom_to_token"][centre] == np.arange(n))
    names = ["".join(chr(c + 32) for c in f["ref_atom_name_chars"][a]).strip() for a in centre]
    kinds = {"CA": f["is_protein"], "C1'": f["is_dna"]}
    for name, flag in kinds.items():
        assert flag.sum() > 0 and all(names[i] == name for i in np.flatnonzero(flag))
    rep = f["token_pseudo_beta_atom"]  # CB (CA for glycine), C4 / C2, the ligand atom
    assert np.all(f["atom_to_token"][rep] == np.arange(n))
    rep_names = ["".join(chr(c + 32) for c in f["ref_atom_name_chars"][a]).strip() for a in rep]
    gly = f["restype"] == 7
    assert all(rep_names[i] == "CB" for i in np.flatnonzero(f["is_protein"] * ~gly))
    assert all(rep_names[i] == "CA" for i in np.flatnonzero(f["is_protein"] * gly))
    assert {rep_names[i] for i in np.flatnonzero(f["is_dna"])} <= {"C4", "C2"}
    lig = np.flatnonzero(f["is_ligand"])
    assert np.all(rep[lig] == centre[lig])
    assert len(lig) == 16 and np.all(f["is_atomized"][lig] == 1)
    assert np.all(f["token_bonds"] == f["token_bonds"].T) and f["token_bonds"].sum() == 2 * 15
    assert np.allclose(f["profile"].sum(-1), 1.0) and np.all(f["msa"][0] == f["restype"])
    assert f["atom_resolved"][centre].min() == 1.0


@pytest.mark.parametrize("limit,start,expect", [(200, 384, 192), (700, 384, 672),
                                                 (384, 384, 384), (20, 384, None)])
def test_longest_crop_bisects_to_the_resolution(limit, start, expect):
    probed = []

    def probe(n):
        probed.append(n)
        return n <= limit

    res = bench.longest_crop(probe, start, 32, 4096, lambda: False)
    assert res["longest"] == expect and res["complete"]
    assert all(n % 32 == 0 for n in probed) and len(probed) == len(set(probed))
    if expect is not None:
        assert res["first_fail"] == expect + 32 or res["first_fail"] == 2 * expect


def test_longest_crop_stops_on_budget_with_a_bracket():
    calls = []
    res = bench.longest_crop(lambda n: calls.append(n) or n <= 500, 384, 32, 4096,
                             lambda: len(calls) >= 3)
    assert calls == [384, 768, 576] and not res["complete"]
    assert (res["longest"], res["first_fail"]) == (384, 576)


def test_cpu_smoke(tmp_path):
    out = tmp_path / "res" / "train_af3.json"
    torch.manual_seed(0)
    result = bench.main(["--device", "cpu", "--tiny", "--reps", "1", "--max-tokens", "32",
                         "--out", str(out)])
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == [k for k, _, _ in bench.ROWS]
    for r in rows.values():
        assert "error" not in r and r["step_ms"] > 0 and math.isfinite(r["loss"]), r
    # the same training iteration (same seeds): fp32-weight rows agree, bf16 weights stay close
    fp32 = [rows[k]["loss"] for k in ("eager", "kernels", "flat_adam")]
    assert max(fp32) - min(fp32) < 1e-4 * abs(fp32[0])
    for k in ("bf16", "lean_ckpt", "ckpt_plan", "gc_off"):
        assert rows[k]["loss"] == pytest.approx(fp32[0], rel=1e-2)
    # The graphed trainer pads the batch to its shape bucket (192 -> 256 atoms here), so the
    # diffusion noise is drawn over the padded atoms: another draw of the same loss, not the
    # eager step's value (the graphed step equals the eager step on the same padded batch:
    # packages/fold-train/tests/test_cuda_graphs.py).
    assert rows["graphs"]["loss"] == pytest.approx(fp32[0], rel=5e-2)
    assert "run eagerly on CPU" in rows["graphs"]["note"]
    plan = rows["ckpt_plan"]["ckpt_plan"]
    assert plan["pairformer_block_mib"] > 0 and plan["diffusion_block_mib"] > 0
    assert result["optimized_row"] == "graphs" and "schema-checked" in result["batch"]
    for name in ("eager", "optimized"):
        crop = result["crop"][name]
        assert crop["longest"] == 32 and all(p["fits"] for p in crop["probes"])
        assert all(math.isfinite(p["loss"]) for p in crop["probes"])
    assert result["summary"]["crop_ratio"] == 1.0 and result["summary"]["speedup"] > 0
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    md = out.with_suffix(".md").read_text()
    assert "| eager (torch ops" in md and "## Against the goals" in md and "MegaFold" in md


def test_crop_only_searches_the_named_paths(tmp_path):
    out = tmp_path / "crop.json"
    result = bench.main(["--device", "cpu", "--tiny", "--max-tokens", "32", "--out", str(out),
                         "--crop-only", "eager,eager_lean,optimized"])
    assert list(result["crop"]) == ["eager", "eager_lean", "optimized"]
    assert result["crop"]["eager_lean"]["switches"]["lean_ckpt"] is True
    assert result["crop"]["optimized"]["switches"]["graphs"] is False  # probes: does it fit
    for crop in result["crop"].values():
        assert crop["longest"] == 32 and all(math.isfinite(p["loss"]) for p in crop["probes"])
    assert result["crop_ratio"] == 1.0
    assert "| eager_lean | backend torch; lean_ckpt | 32 |" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="unknown crop paths"):
        bench.main(["--device", "cpu", "--tiny", "--crop-only", "fastest"])
