"""The dry run's estimate counts the memory of the backend that serves each op on the device it
plans for: a backend registered in fold-model's registry for the attention ops (a spy that runs
the reference, with a shape-only fake as fold-kernels registers for its kernels) takes the
reference's ``[rows, H, N, N]`` logits out of the estimate, and the prediction then calls it."""

from __future__ import annotations

import pytest
import torch
from _train_helpers import DEMO
from fold_train.buckets import real_extent
from fold_train.config import preset
from fold_train.data import collate
from fold_train.predict_plan import AF2_STAGES, af2_run, stage_peaks

ATTENTION = ("attention", "attention_packed", "triangle_attention")


@pytest.fixture
def spy():
    """The attention ops served by a spy that runs the reference, with a shape-only fake as
    fold-kernels registers for its kernels (``fold_model.ops.testing``)."""
    from fold_model.ops.testing import attention_spy

    with attention_spy() as calls:
        yield calls


def _model_and_batch():
    from fold_data.af2 import make_sample
    from fold_model.af2 import AlphaFold2
    from fold_train.predict import make_raw_features

    cfg = preset("tiny")
    torch.manual_seed(7)
    model = AlphaFold2(cfg.model_config()).eval()
    msa = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"
    _, raw, _ = make_raw_features(mmcif=DEMO / "mmcifs" / "1psm.cif", chain="A", msas=[msa])
    batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
    return model, batch


def test_estimate_counts_the_serving_backends_fake_not_the_reference_logits(spy):
    from fold_model import ops

    model, batch = _model_and_batch()
    extent = real_extent(batch, "af2")
    with ops.use_backend({name: "torch" for name in ATTENTION}):
        ref = stage_peaks(model, AF2_STAGES, af2_run(model, extent), batch)
    assert not spy
    est = stage_peaks(model, AF2_STAGES, af2_run(model, extent), batch)
    assert not spy  # the fake ran, not the spy
    n = extent["N_res"]
    heads = model.config.evoformer.no_heads_pair
    # the Evoformer's triangle attention logits [B, N, H, N, N] fp32: in the reference's
    # estimate, not in the spy's
    logits = n * heads * n * n * 4
    assert ref.stages["Evoformer"] - est.stages["Evoformer"] >= logits, (ref, est, logits)
    assert est.peak < ref.peak
    # the real prediction calls the spy: MSA row and column (packed), the extra MSA stack's
    # global column attention, the triangle attentions
    af2_run(model, extent)(batch)
    assert {name for name, _ in spy} == set(ATTENTION)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_dry_run_for_a_gpu_counts_fold_kernels_not_the_reference():
    """Planning for a CUDA device runs the predictor on CUDA FakeTensors: fold-kernels serves
    the attention ops there, its fakes are counted (no logits), no kernel is launched."""
    from fold_model import ops
    from fold_train.predict_plan import plan_chunking

    if "triton" not in ops.backends("attention_packed"):
        pytest.skip("fold-kernels is not installed")
    model, batch = _model_and_batch()
    extent = real_extent(batch, "af2")
    allocated = torch.cuda.memory_allocated()
    cpu = plan_chunking(model, "af2", batch, 2**40)
    gpu = plan_chunking(model, "af2", batch, 2**40, device="cuda")
    assert torch.cuda.memory_allocated() == allocated  # FakeTensors only, nothing on the GPU
    assert cpu.device == "cpu" and gpu.device.startswith("cuda")
    assert "cuda" in gpu.summary()["method"]
    n, heads = extent["N_res"], model.config.evoformer.no_heads_pair
    logits = n * heads * n * n * 4  # one triangle attention's [B, N, H, N, N] fp32 logits
    assert cpu.stages["Evoformer"] - gpu.stages["Evoformer"] >= logits, (cpu, gpu)


def test_the_size_check_counts_attention_logits_only_where_the_reference_serves():
    """``fused_attention`` asks the registry: the reference on the CPU stores the logits; a
    backend serving attention with a logits-free fake (as fold-kernels on a GPU) does not, and
    the size check's estimate then leaves the ``[rows, H, N, N]`` logits out."""
    from fold_model.ops.testing import attention_spy
    from fold_train.memory_estimate import af2_estimate, fused_attention

    cfg = preset("af2_finetune")
    with_logits = af2_estimate(1024, cfg.model_config(), cfg.data_preset(), precision="bf16")
    without = af2_estimate(1024, cfg.model_config(), cfg.data_preset(), precision="bf16",
                           fused_attention=True)
    n_extra = cfg.data_preset().n_extra
    extra_logits = n_extra * cfg.model_config().extra_msa.no_heads_msa * 1024 ** 2 * 2
    assert with_logits.largest_transient[1] == extra_logits  # the extra MSA row logits
    assert not any("logits" in k for k in without.transient)
    assert without.peak_bytes < with_logits.peak_bytes - extra_logits // 2
    with attention_spy():
        assert fused_attention("cpu", "bf16")  # the spy serves attention, with a fake
    assert not fused_attention("cpu", "bf16")  # the reference stores the logits
