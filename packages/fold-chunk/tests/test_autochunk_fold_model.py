"""AutoChunk on fold-model's AF2 blocks (skipped when fold_model is not installed): odd sizes,
masks with holes, several budgets; chunked == unchunked in fp32 and vs a float64 reference."""

from __future__ import annotations

import fold_chunk as fc
import pytest
import torch
import torch.fx as fx

evoformer = pytest.importorskip("fold_model.af2.evoformer")
template = pytest.importorskip("fold_model.af2.template")
config = pytest.importorskip("fold_model.af2.config")

N_SEQ, N_RES, N_TEMPL = 7, 19, 2
SIZES = dict(c_m=16, c_z=8, c_hidden_msa_att=4, no_heads_msa=2, c_hidden_opm=4, c_hidden_mul=8,
             c_hidden_pair_att=4, no_heads_pair=2, transition_n=2, msa_dropout=0.15,
             pair_dropout=0.25)


def _mask(*shape: int, gen: torch.Generator) -> torch.Tensor:
    mask = (torch.rand(*shape, generator=gen) > 0.2).float()
    mask[..., 0] = 1.0
    return mask


def _evo_inputs(c_m: int = 16, c_z: int = 8):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(N_SEQ, N_RES, c_m, generator=gen),
            torch.randn(N_RES, N_RES, c_z, generator=gen),
            _mask(N_SEQ, N_RES, gen=gen), _mask(N_RES, N_RES, gen=gen))


def _build(name: str):
    torch.manual_seed(0)
    if name == "evoformer_block":
        return evoformer.EvoformerBlock(**SIZES), _evo_inputs()
    if name == "extra_msa_block":
        return evoformer.ExtraMsaBlock(**SIZES), _evo_inputs()
    if name == "template_pair_block":
        gen = torch.Generator().manual_seed(1)
        block = template.TemplatePairBlock(c_t=8, c_hidden_tri_att=4, no_heads=2,
                                           c_hidden_tri_mul=8, transition_n=2, dropout_rate=0.25)
        t = torch.randn(N_TEMPL, N_RES, N_RES, 8, generator=gen)
        return block, (t, _mask(N_RES, N_RES, gen=gen))
    if name == "evoformer_stack":
        cfg = config.EvoformerConfig(no_blocks=2, c_s=10, **{k: v for k, v in SIZES.items()})
        return evoformer.EvoformerStack(cfg), _evo_inputs()
    raise ValueError(name)


BLOCKS = ["evoformer_block", "extra_msa_block", "template_pair_block", "evoformer_stack"]
_CACHE: dict = {}


def _case(name: str):
    if name not in _CACHE:
        module, args = _build(name)
        module.eval()
        peak = fc.estimate_peak_memory(module, args)
        smallest = fc.smallest_reachable_peak(module, args)
        _CACHE[name] = (module, args, peak, smallest)
    return _CACHE[name]


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", BLOCKS)
@pytest.mark.parametrize("fraction", [0.5, 0.0])
def test_block_chunked_equals_unchunked(name: str, fraction: float) -> None:
    module, args, peak, smallest = _case(name)
    assert smallest <= 0.5 * peak, (smallest, peak)
    budget = int(smallest + fraction * (peak - smallest))
    chunked = fc.autochunk(module, args, budget)
    assert chunked.report.regions
    assert chunked.report.simulated_peak_after <= budget
    with torch.no_grad():
        out = _flat(chunked(*args))
        ref = _flat(module(*args))
        module.double()
        try:
            ref64 = _flat(module(*[a.double() for a in args]))
        finally:
            module.float()
    for o, r, r64 in zip(out, ref, ref64):
        assert torch.isfinite(o).all()
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        err = ((o.double() - r64).norm() / r64.norm()).item()
        assert err < 1e-5, err  # fp32 accumulation over these small sizes


@pytest.mark.parametrize("name", ["evoformer_block", "template_pair_block"])
def test_block_estimate_vs_measured_cpu_peak(name: str) -> None:
    module, args, peak, smallest = _case(name)
    with torch.no_grad():
        measured = fc.measure_peak_memory(fx.symbolic_trace(module), *args)
    assert abs(peak - measured) <= 0.15 * measured, (peak, measured)
    budget = int(smallest + 0.3 * (peak - smallest))
    chunked = fc.autochunk(module, args, budget)
    with torch.no_grad():
        measured_chunked = fc.measure_peak_memory(chunked.graph_module(args), *args)
    for estimate in (chunked.report.estimated_peak_after, chunked.report.simulated_peak_after):
        assert abs(estimate - measured_chunked) <= 0.15 * measured_chunked, (
            estimate, measured_chunked)


def test_block_impossible_budget() -> None:
    module, args, peak, smallest = _case("evoformer_block")
    with pytest.raises(fc.MemoryBudgetError, match=f"smallest reachable estimated peak is "
                                                   f"{smallest} bytes"):
        fc.autochunk(module, args, smallest - 1)
