"""The peers' profile tool (benchmarks/tools/profile_peers.py): kernels land in the groups their
names say, the groups add up to the step, and a peer that cannot be built gets its error."""

from __future__ import annotations

import json

import pytest

from benchmarks.common import peer_blocks as pb
from benchmarks.tools import profile_peers as pp

FUSED = "fold's fused elementwise (SwiGLU, gates, residuals)"
TRI = "triangle multiplication (fused)"


@pytest.mark.parametrize("name,group", [
    ("_bwd_dkdv", "attention"), ("_fwd", "attention"), ("_bwd_pre", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN", "GEMM"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "GEMM"), ("aten::bmm", "GEMM"),
    ("_ln_bwd", "LayerNorm"), ("void LayerNormForwardCUDAKernel<float>", "LayerNorm"),
    ("_column_partials", "reductions"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add>",
     "PyTorch elementwise, copies"),
    ("Memcpy DtoD (Device -> Device)", "PyTorch elementwise, copies"),
    ("_swiglu_fwd", FUSED), ("_bdr_bwd", FUSED), ("_fwd_gate", "other"),
    ("_tri_gate_bwd", TRI), ("_tri_proj_fwd", TRI),
    ("kernel_cutlass_kernel_kf_trimul_sm90_training_twoop_cd_aotlnbwdDxLnBwd_object", TRI)])
def test_kernel_names_land_in_their_groups(name, group):
    assert pp.group_of(name) == group


def test_tiny_fold_profile_adds_up_and_is_written(tmp_path):
    out = tmp_path / "res" / "profile.json"
    rows = pp.main(["--device", "cpu", "--tiny", "--blocks", "pairformer:13", "--contenders",
                    "fold", "--warmup", "0", "--top", "5", "--out", str(out)])
    (row,) = rows
    assert "error" not in row and row["contender"] == "fold"
    assert row["total_ms"] == pytest.approx(sum(row["groups_ms"].values()))
    assert row["total_ms"] == pytest.approx(sum(k["ms"] for k in row["kernels"]))
    assert row["groups_ms"]["GEMM"] > 0 and row["groups_ms"]["attention"] > 0
    assert all(k["group"] == pp.group_of(k["name"]) for k in row["kernels"])
    doc = json.loads(out.read_text())
    assert doc["rows"] == rows and doc["mode"] == "train"
    table = out.with_suffix(".md").read_text()
    assert "| total |" in table and "Top kernels, fold:" in table


def test_a_peer_that_cannot_be_built_gets_its_error(monkeypatch):
    def missing(*args, **kwargs):
        raise ImportError("No module named 'boltz'")

    monkeypatch.setattr(pb, "build_boltz", missing)
    rows = pp.main(["--device", "cpu", "--tiny", "--blocks", "diffusion:13x3", "--contenders",
                    "fold,boltz", "--warmup", "0", "--mode", "fwd"])
    fold, *boltz = rows
    assert fold["total_ms"] > 0
    assert boltz and all("No module named 'boltz'" in r["error"] and "total_ms" not in r
                         for r in boltz)


def test_a_result_is_regrouped_without_profiling(tmp_path, monkeypatch):
    first = tmp_path / "first.json"
    pp.main(["--device", "cpu", "--tiny", "--blocks", "pairformer:13", "--contenders", "fold",
             "--warmup", "0", "--out", str(first)])
    doc = json.loads(first.read_text())
    for k in doc["rows"][0]["kernels"]:  # as an older grouping left them
        k["group"] = "other"
    first.write_text(json.dumps(doc))
    monkeypatch.setattr(pp, "profile_case", None)  # no profiling: a call would fail
    again = tmp_path / "again.json"
    (row,) = pp.main(["--regroup", str(first), "--out", str(again)])
    assert all(k["group"] == pp.group_of(k["name"]) for k in row["kernels"])
    assert row["groups_ms"]["GEMM"] > 0
    assert json.loads(again.read_text())["rows"] == [row]


def test_eager_profiles_say_so(tmp_path, monkeypatch):
    def no_capture(*args, **kwargs):
        raise AssertionError("an eager profile captures no graph")

    monkeypatch.setattr(pp, "capture", no_capture)
    out = tmp_path / "eager.json"
    (row,) = pp.main(["--device", "cpu", "--tiny", "--blocks", "pairformer:13", "--contenders",
                      "fold", "--warmup", "0", "--eager", "--out", str(out)])
    assert "error" not in row and row["total_ms"] > 0
    assert json.loads(out.read_text())["eager"] is True
