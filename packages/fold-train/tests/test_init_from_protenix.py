"""Protenix checkpoints into fold-train: a checkpoint file made the way Protenix makes its own
(its model class, its config system, ``torch.save({"model": ...})`` with DDP's ``module.``
names) -> ``fold-train import-weights --from protenix`` -> ``train --init-from`` (weights only)
on the bundled 3O5R. The module-by-module parity with Protenix is fold-model's
tests/af3/test_af3_protenix_parity.py."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from _af3_helpers import needs_af3_demo, train_args

os.environ.setdefault("LAYERNORM_TYPE", "torch")  # Protenix's LayerNorm without its CUDA build
pytest.importorskip("protenix", reason="protenix not installed (nox -s tests installs it)")

from fold_model.af3 import AlphaFold3, config  # noqa: E402
from fold_model.af3.params_protenix import (  # noqa: E402
    ProtenixParamsError,
    load_protenix_checkpoint,
)
from fold_train.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from fold_train.cli import main  # noqa: E402
from fold_train.init_from import model_overrides  # noqa: E402

# Protenix's own config system at tiny sizes (its CLI override syntax); the trunk Pairformer's
# 16 heads are those of its confidence head, which Protenix builds with its default heads.
TINY = ("--c_s 32 --c_z 16 --c_token 24 --c_s_inputs 89 --c_atom 16 --c_atompair 8 "
        "--n_blocks 2 --model.pairformer.n_heads 16 --model.diffusion_module.c_token 32 "
        "--model.diffusion_module.transformer.n_blocks 2 "
        "--model.diffusion_module.transformer.n_heads 4 --model.msa_module.n_blocks 2 "
        "--model.msa_module.c_m 12 --model.template_embedder.n_blocks 1 "
        "--model.template_embedder.c 10 --model.confidence_head.n_blocks 1 "
        "--blocks_per_ckpt null")
# Sampling and training knobs that no weight depends on, small for a CPU step.
RUNTIME = ["model.diffusion.no_samples=2", "model.confidence.rollout_steps=2",
           "model.no_cycles=1", "model.sampler.no_steps=2", "model.checkpoint=false"]


@pytest.fixture(scope="module")
def protenix_file(tmp_path_factory):
    """A randomly initialised tiny Protenix model saved as Protenix saves checkpoints."""
    from configs.configs_base import configs as configs_base
    from configs.configs_data import data_configs
    from configs.configs_inference import inference_configs
    from protenix.config.config import parse_configs
    from protenix.model.protenix import Protenix

    raw = {**copy.deepcopy(configs_base), "data": copy.deepcopy(data_configs),
           **copy.deepcopy(inference_configs)}
    torch.manual_seed(0)
    model = Protenix(parse_configs(raw, arg_str=TINY, fill_required_with_null=True))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero everywhere (Protenix zero-initialises its output layers)
        for p in model.parameters():
            if p.requires_grad and p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    path = tmp_path_factory.mktemp("protenix") / "protenix_tiny.pt"
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    return path, model.state_dict()


def test_protenix_checkpoint_loads_strictly(protenix_file, tmp_path):
    path, theirs = protenix_file
    cfg, state = load_protenix_checkpoint(path)
    AlphaFold3(cfg).load_state_dict(state, strict=True)
    assert (cfg.z_init_from, cfg.atom.key_norm, cfg.confidence.variant) == (
        "s_init", "query", "protenix")
    assert (cfg.c_s, cfg.c_z, cfg.msa.c_hidden_pair_avg, cfg.pairformer.no_heads_single) == (
        32, 16, 8, 16)
    assert torch.equal(state["pairformer.blocks.1.single_attention.mha.linear_q.bias"],
                       theirs["pairformer_stack.blocks.1.attention_pair_bias.attention."
                              "linear_q.bias"])
    assert torch.equal(state["distogram_head.bias"], 2 * theirs["distogram_head.linear.bias"])
    bad = {f"module.{k}": v for k, v in theirs.items()}
    bad["module.constraint_embedder.pocket_z_embedder.weight"] = torch.zeros(16, 1)
    torch.save({"model": bad}, tmp_path / "bad.pt")
    with pytest.raises(ProtenixParamsError, match=r"bad\.pt.*constraint_embedder"):
        load_protenix_checkpoint(tmp_path / "bad.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ProtenixParamsError, match=r"other\.pt.*'model' state dict"):
        load_protenix_checkpoint(tmp_path / "other.pt")


def test_import_weights_then_init_from(protenix_file, tmp_path, capsys):
    needs_af3_demo()
    path, _ = protenix_file
    out = tmp_path / "protenix.ckpt"
    assert main(["import-weights", str(path), "--from", "protenix", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "protenix" and summary["templates"] is True
    assert summary["model_overrides"]["z_init_from"] == "s_init"
    imported = load_checkpoint(out)["model"]
    # told apart by content too
    assert main(["import-weights", str(path), "--out", str(tmp_path / "auto.ckpt")]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "protenix"

    # fine-tune: the tiny AF3 preset with the file's sizes and switches (relative to the tiny
    # model) and small sampling knobs
    cfg, _ = load_protenix_checkpoint(path)
    sizes = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in model_overrides(cfg, config("tiny")).items()
             if not k.startswith(("diffusion.no_samples", "confidence.rollout_steps",
                                  "no_cycles", "sampler.", "checkpoint"))]
    run = tmp_path / "run"
    args = train_args(run, *sizes, *RUNTIME, "steps=1", "checkpoint_every=1",
                      "precision=fp32", cache=tmp_path / "cache")
    assert main([*args, "--init-from", str(out)]) == 0
    err = capsys.readouterr()
    assert f"weights from {out}" in err.out + err.err
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(np.isfinite(m.get("loss", np.nan)) for m in metrics)
    # a fresh run of the same config starts from other weights, so the imported ones were used
    trained = load_checkpoint(sorted(run.glob("**/*.ckpt"))[-1])["model"]
    moved = [k for k in imported if not torch.equal(trained[k], imported[k])]
    assert moved and all((trained[k] - imported[k]).abs().max() < 0.1 for k in imported)

    with pytest.raises(CheckpointError, match="does not fit this run's model"):
        from fold_train.init_from import load_init_weights

        load_init_weights(AlphaFold3(config("tiny")), out, "af3")
