"""OpenFold AF2 checkpoints: fold -> OpenFold names -> a .pt (plain, Lightning with EMA,
DeepSpeed, pre-multimer names) -> fold, tensor for tensor."""

from __future__ import annotations

import pytest
import torch
from _trunk_helpers import randomize_
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.params_af2 import ParamsError
from fold_model.af2.params_openfold import load_openfold_params, openfold_state_dict

# OpenFold's names of a few tensors (openfold/model/*.py module attributes), one per rename rule
OPENFOLD_NAMES = {
    "template_embedder.linear_t.weight":
        "template_embedder.template_pair_embedder.linear.weight",
    "template_embedder.pair_stack.blocks.0.tri_att_end.linear_bias.weight":
        "template_embedder.template_pair_stack.blocks.0.tri_att_end.linear.weight",
    "template_embedder.pair_stack.layer_norm.bias":
        "template_embedder.template_pair_stack.layer_norm.bias",
    "template_embedder.pointwise_attention.mha.linear_q.weight":
        "template_embedder.template_pointwise_att.mha.linear_q.weight",
    "template_embedder.angle_embedder.linear_2.bias":
        "template_embedder.template_single_embedder.linear_2.bias",
    "evoformer.blocks.1.tri_mul_in.linear_a_p.weight":
        "evoformer.blocks.1.pair_stack.tri_mul_in.linear_a_p.weight",
    "evoformer.blocks.0.pair_transition.linear_1.bias":
        "evoformer.blocks.0.pair_stack.pair_transition.linear_1.bias",
    "evoformer.blocks.0.msa_att_col.mha.linear_g.bias":
        "evoformer.blocks.0.msa_att_col._msa_att.mha.linear_g.bias",
    "evoformer.blocks.0.msa_att_row.linear_z.weight":
        "evoformer.blocks.0.msa_att_row.linear_z.weight",
    "extra_msa_stack.blocks.0.msa_att_col.global_attention.linear_k.weight":
        "extra_msa_stack.blocks.0.msa_att_col.global_attention.linear_k.weight",
    "extra_msa_stack.blocks.0.tri_att_start.linear_bias.weight":
        "extra_msa_stack.blocks.0.pair_stack.tri_att_start.linear.weight",
    "evoformer.linear_s.weight": "evoformer.linear.weight",
    "structure_module.ipa.linear_kv_points.bias":
        "structure_module.ipa.linear_kv_points.linear.bias",
    "structure_module.ipa.linear_kv.weight": "structure_module.ipa.linear_kv.weight",
    "structure_module.transition.layers.0.4.weight":
        "structure_module.transition.layers.0.linear_3.weight",
    "structure_module.angle_resnet.blocks.1.3.bias":
        "structure_module.angle_resnet.layers.1.linear_2.bias",
    "aux_heads.tm.linear.weight": "aux_heads.tm.linear.weight",
}


def _model(**overrides):
    cfg = config("tiny", heads__tm_enabled=True, evoformer__no_blocks=2, **overrides)
    return cfg, randomize_(AlphaFold2(cfg), seed=3)


def test_openfold_names():
    _, model = _model()
    renamed = openfold_state_dict(model.state_dict())
    names = dict(zip(model.state_dict(), renamed))
    assert len(set(renamed)) == len(renamed)
    for fold, openfold in OPENFOLD_NAMES.items():
        assert names[fold] == openfold


@pytest.mark.parametrize("wrapper", ["plain", "lightning_ema", "lightning", "deepspeed"])
def test_round_trip(tmp_path, wrapper):
    cfg, model = _model()
    fold = {k: v.clone() for k, v in model.state_dict().items()}
    of = openfold_state_dict(fold)
    ema = {k: v + 1.0 for k, v in of.items()}
    obj = {
        "plain": of,
        "lightning_ema": {"state_dict": {f"model.{k}": v for k, v in of.items()},
                          "ema": {"decay": 0.999, "params": ema}, "epoch": 3},
        "lightning": {"state_dict": {f"model.{k}": v for k, v in of.items()}},
        "deepspeed": {"module": {f"model.{k}": v for k, v in of.items()}},
    }[wrapper]
    torch.save(obj, tmp_path / "of.pt")
    got_cfg, state = load_openfold_params(tmp_path / "of.pt", preset="tiny")
    assert got_cfg.heads.tm_enabled and got_cfg.evoformer.no_blocks == 2
    assert got_cfg.template.enabled and got_cfg.extra_msa.no_blocks == cfg.extra_msa.no_blocks
    assert set(state) == set(fold)
    shift = 1.0 if wrapper == "lightning_ema" else 0.0
    for k, v in fold.items():
        assert torch.equal(state[k], v + shift), k
    AlphaFold2(got_cfg).load_state_dict(state)
    if wrapper == "lightning_ema":  # the live weights on request
        _, live = load_openfold_params(tmp_path / "of.pt", use_ema=False, preset="tiny")
        assert all(torch.equal(live[k], v) for k, v in fold.items())


def test_pre_multimer_names(tmp_path):
    _, model = _model(template__enabled=False)
    of = openfold_state_dict(model.state_dict())
    old = {k.replace(".pair_stack.", ".core.").replace(".msa_transition.", ".core.msa_transition.")
           .replace("ipa.linear_q_points.linear.", "ipa.linear_q_points."): v
           for k, v in of.items()}
    assert any(".core.tri_mul_in." in k for k in old)
    torch.save(old, tmp_path / "old.pt")
    cfg, state = load_openfold_params(tmp_path / "old.pt", preset="tiny")
    assert not cfg.template.enabled
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_errors_name_file_and_key(tmp_path):
    _, model = _model()
    of = openfold_state_dict(model.state_dict())
    bad = dict(of)
    bad["evoformer.linear.weight"] = torch.zeros(3, 3)
    torch.save(bad, tmp_path / "shape.pt")
    with pytest.raises(ParamsError, match=r"shape.pt: evoformer.linear.weight: expected shape "
                                          r"\(20, 16\), got \(3, 3\)"):
        load_openfold_params(tmp_path / "shape.pt", preset="tiny")
    bad = dict(of)
    bad.pop("aux_heads.masked_msa.linear.bias")
    bad["aux_heads.new_head.weight"] = torch.zeros(1)
    torch.save(bad, tmp_path / "keys.pt")
    with pytest.raises(ParamsError, match=r"1 missing key.*masked_msa.linear.bias.*1 unexpected "
                                          r"key.*new_head"):
        load_openfold_params(tmp_path / "keys.pt", preset="tiny")
    (tmp_path / "junk.pt").write_text("hello")
    with pytest.raises(ParamsError, match="junk.pt: not a readable OpenFold checkpoint"):
        load_openfold_params(tmp_path / "junk.pt", preset="tiny")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ParamsError, match="not an OpenFold checkpoint"):
        load_openfold_params(tmp_path / "list.pt", preset="tiny")
