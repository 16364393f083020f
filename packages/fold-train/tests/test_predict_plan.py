"""The pre-flight of a prediction (`fold-train predict --dry-run`, `fold_train.predict_plan`):
the estimated peak (a FakeTensor run of the predictor, one trunk pass and one sampler step)
within 15% of the peak measured on the CPU, for real inputs (FKBP51 + FK506 crops for AF3, 1PSM
chain A for AF2), unchunked and chunked; the chunking it picks fits; the CLI.

The measured peak is the CPU allocator's, from ``torch.profiler`` memory events (every
allocation and free of the real run, with 2 trunk passes and 2 sampler steps: the estimate
assumes further passes and steps allocate the same); per stage, fold-chunk's live-tensor
accounting on the real tensors."""

from __future__ import annotations

import json
from contextlib import nullcontext
from unittest.mock import patch

import pytest
import torch
import torch.profiler as tp
from _af3_helpers import CCD, INPUTS, ligand_crop, needs_af3_demo
from _train_helpers import DEMO
from fold_train import predict_plan
from fold_train.buckets import real_extent
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.data import collate
from fold_train.families import make_family
from fold_train.loop import CHECKPOINT_FORMAT
from fold_train.predict_plan import (
    AF2_STAGES,
    AF3_STAGES,
    PLAN_BLOCKS,
    af2_run,
    af3_run,
    plan_chunking,
    stage_peaks,
)

pytestmark = pytest.mark.slow
TOLERANCE = 0.15


def profiler_peak(fn) -> int:
    """Peak bytes the CPU allocator holds while ``fn()`` runs, from the profiler's memory
    events: each op's own allocations and frees, and the frees outside ops, in time order."""
    with tp.profile(activities=[tp.ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            out = fn()
            del out
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def _af3_model(seed: int = 0):
    torch.manual_seed(seed)
    mc = apply_overrides(preset("af3_tiny"), []).model_config()
    return make_family("af3", mc).build_model(mc).eval()


@pytest.fixture(scope="module")
def af3_raw():
    needs_af3_demo()
    from fold_data.af3 import Ccd
    from fold_train.predict_af3 import make_af3_inputs

    return make_af3_inputs(INPUTS / "fkbp51_fk506.json", Ccd([CCD], use_biotite=False))[1]


def _af3_batch(raw, n_residues: int):
    from fold_data.af3 import make_sample
    from fold_data.af3.crop import crop_features

    return collate([make_sample(crop_features(raw, ligand_crop(raw, n_residues)),
                                "af3_predict", seed=0)])


def _within(est: int, measured: int, what: str) -> None:
    assert abs(est - measured) <= TOLERANCE * measured, (what, est, measured)


@pytest.mark.parametrize("n_residues,chunk,group,samples", [
    (10, None, None, 3),  # 67 tokens, 121 atoms, 3 samples at once
    (10, 16, 1, 3),  # chunked trunk and bias, samples one at a time
    (3, None, 2, 3),  # 60 tokens: samples in groups of 2 and 1
    # chunked trunk, 8 samples at once: the confidence head (its Pairformer's pair for every
    # sample, the PAE / PDE logits of one row block, the reduced pair confidences) is the peak
    (10, 8, None, 8),
])
def test_af3_estimate_within_15_percent_of_measured(af3_raw, n_residues, chunk, group, samples):
    batch = _af3_batch(af3_raw, n_residues)
    model = _af3_model()
    model.set_chunk_size(chunk)
    model.set_sample_group_size(group)
    real = real_extent(batch, "af3")
    est = stage_peaks(model, AF3_STAGES, af3_run(model, real, no_samples=samples), batch)
    run = af3_run(model, None, no_samples=samples, no_cycles=2, no_steps=2)
    measured = profiler_peak(lambda: run(batch))
    _within(est.peak, measured, "peak")
    per_stage = stage_peaks(model, AF3_STAGES, run, batch, fake=False)
    assert list(est.stages) == [name for name, _ in AF3_STAGES]
    for name, v in est.stages.items():
        _within(v, per_stage.stages[name], name)
    if samples == 8:
        assert max(est.stages, key=est.stages.get) == "confidence head"
        assert est.stages["confidence head"] == est.peak


def test_af2_estimate_within_15_percent_of_measured():
    from fold_data.af2 import make_sample
    from fold_model.af2 import AlphaFold2
    from fold_train.predict import make_raw_features

    msa = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"
    if not msa.exists():
        pytest.skip("bundled demo data not found")
    cfg = preset("tiny")
    torch.manual_seed(7)
    model = AlphaFold2(cfg.model_config()).eval()
    _, raw, _ = make_raw_features(mmcif=DEMO / "mmcifs" / "1psm.cif", chain="A", msas=[msa])
    batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
    est = stage_peaks(model, AF2_STAGES, af2_run(model, real_extent(batch, "af2")), batch)
    run = af2_run(model, None, num_recycles=2)
    _within(est.peak, profiler_peak(lambda: run(batch)), "peak")
    per_stage = stage_peaks(model, AF2_STAGES, run, batch, fake=False)
    for name, v in est.stages.items():
        _within(v, per_stage.stages[name], name)
    # the fake run left no FakeTensor behind in fold-model's constant tables
    assert type(run(batch)["final_atom_positions"]) is torch.Tensor


def test_plan_picks_chunking_that_fits(af3_raw):
    """A budget that the unchunked prediction exceeds: the plan chunks and groups the samples,
    and the real run with the planned flags fits it (measured)."""
    batch = _af3_batch(af3_raw, 10)
    model = _af3_model()
    unchunked = plan_chunking(model, "af3", batch, 10**12, no_samples=3)
    assert unchunked.fits and unchunked.chunk_size is None and unchunked.sample_group is None
    base = unchunked.weights + unchunked.features
    budget = int((base + 0.35 * unchunked.peak) / 0.9)  # 90% usable (DEVICE_MARGIN)
    plan = plan_chunking(model, "af3", batch, budget, no_samples=3)
    assert plan.fits and plan.chunk_size is not None
    assert plan.peak + base <= plan.usable < unchunked.peak + base
    summary = plan.summary()
    assert summary["flags"][:2] == ["--chunk-size", str(plan.chunk_size)]
    assert summary["peak_bytes"] <= summary["usable_bytes"]
    model.set_chunk_size(plan.chunk_size)
    model.set_sample_group_size(plan.sample_group)
    run = af3_run(model, None, no_samples=3, no_cycles=2, no_steps=2)
    assert stage_peaks(model, AF3_STAGES, run, batch, fake=False).peak + base <= plan.usable


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = apply_overrides(preset("af3_tiny"), [])
    model = _af3_model()
    path = tmp_path_factory.mktemp("ckpt") / "af3_tiny.ckpt"
    save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(),
                           "model": {k: v.clone() for k, v in model.state_dict().items()}})
    return path


def test_cli_dry_run(checkpoint, tmp_path, capsys):
    needs_af3_demo()
    doc = {"name": "fkbp51_n24", "modelSeeds": [1], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": "GAPATVTEQGEDITSKKDRGVLKI"}}]}
    source = tmp_path / "in.json"
    source.write_text(json.dumps(doc))
    args = ["predict", "--checkpoint", str(checkpoint), "--json", str(source), "--ccd",
            str(CCD), "--device", "cpu", "--samples", "2", "--dry-run", "--out",
            str(tmp_path / "never.cif")]
    assert main([*args, "--memory-limit", "1GB"]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plan["dry_run"] and plan["fits"] and plan["flags"] == [] and plan["n_token"] == 24
    assert list(plan["stages"]) == [name for name, _ in AF3_STAGES]
    unchunked = plan["peak_bytes"]
    limit = int((plan["weights_bytes"] + plan["features_bytes"]
                 + 0.7 * (unchunked - plan["weights_bytes"] - plan["features_bytes"])) / 0.9)
    assert main([*args, "--memory-limit", str(limit)]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plan["fits"] and plan["flags"] and plan["peak_bytes"] <= plan["usable_bytes"]
    assert main([*args, "--memory-limit", "1000"]) == 1
    captured = capsys.readouterr()
    smallest = json.loads(captured.out.strip().splitlines()[-1])
    assert not smallest["fits"] and smallest["flags"] == ["--chunk-size", "4",
                                                          "--sample-group", "1"]
    assert "does not fit" in captured.err
    assert not (tmp_path / "never.cif").exists()  # a dry run writes nothing


def test_dry_run_of_the_first_blocks_equals_the_whole_stacks(af3_raw):
    """The dry run runs each stack's first two blocks (``first_blocks``): on stacks of 5, 4 and
    3 blocks its stage peaks equal those of the FakeTensor run of every block, byte for byte,
    and stay within 15% of the real run's; the stacks have all their blocks again after."""
    from fold_data.af2 import make_sample
    from fold_model.af2 import AlphaFold2
    from fold_train.predict import make_raw_features

    assert PLAN_BLOCKS == 2
    cases = []
    cfg = apply_overrides(preset("af3_tiny"), ["model.pairformer.no_blocks=5",
                                               "model.diffusion.no_blocks=4",
                                               "model.msa.no_blocks=3"])
    mc = cfg.model_config()
    torch.manual_seed(0)
    model = make_family("af3", mc).build_model(mc).eval()
    batch = _af3_batch(af3_raw, 3)
    cases.append((model, AF3_STAGES, af3_run(model, real_extent(batch, "af3"), no_samples=2),
                  batch, {"pairformer": 5, "diffusion.transformer": 4, "msa_module": 3}))
    msa = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"
    cfg = apply_overrides(preset("tiny"), ["model.evoformer.no_blocks=5",
                                           "model.extra_msa.no_blocks=3"])
    torch.manual_seed(7)
    model = AlphaFold2(cfg.model_config()).eval()
    _, raw, _ = make_raw_features(mmcif=DEMO / "mmcifs" / "1psm.cif", chain="A", msas=[msa])
    batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
    cases.append((model, AF2_STAGES, af2_run(model, real_extent(batch, "af2")), batch,
                  {"evoformer": 5, "extra_msa_stack": 3}))
    for model, stages, run, batch, sizes in cases:
        for path, n in sizes.items():
            assert len(model.get_submodule(path).blocks) == n, path
        calls = {path: 0 for path in sizes}  # of each stack's last block
        hooks = [model.get_submodule(path).blocks[-1].register_forward_pre_hook(
            lambda *_, path=path, calls=calls: calls.__setitem__(path, calls[path] + 1))
            for path in sizes]
        est = stage_peaks(model, stages, run, batch)
        assert set(calls.values()) == {0}  # the dry run did not run them
        with patch.object(predict_plan, "first_blocks", lambda m: nullcontext()):
            whole = stage_peaks(model, stages, run, batch)
        assert 0 not in calls.values()
        for h in hooks:
            h.remove()
        measured = stage_peaks(model, stages, run, batch, fake=False)
        assert est.stages == whole.stages and est.peak == whole.peak
        for name, v in est.stages.items():
            _within(v, measured.stages[name], name)
        for path, n in sizes.items():
            assert len(model.get_submodule(path).blocks) == n, path


def test_plan_counts_the_weight_casts_under_bf16():
    """bf16 prediction keeps a bf16 copy of the cast weights (fold_ops.weight_casts): the plan's
    weights include it (2 bytes per fp32 parameter), fp32 casts nothing."""
    from fold_train.predict_plan import cast_bytes

    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5))
    n = sum(p.numel() for p in model.parameters())
    assert cast_bytes(model, "bf16") == 2 * n and cast_bytes(model, "fp32") == 0
    assert cast_bytes(model.to(torch.bfloat16), "bf16") == 0  # bf16 weights: nothing to cast
