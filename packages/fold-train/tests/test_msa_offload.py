"""``--msa-offload`` (AF2): the MSA representations wait in host memory between blocks and
while each block's pair updates run. On the CPU the copies are real copies (the same code as on
a GPU), so the prediction must be bitwise the unchunked one: the same ops on the same numbers,
only stored elsewhere between them. With AutoChunk on top as well (the wrapped stacks are
traced with the offload)."""

from __future__ import annotations

import json

import fold_model.af2.evoformer as evoformer
import pytest
import torch
from _train_helpers import DEMO
from fold_train.autochunk import enable_autochunk
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.data import collate
from fold_train.loop import CHECKPOINT_FORMAT
from fold_train.predict_graphs import AF2Predictor

pytestmark = pytest.mark.slow
MMCIF = DEMO / "mmcifs" / "1psm.cif"
MSA = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"


def _model(order: str):
    from fold_model.af2 import AlphaFold2

    cfg = apply_overrides(preset("tiny"), [f"model.block_order={order}"])
    torch.manual_seed(7)
    model = AlphaFold2(cfg.model_config())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # random weights everywhere, the zero-initialised final layers too
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return cfg, model.eval()


@pytest.fixture(scope="module")
def raw():
    if not MSA.exists():
        pytest.skip("bundled demo data not found")
    from fold_train.predict import make_raw_features

    return make_raw_features(mmcif=MMCIF, chain="A", msas=[MSA])[1]


def _predict(model, cfg, raw):
    from fold_data.af2 import make_sample

    batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
    batch["msa_mask"][..., 3, 5:9] = 0  # a hole in the MSA mask
    return AF2Predictor(model, "cpu", cuda_graphs=False)(batch, num_recycles=2)


@pytest.mark.parametrize("order", ["af2", "parallel"])
def test_offloaded_prediction_is_bitwise_the_same(raw, order, monkeypatch):
    cfg, model = _model(order)
    ref = _predict(model, cfg, raw)
    copies = []

    def spy(x):
        host = offload(x)
        assert host.device.type == "cpu" and host.data_ptr() != x.data_ptr()  # a real copy
        copies.append(tuple(host.shape))
        return host

    offload = evoformer.offload_to_host
    monkeypatch.setattr(evoformer, "offload_to_host", spy)
    import fold_model.af2.model as af2_model

    monkeypatch.setattr(af2_model, "offload_to_host", spy)
    model.set_msa_offload(True)
    out = _predict(model, cfg, raw)
    for k in ref:
        assert torch.equal(out[k], ref[k]), k
    mc = cfg.model_config()
    per_pass = 2 + mc.evoformer.no_blocks + mc.extra_msa.no_blocks  # inputs + one per block
    assert len(copies) == 2 * per_pass  # two recycling passes
    # AutoChunk traces the stacks with the offload in them: still the same prediction
    monkeypatch.undo()  # (the spy reads data: not traceable)
    wrappers = enable_autochunk(model, 2_500_000)
    out = _predict(model, cfg, raw)
    assert all(w.report.regions for w in wrappers)
    for k in ref:
        torch.testing.assert_close(out[k], ref[k], rtol=1e-5, atol=1e-5, msg=k)


def test_cli_msa_offload(raw, tmp_path, capsys):
    cfg, model = _model("af2")
    path = tmp_path / "tiny.ckpt"
    save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(),
                           "model": {k: v.clone() for k, v in model.state_dict().items()}})
    args = ["predict", "--checkpoint", str(path), "--mmcif", str(MMCIF), "--chain", "A",
            "--msa", str(MSA), "--device", "cpu", "--recycles", "1", "--no-ema"]
    assert main([*args, "--out", str(tmp_path / "a.cif")]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*args, "--out", str(tmp_path / "b.cif"), "--msa-offload"]) == 0
    offloaded = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert offloaded["mean_plddt"] == plain["mean_plddt"]
    assert (tmp_path / "a.cif").read_text() == (tmp_path / "b.cif").read_text()
