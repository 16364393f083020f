"""AF2 / OpenFold weights into fold-train: ``import-weights`` -> a checkpoint ``predict`` uses
unchanged (with pTM and PAE for pTM models), and ``train --init-from`` (weights only)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _train_helpers import DEMO, SMALL
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.params_af2 import alphafold_arrays
from fold_model.af2.params_openfold import openfold_state_dict
from fold_train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import Trainer
from fold_train.predict import load_trained_model, make_raw_features, predict_structure

MONO = DEMO / "monomer"
# AF2's sizes, one block per stack: model_3_ptm's modules (no templates, the pTM head)
AF2_SMALL = dict(template__enabled=False, heads__tm_enabled=True, evoformer__no_blocks=1,
                 extra_msa__no_blocks=1)


def _small_weights(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Random weights of a scale that keeps activations finite through the whole model."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        if v.dim() >= 2:
            out[k] = r / v.shape[-1] ** 0.5
        else:
            out[k] = 1.0 + 0.1 * r if "layer_norm" in k and k.endswith("weight") else 0.1 * r
    return out


@pytest.fixture(scope="module")
def af2_file(tmp_path_factory):
    cfg = config("af2_finetune", **AF2_SMALL)
    state = _small_weights(AlphaFold2(cfg), 0)
    path = tmp_path_factory.mktemp("af2") / "params_model_3_ptm.npz"
    np.savez(path, **alphafold_arrays(cfg, state))
    return path, cfg, state


def af2_predicted_tm_score(logits: np.ndarray) -> float:
    """AF2 ``confidence.predicted_tm_score`` (float64): every residue weighted 1."""
    n, bins = logits.shape[0], logits.shape[-1]
    breaks = np.linspace(0.0, 31.0, bins - 1)
    step = breaks[1] - breaks[0]
    centers = np.concatenate([breaks + step / 2, [breaks[-1] + 3 * step / 2]])
    d0 = 1.24 * (max(n, 19) - 15) ** (1.0 / 3) - 1.8
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    term = (probs / (1 + centers**2 / d0**2)).sum(-1)
    per_alignment = (term * (np.ones(n) / (1e-8 + n))).sum(-1)
    return float(per_alignment.max())


def test_import_weights_then_predict_with_ptm_and_pae(af2_file, tmp_path, capsys):
    path, cfg, state = af2_file
    msa = MONO / "bfd_uniclust_hits.a3m"
    ckpt = tmp_path / "af2.ckpt"
    assert main(["import-weights", str(path), "--out", str(ckpt)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "alphafold" and summary["ptm"] and not summary["templates"]
    model, train_cfg = load_trained_model(ckpt)
    assert train_cfg.run.preset == "af2_finetune" and train_cfg.system.precision == "fp32"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())

    # AF2's inference sizes (384 residues, 512 clusters, 5120 extra sequences) are beyond a CPU
    # test: the checkpoint's data preset is cut down, the weights stay as imported
    saved = load_checkpoint(ckpt)
    saved["config"]["data_overrides"] = {"n_res": 76, "n_clust": 8, "n_extra": 16}
    save_checkpoint(ckpt, saved)
    model, train_cfg = load_trained_model(ckpt)
    out = tmp_path / "short.cif"
    assert main(["predict", "--checkpoint", str(ckpt), "--fasta", str(MONO / "short.fasta"),
                 "--msa", str(msa), "--out", str(out),
                 "--recycles", "1", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 < result["ptm"] < 1.0 and 0.0 < result["mean_pae"] < result["max_pae"]

    # the same numbers from the model built here and AF2's pTM formula on its logits
    direct = AlphaFold2(cfg).eval()
    direct.load_state_dict(state)
    _, raw, _ = make_raw_features(fasta=MONO / "short.fasta",
                                  msas=[msa])
    captured = {}
    direct.aux_heads.tm.register_forward_hook(
        lambda mod, args, output: captured.update(logits=output))
    pred = predict_structure(direct, raw, train_cfg.data_preset(), num_recycles=1)
    assert pred.pae.shape == (73, 73) and pred.ptm == pytest.approx(result["ptm"], abs=1e-6)
    logits = captured["logits"][0, :73, :73].double().numpy()
    assert pred.ptm == pytest.approx(af2_predicted_tm_score(logits), rel=1e-5)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    centers = np.concatenate([np.linspace(0, 31, 63) + 0.25, [31.75]])
    np.testing.assert_allclose(pred.pae, (probs * centers).sum(-1), rtol=1e-5)


def test_import_openfold_checkpoint(af2_file, tmp_path, capsys):
    _, _, state = af2_file
    torch.save({"ema": {"params": openfold_state_dict(state)}, "state_dict": {}},
               tmp_path / "openfold.pt")
    ckpt = tmp_path / "of.ckpt"
    assert main(["import-weights", str(tmp_path / "openfold.pt"), "--out", str(ckpt)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "openfold"
    model, _ = load_trained_model(ckpt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_import_weights_refuses_a_bad_file(tmp_path, capsys):
    (tmp_path / "params_model_1.npz").write_bytes(b"PK\x03\x04 truncated")
    code = main(["import-weights", str(tmp_path / "params_model_1.npz"), "--out",
                 str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err
    assert code == 1 and "params_model_1.npz" in err and not (tmp_path / "x.ckpt").exists()


def _trainer(cache, run_dir, extra=(), init_from=None) -> Trainer:
    cache_dir, chains = cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *extra])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, workers=cfg.data.workers)
    return Trainer(cfg, run_dir, stream, progress=False, init_from=init_from)


def test_init_from_changes_the_weights_and_nothing_else(demo_cache, tmp_path):
    # the source: another run's checkpoint (other seed, other optimizer settings) whose EMA
    # weights differ from its live ones
    source = _trainer(demo_cache, tmp_path / "source", ["seed=7", "optim.lr=5e-4"])
    with torch.no_grad():
        for p in source.model.parameters():
            p.add_(0.5)
    state = source.state_dict()
    ckpt = save_checkpoint(tmp_path / "source.ckpt", state)
    ema_model, _ = load_trained_model(ckpt)
    ema = ema_model.state_dict()

    fresh = _trainer(demo_cache, tmp_path / "fresh").state_dict()
    started = _trainer(demo_cache, tmp_path / "started", init_from=ckpt)
    got = started.state_dict()
    assert all(torch.equal(got["model"][k], v) for k, v in ema.items())  # the EMA weights
    assert not all(torch.equal(got["model"][k], v) for k, v in fresh["model"].items())
    # the optimizer starts fresh: zero moments, the averaged weights are the new weights
    for a, b in zip(got["optimizer"]["exp_avg"], fresh["optimizer"]["exp_avg"]):
        assert torch.equal(a, b) and not a.any()
    assert torch.equal(torch.cat([e.flatten() for e in got["optimizer"]["ema"]]),
                       torch.cat([g.param.detach().flatten() for g in started.flat.groups]))
    for key in set(fresh) - {"model", "optimizer"}:
        assert _equal(got[key], fresh[key]), key
    for key in set(fresh["optimizer"]) - {"ema"}:
        assert _equal(got["optimizer"][key], fresh["optimizer"][key]), key
    records = started.fit(stop_at=1)
    assert records[0]["step"] == 1 and np.isfinite(records[0]["loss"])


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_init_from_af2_params_and_mismatches(demo_cache, af2_file, tmp_path, capsys):
    path, _, state = af2_file
    overrides = [f"model.{k.replace('__', '.')}={str(v).lower()}" for k, v in AF2_SMALL.items()]
    cache_dir, chains = demo_cache
    cfg = apply_overrides(preset("af2_finetune"), [*SMALL, "precision=fp32", *overrides])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=0, batch_size=1, workers=0)
    trainer = Trainer(cfg, tmp_path / "ft", stream, progress=False, init_from=path)
    assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in state.items())

    with pytest.raises(CheckpointError, match="does not fit this run's model"):
        _trainer(demo_cache, tmp_path / "tiny", init_from=path)  # tiny sizes
    with pytest.raises(CheckpointError, match=r"model.template.enabled=false"):
        Trainer(apply_overrides(cfg, ["model.template.enabled=true"]), tmp_path / "t", stream,
                progress=False, init_from=path)
    code = main(["train", "--cache", cache_dir, "--run-dir", str(tmp_path / "cli"),
                 "--init-from", str(path), "--resume", *SMALL])
    assert code == 2 and "--init-from starts a new run" in capsys.readouterr().err
