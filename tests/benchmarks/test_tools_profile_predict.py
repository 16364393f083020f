"""The prediction profile tool (``benchmarks/tools/profile_predict.py``) in its CPU smoke mode:
every piece of an AF3 prediction profiled through the CLI's loader and predictor, and the
kernel names of a real H200 profile tagged with who wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.tools import profile_predict

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, who", [
    ("_bwd_dkdv", "fold"),
    ("_ln_fwd", "fold"),
    ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN", "cublas"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>", "cublas"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>",
     "torch"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "torch"),
    ("Memcpy DtoD (Device -> Device)", "other"),
])
def test_origin(name, who):
    assert profile_predict.origin(name) == who


def test_profile_predict_tiny(tmp_path):
    if not (REPO / "data" / "demo" / "af3" / "ccd.cif").is_file():
        pytest.skip("bundled AF3 demo CCD not found")
    out = tmp_path / "profile.txt"
    text = profile_predict.main(["--tiny", "--device", "cpu", "--top", "5", "--out", str(out)])
    assert out.read_text() == text
    for piece in profile_predict.PIECES:
        section = text.split(f"## {piece}\n", 1)[1].split("\n## ", 1)[0]
        head, *kernels = section.strip().splitlines()
        assert "by origin: torch" in head  # the CPU path is all ATen
        assert 1 <= len(kernels) <= 5 and all("aten::" in k for k in kernels)


def test_profile_predict_stacks_names_the_calling_source(tmp_path):
    """``--stacks`` (graphs off): each piece's ATen ops are listed with the project's source
    line that called them (the sampler step's attention from fold-ops' reference, the
    atom windows' gather from fold-model's embedders)."""
    if not (REPO / "data" / "demo" / "af3" / "ccd.cif").is_file():
        pytest.skip("bundled AF3 demo CCD not found")
    # every op line, not the 40 slowest: which ops make the top 40 of a tiny CPU step depends
    # on the machine's load (CI saw the embedders' gather drop out of it)
    text = profile_predict.main(["--tiny", "--device", "cpu", "--top", "1000", "--stacks"])
    step = text.split("## sampler_step\n", 1)[1]
    by_source = step.split("-- ATen ops by the source line that called them\n", 1)[1]
    lines = by_source.strip().splitlines()
    assert lines and all("aten::" in line for line in lines)
    assert any("fold_ops/reference.py" in line and "attention" in line for line in lines)
    assert any("fold_model/af3/embedders.py" in line for line in lines)
    assert sum(line.rstrip().endswith("?") for line in lines) < len(lines) / 2


def test_a_profile_that_cannot_be_read_is_taken_again(monkeypatch):
    """torch's Python tracer can leave undecodable frame names (a code object freed inside the
    profiled run): the piece is replayed under a fresh profiler, and the error is raised only
    when every try failed."""
    calls = []

    def replay():
        calls.append(1)
        torch.ones(3).add_(1)

    table = profile_predict._kernel_table
    failures = iter([True])

    def flaky(prof, device):
        if next(failures, False):
            raise UnicodeDecodeError("utf-8", b"\xae", 0, 1, "invalid start byte")
        return table(prof, device)

    monkeypatch.setattr(profile_predict, "_kernel_table", flaky)
    text = profile_predict.profile_piece(replay, {}, torch.device("cpu"), 5)
    assert len(calls) == 2 and "aten::add_" in text

    def broken(prof, device):
        raise UnicodeDecodeError("utf-8", b"\xae", 0, 1, "invalid start byte")

    monkeypatch.setattr(profile_predict, "_kernel_table", broken)
    calls.clear()
    with pytest.raises(UnicodeDecodeError):
        profile_predict.profile_piece(replay, {}, torch.device("cpu"), 5)
    assert len(calls) == profile_predict.PROFILE_TRIES
