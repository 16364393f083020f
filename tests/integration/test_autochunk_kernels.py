"""AutoChunk's generated code runs fold-kernels' Triton kernels (the ops of the contract are leaf
nodes of the traced graphs and dispatch at run time): an autochunked extra MSA block (the
stack whose reference attention logits broke ``predict --autochunk`` on GPUs) calls the
kernels with chunk-sized inputs and equals the float64 torch path.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by the
noxfile) and the registry's Triton backend is told that CPU tensors are fine, as in
``test_kernels_in_blocks.py``. On a GPU (``-m gpu``) the second test also measures the chunked
block's peak at a real size against AutoChunk's estimate, which counts the kernels' memory.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "fold-model" / "tests"))
from _trunk_helpers import holes, randomize_, rel_err  # noqa: E402

fold_kernels = pytest.importorskip("fold_kernels")
fold_chunk = pytest.importorskip("fold_chunk")
from _triton_backend import DEVICE, register_triton  # noqa: E402
from fold_model import ops  # noqa: E402
from fold_model.af2.evoformer import ExtraMsaBlock  # noqa: E402
from fold_model.ops import registry  # noqa: E402

ATTENTION = ("attention", "attention_packed", "triangle_attention")


@pytest.fixture
def kernel_calls(monkeypatch):
    """The Triton backend registered (on CPU: told CPU tensors are fine), its attention
    implementations wrapped to record the shape of their first argument."""
    register_triton(monkeypatch)
    calls: list[tuple[str, tuple[int, ...]]] = []
    for name in ATTENTION:
        impl = registry._STATE.impls[name]["triton"]

        def recording(*args, _fn=impl.fn, _name=name, **kwargs):
            calls.append((_name, tuple(args[0].shape)))
            return _fn(*args, **kwargs)

        monkeypatch.setattr(impl, "fn", recording)
    return calls


def _block(c_e: int, c_z: int, heads: int, hidden: int):
    torch.manual_seed(0)
    block = ExtraMsaBlock(c_m=c_e, c_z=c_z, c_hidden_msa_att=hidden, no_heads_msa=heads,
                          c_hidden_opm=hidden, c_hidden_mul=2 * hidden, c_hidden_pair_att=hidden,
                          no_heads_pair=heads, transition_n=2, msa_dropout=0.15,
                          pair_dropout=0.25)
    return randomize_(block).eval()


def _inputs(n_seq: int, n_res: int, c_e: int, c_z: int, device=DEVICE):
    g = torch.Generator().manual_seed(1)
    m = torch.randn(n_seq, n_res, c_e, generator=g)
    z = torch.randn(n_res, n_res, c_z, generator=g)
    msa_mask = holes((n_seq, n_res), seed=2)
    seq = holes((n_res,), seed=3)
    return [t.to(device) for t in (m, z, msa_mask, seq[:, None] * seq[None, :])]


def test_autochunked_extra_msa_block_calls_the_kernels_in_chunks(kernel_calls):
    n_seq, n_res, c_e, c_z = 13, 11, 16, 8
    block = _block(c_e, c_z, heads=2, hidden=8)
    ref = copy.deepcopy(block).double()
    block = block.to(DEVICE)
    args = _inputs(n_seq, n_res, c_e, c_z)
    peak = fold_chunk.estimate_peak_memory(block, args)
    smallest = fold_chunk.smallest_reachable_peak(block, args)
    chunked = fold_chunk.autochunk(block, args, int(smallest + 0.2 * (peak - smallest)))
    assert chunked.report.regions
    assert not kernel_calls  # planning ran the kernels' fakes
    with torch.no_grad():
        out = chunked(*args)
    # MSA row attention (packed), the two triangle attentions and the global column attention
    # (one query per column against its N_seq keys: the forward for another key length, served
    # without autograd, fold_kernels.evo_attention_cross)
    assert {name for name, _ in kernel_calls} == {"attention", "attention_packed",
                                                  "triangle_attention"}
    # chunk-sized calls: the rows of some attention (dim -3 of proj / -4 of q) are a chunk
    rows = {n_seq, n_res}
    assert any((s[-4] if name == "attention" else s[-3]) not in rows
               for name, s in kernel_calls), kernel_calls
    with torch.no_grad(), ops.use_backend("torch"):
        expected = ref(*[a.cpu().double() for a in args])
    for o, e in zip(out, expected):
        assert rel_err(o.cpu(), e) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_autochunked_extra_msa_block_peak_on_the_gpu_is_the_estimate(kernel_calls):
    """af2 extra MSA sizes (c_e 64, 8 heads of 8; pair 4 heads of 32) at 1024 rows x 256
    residues: the measured peak of the chunked block within 15% (+ 64 MiB of cuBLAS / Triton
    workspaces) of AutoChunk's estimate, which counts the kernels, not the reference logits
    ([1024, 8, 256, 256] fp32 = 2 GiB for the MSA row attention alone)."""
    n_seq, n_res, c_e, c_z = 1024, 256, 64, 128
    torch.manual_seed(0)
    block = ExtraMsaBlock(c_m=c_e, c_z=c_z, c_hidden_msa_att=8, no_heads_msa=8, c_hidden_opm=32,
                          c_hidden_mul=128, c_hidden_pair_att=32, no_heads_pair=4,
                          transition_n=4, msa_dropout=0.15, pair_dropout=0.25).eval().cuda()
    args = _inputs(n_seq, n_res, c_e, c_z, "cuda")
    peak = fold_chunk.estimate_peak_memory(block, args)
    smallest = fold_chunk.smallest_reachable_peak(block, args)
    budget = int(smallest + 0.3 * (peak - smallest))
    chunked = fold_chunk.autochunk(block, args, budget)
    with torch.no_grad():
        chunked(*args)  # warm-up: Triton compiles and tunes outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = chunked(*args)
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - base
    del out
    estimate = chunked.report.simulated_peak_after
    assert kernel_calls
    assert measured <= 1.15 * estimate + 64 * 2**20, (measured, estimate, budget)
    assert estimate <= budget
