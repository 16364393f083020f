"""The AlphaFold2 assembly: outputs, recycling, parameter count, bf16 autocast, configs."""

from __future__ import annotations

import pytest
import torch
from _trunk_helpers import MODEL_INPUTS, make_batch, randomize_
from fold_data.af2.schema import SAMPLE_FEATURES
from fold_data.schema import validate
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.model import pseudo_beta


def _tiny_model(**overrides):
    torch.manual_seed(0)
    return randomize_(AlphaFold2(config("tiny", **overrides)))


def test_batch_helper_follows_the_feature_contract():
    batch = make_batch()
    validate(batch, {k: SAMPLE_FEATURES[k] for k in MODEL_INPUTS}, batched=True)


@pytest.mark.parametrize("order", ["af2", "parallel"])
def test_forward_outputs(order):
    model = _tiny_model(block_order=order).eval()
    cfg = model.config.evoformer
    batch = make_batch(b=2, r=2, n_res=9, n_clust=5)
    with torch.no_grad():
        out = model(batch)
    shapes = {
        "msa": (2, 5, 9, cfg.c_m), "pair": (2, 9, 9, cfg.c_z), "single": (2, 9, cfg.c_s),
        "final_atom_positions": (2, 9, 37, 3), "final_atom_mask": (2, 9, 37),
        "distogram_logits": (2, 9, 9, 64), "masked_msa_logits": (2, 5, 9, 23),
        "plddt": (2, 9), "experimentally_resolved_logits": (2, 9, 37),
    }
    for key, shape in shapes.items():
        assert tuple(out[key].shape) == shape, key
        assert torch.isfinite(out[key]).all(), key
    assert "lddt_logits" in out and isinstance(out["sm"], dict)


def test_recycling_passes_and_gradient_only_through_last():
    model = _tiny_model()
    batch = make_batch(r=3)
    grad_modes = []
    model.evoformer.register_forward_hook(lambda *a: grad_modes.append(torch.is_grad_enabled()))
    out = model(batch)
    assert grad_modes == [False, False, True]
    out["pair"].square().mean().backward()
    assert model.recycling_embedder.layer_norm_z.weight.grad is not None

    # The recycled state really flows: 3 passes differ from 1 pass on the last slice.
    model.eval()
    with torch.no_grad():
        three = model(batch)["pair"]
        last = {k: v[:, 2:] for k, v in batch.items()}
        one = model(last)["pair"]
        again = model(batch, num_recycles=3)["pair"]
    assert torch.equal(three, again)
    assert (three - one).abs().max() > 1e-4
    with pytest.raises(ValueError, match="recycling"):
        model(batch, num_recycles=4)


def test_sample_num_recycles_covers_1_to_4():
    model = AlphaFold2(config("tiny", max_recycling_iters=3))
    g = torch.Generator().manual_seed(0)
    draws = {model.sample_num_recycles(g) for _ in range(200)}
    assert draws == {1, 2, 3, 4}


def test_manual_recycling_equals_forward():
    model = _tiny_model().eval()
    batch = make_batch(r=2, seed=3)
    with torch.no_grad():
        out = model(batch)
        o1, prev = model.iteration({k: v[:, 0] for k, v in batch.items()}, None)
        o2, _ = model.iteration({k: v[:, 1] for k, v in batch.items()}, prev)
    assert torch.equal(out["pair"], o2["pair"])
    assert not torch.equal(o1["pair"], o2["pair"])


def test_bf16_autocast_forward_backward_finite():
    model = _tiny_model().train()
    batch = make_batch(r=1, seed=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    assert out["final_atom_positions"].dtype == torch.float32  # structure module in fp32
    loss = out["pair"].float().square().mean() + out["final_atom_positions"].square().mean()
    loss.backward()
    for key in ("msa", "pair", "single", "final_atom_positions", "plddt"):
        assert torch.isfinite(out[key].float()).all(), key
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), n


def _evoformer_block_params(c_m: int, c_z: int) -> int:
    """Hand count of one Evoformer block (supplement Alg. 7-15 with the AF2 sizes)."""
    def lin(i, o, bias=True):
        return i * o + (o if bias else 0)

    def ln(c):
        return 2 * c

    def gated_mha(c, hd):
        return 3 * lin(c, hd, False) + lin(c, hd) + lin(hd, c)

    row = ln(c_m) + ln(c_z) + lin(c_z, 8, False) + gated_mha(c_m, 8 * 32)
    col = ln(c_m) + gated_mha(c_m, 8 * 32)
    msa_tr = ln(c_m) + lin(c_m, 4 * c_m) + lin(4 * c_m, c_m)
    opm = ln(c_m) + 2 * lin(c_m, 32) + lin(32 * 32, c_z)
    tri_mul = ln(c_z) + 4 * lin(c_z, 128) + lin(c_z, c_z) + ln(128) + lin(128, c_z)
    tri_att = ln(c_z) + lin(c_z, 4, False) + gated_mha(c_z, 4 * 32)
    pair_tr = ln(c_z) + lin(c_z, 4 * c_z) + lin(4 * c_z, c_z)
    return row + col + msa_tr + opm + 2 * tri_mul + 2 * tri_att + pair_tr


def test_parameter_count_af2_initial():
    with torch.device("meta"):
        model = AlphaFold2(config("af2_initial"))
    block = sum(p.numel() for p in model.evoformer.blocks[0].parameters())
    assert block == _evoformer_block_params(256, 128)
    evo = sum(p.numel() for p in model.evoformer.parameters())
    assert evo == 48 * block + 256 * 384 + 384
    total = sum(p.numel() for p in model.parameters())
    assert abs(total - 93.2e6) / 93.2e6 < 0.01, total  # AF2 / OpenFold: about 93 M


def test_pseudo_beta_uses_ca_for_glycine():
    atoms = torch.randn(1, 3, 37, 3)
    aatype = torch.tensor([[7, 0, 7]])
    pb = pseudo_beta(aatype, atoms)
    assert torch.equal(pb[0, 0], atoms[0, 0, 1]) and torch.equal(pb[0, 1], atoms[0, 1, 3])


def test_config_presets_and_overrides():
    cfg = config("af2_initial")
    assert (cfg.evoformer.c_m, cfg.evoformer.c_z, cfg.evoformer.c_s) == (256, 128, 384)
    assert (cfg.evoformer.no_blocks, cfg.extra_msa.no_blocks, cfg.template.no_blocks) == (48, 4, 2)
    assert (cfg.extra_msa.c_e, cfg.template.c_t) == (64, 64)
    ft = config("af2_finetune")
    assert ft.loss.violation_weight > 0 and cfg.loss.violation_weight == 0
    tiny = config("tiny", block_order="multimer", evoformer__no_blocks=3, chunk_size=4)
    assert tiny.block_order == "multimer" and tiny.evoformer.no_blocks == 3
    with pytest.raises(ValueError, match="preset"):
        config("huge")
    with pytest.raises(ValueError, match="block_order"):
        config("tiny", block_order="diagonal")
    with pytest.raises(ValueError, match="no field|has no"):
        config("tiny", evoformer__c_q=3)

