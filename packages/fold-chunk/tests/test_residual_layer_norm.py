"""AutoChunk folds a residual add and the LayerNorm after it into the chunk region of the block
before them: ``LayerNorm(x + f(x))`` reaches a budget of 1.5 whole tensors ``[N_i, N_j, C]``.

Without the fold the search ended the region at its valley (the output of ``f``), so the add and
the LayerNorm ran whole: the region's output buffer and the sum (or the sum and the LayerNorm's
output) were live together, two whole tensors, and no plan could go below that."""

from __future__ import annotations

import fold_chunk as fc
import torch
from fold_chunk.memory_tracker import measure_peak_memory
from toy_modules import ToyResidualLayerNorm


def test_residual_and_layer_norm_fold_into_one_region() -> None:
    torch.manual_seed(0)
    module = ToyResidualLayerNorm().eval()
    x = torch.randn(37, 29, 8)  # odd sizes
    whole = x.numel() * x.element_size()
    assert fc.estimate_peak_memory(module, (x,)) >= 7 * whole  # the [N, N, 4C] hidden
    # one region over f, the add and the LayerNorm: its output buffer and a chunk of the rest
    assert fc.smallest_reachable_peak(module, (x,)) < 1.3 * whole
    budget = int(1.5 * whole)
    chunked = fc.autochunk(module, (x,), budget)
    (region,) = chunked.report.regions
    assert region.last_node == "ln" and region.n_chunks > 1
    assert chunked.report.simulated_peak_after <= budget
    with torch.no_grad():
        measured = measure_peak_memory(chunked, x)  # real CPU run, live-tensor accounting
        out, ref = chunked(x), module(x)
        ref64 = module.double()(x.double())
    module.float()
    assert measured <= budget
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # fp32 against float64: a LayerNorm of O(1) values, relative error ~1e-7 per element
    assert ((out.double() - ref64).norm() / ref64.norm()) < 1e-6


def test_tracker_counts_one_device_type() -> None:
    """``AllocationTracker(device_type=...)`` counts that device's storages only (a module that
    keeps a tensor in host memory on purpose is planned for the accelerator's memory)."""
    x = torch.randn(64, 64)
    with fc.AllocationTracker() as every, torch.no_grad():
        y = x @ x
    with fc.AllocationTracker(device_type="cuda") as cuda_only, torch.no_grad():
        z = x @ x
    assert every.peak == y.untyped_storage().nbytes() and cuda_only.peak == 0
    del y, z
