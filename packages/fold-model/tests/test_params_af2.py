"""Importing AlphaFold2's released parameters (``params_model_{1..5}[_ptm].npz``).

The test writes archives with AF2's key names and per-block shapes (written here from AF2's
``modules.py`` / ``folding.py`` and ``model/config.py``, not from the importer), random values
and a known value per array: array number ``n`` holds values in ``[n, n + 0.5)``. It checks that
each fold tensor equals the array its AF2 name says, in fold's layout, and that nothing is left
over on either side. The stacks are 2 Evoformer, 1 extra-MSA and 1 template block deep (the
released files have 48 / 4 / 2: the same names with a longer leading axis); one test imports the
full depth.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.params_af2 import (
    PREFIX,
    ParamsError,
    alphafold_arrays,
    load_alphafold_params,
)

C_M, C_Z, C_E, C_S, C_T = 256, 128, 64, 384, 64  # AF2 model config channel sizes


def _linear(scope, n_in, n_out):
    return {f"{scope}//weights": (n_in, n_out), f"{scope}//bias": (n_out,)}


def _norm(scope, c):
    return {f"{scope}//scale": (c,), f"{scope}//offset": (c,)}


def _attention(scope, c_q, c_kv, h, c, gated=True):
    out = {f"{scope}//query_w": (c_q, h, c), f"{scope}//key_w": (c_kv, h, c),
           f"{scope}//value_w": (c_kv, h, c), f"{scope}//output_w": (h, c, c_q),
           f"{scope}//output_b": (c_q,)}
    if gated:
        out |= {f"{scope}//gating_w": (c_q, h, c), f"{scope}//gating_b": (h, c)}
    return out


def _pair_block(scope, c, h_att, c_att, c_mul, n_trans):
    out = {}
    for name in ("triangle_multiplication_outgoing", "triangle_multiplication_incoming"):
        s = f"{scope}/{name}"
        out |= _norm(f"{s}/layer_norm_input", c) | _norm(f"{s}/center_layer_norm", c_mul)
        for proj in ("left_projection", "right_projection", "left_gate", "right_gate"):
            out |= _linear(f"{s}/{proj}", c, c_mul)
        out |= _linear(f"{s}/output_projection", c_mul, c) | _linear(f"{s}/gating_linear", c, c)
    for name in ("triangle_attention_starting_node", "triangle_attention_ending_node"):
        s = f"{scope}/{name}"
        out |= _norm(f"{s}/query_norm", c) | {f"{s}//feat_2d_weights": (c, h_att)}
        out |= _attention(f"{s}/attention", c, c, h_att, c_att)
    s = f"{scope}/pair_transition"
    out |= _norm(f"{s}/input_layer_norm", c) | _linear(f"{s}/transition1", c, n_trans * c)
    return out | _linear(f"{s}/transition2", n_trans * c, c)


def _msa_block(scope, c_m, c_att, extra):
    s = f"{scope}/msa_row_attention_with_pair_bias"
    out = _norm(f"{s}/query_norm", c_m) | _norm(f"{s}/feat_2d_norm", C_Z)
    out |= {f"{s}//feat_2d_weights": (C_Z, 8)} | _attention(f"{s}/attention", c_m, c_m, 8, c_att)
    if extra:
        s = f"{scope}/msa_column_global_attention"
        out |= _norm(f"{s}/query_norm", c_m)
        out |= _attention(f"{s}/attention", c_m, c_m, 8, c_att)
        out |= {f"{s}/attention//key_w": (c_m, c_att), f"{s}/attention//value_w": (c_m, c_att)}
    else:
        s = f"{scope}/msa_column_attention"
        out |= _norm(f"{s}/query_norm", c_m) | _attention(f"{s}/attention", c_m, c_m, 8, c_att)
    s = f"{scope}/msa_transition"
    out |= _norm(f"{s}/input_layer_norm", c_m) | _linear(f"{s}/transition1", c_m, 4 * c_m)
    out |= _linear(f"{s}/transition2", 4 * c_m, c_m)
    s = f"{scope}/outer_product_mean"
    out |= _norm(f"{s}/layer_norm_input", c_m) | _linear(f"{s}/left_projection", c_m, 32)
    out |= _linear(f"{s}/right_projection", c_m, 32)
    out |= {f"{s}//output_w": (32, 32, C_Z), f"{s}//output_b": (C_Z,)}
    return out | _pair_block(scope, C_Z, 4, 32, 128, 4)


def af2_shapes(templates: bool, ptm: bool, n_evo: int, n_extra: int, n_templ: int):
    """AF2 monomer parameter names (without the ``alphafold/alphafold_iteration/`` prefix) and
    shapes; stacked scopes get their block count as leading axis."""
    ev = "evoformer"
    out = (_linear(f"{ev}/preprocess_1d", 22, C_M) | _linear(f"{ev}/preprocess_msa", 49, C_M)
           | _linear(f"{ev}/left_single", 22, C_Z) | _linear(f"{ev}/right_single", 22, C_Z)
           | _linear(f"{ev}/prev_pos_linear", 15, C_Z)
           | _norm(f"{ev}/prev_msa_first_row_norm", C_M) | _norm(f"{ev}/prev_pair_norm", C_Z)
           | _linear(f"{ev}/pair_activiations", 65, C_Z)
           | _linear(f"{ev}/extra_msa_activations", 25, C_E)
           | _linear(f"{ev}/single_activations", C_M, C_S))
    stacked = {}
    for k, v in _msa_block(f"{ev}/evoformer_iteration", C_M, 32, extra=False).items():
        stacked[k] = (n_evo, *v)
    for k, v in _msa_block(f"{ev}/extra_msa_stack", C_E, 8, extra=True).items():
        stacked[k] = (n_extra, *v)
    if templates:
        te = f"{ev}/template_embedding"
        st = f"{te}/single_template_embedding"
        out |= _linear(f"{st}/embedding2d", 88, C_T) | _norm(f"{st}/output_layer_norm", C_T)
        out |= _attention(f"{te}/attention", C_Z, C_T, 4, 16, gated=False)
        out |= _linear(f"{ev}/template_single_embedding", 57, C_M)
        out |= _linear(f"{ev}/template_projection", C_M, C_M)
        for k, v in _pair_block(f"{st}/template_pair_stack/__layer_stack_no_state", C_T, 4, 16,
                                64, 2).items():
            stacked[k] = (n_templ, *v)
    sm, it = "structure_module", "structure_module/fold_iteration"
    ipa = f"{it}/invariant_point_attention"
    out |= (_norm(f"{sm}/single_layer_norm", C_S) | _linear(f"{sm}/initial_projection", C_S, C_S)
            | _norm(f"{sm}/pair_layer_norm", C_Z)
            | _linear(f"{ipa}/q_scalar", C_S, 12 * 16) | _linear(f"{ipa}/kv_scalar", C_S, 12 * 32)
            | _linear(f"{ipa}/q_point_local", C_S, 12 * 3 * 4)
            | _linear(f"{ipa}/kv_point_local", C_S, 12 * 3 * 12)
            | {f"{ipa}//trainable_point_weights": (12,)}
            | _linear(f"{ipa}/attention_2d", C_Z, 12)
            | _linear(f"{ipa}/output_projection", 12 * (16 + 8 * 4 + C_Z), C_S)
            | _norm(f"{it}/attention_layer_norm", C_S) | _norm(f"{it}/transition_layer_norm", C_S)
            | _linear(f"{it}/transition", C_S, C_S) | _linear(f"{it}/transition_1", C_S, C_S)
            | _linear(f"{it}/transition_2", C_S, C_S) | _linear(f"{it}/affine_update", C_S, 6))
    rs = f"{it}/rigid_sidechain"
    out |= _linear(f"{rs}/input_projection", C_S, 128) | _linear(f"{rs}/input_projection_1", C_S,
                                                                 128)
    for name in ("resblock1", "resblock2", "resblock1_1", "resblock2_1"):
        out |= _linear(f"{rs}/{name}", 128, 128)
    out |= _linear(f"{rs}/unnormalized_angles", 128, 14)
    out |= (_norm("predicted_lddt_head/input_layer_norm", C_S)
            | _linear("predicted_lddt_head/act_0", C_S, 128)
            | _linear("predicted_lddt_head/act_1", 128, 128)
            | _linear("predicted_lddt_head/logits", 128, 50)
            | _linear("distogram_head/half_logits", C_Z, 64)
            | _linear("experimentally_resolved_head/logits", C_S, 37)
            | _linear("masked_msa_head/logits", C_M, 23))
    if ptm:
        out |= _linear("predicted_aligned_error_head/logits", C_Z, 64)
    return out | stacked


# ------------------------------------------------------------------ the expected fold names
_TOP = {  # AF2 module scope -> fold module
    "evoformer/preprocess_1d": "input_embedder.linear_tf_m",
    "evoformer/preprocess_msa": "input_embedder.linear_msa_m",
    "evoformer/left_single": "input_embedder.linear_tf_z_i",
    "evoformer/right_single": "input_embedder.linear_tf_z_j",
    "evoformer/pair_activiations": "input_embedder.linear_relpos",
    "evoformer/prev_pos_linear": "recycling_embedder.linear",
    "evoformer/prev_msa_first_row_norm": "recycling_embedder.layer_norm_m",
    "evoformer/prev_pair_norm": "recycling_embedder.layer_norm_z",
    "evoformer/extra_msa_activations": "extra_msa_embedder.linear",
    "evoformer/single_activations": "evoformer.linear_s",
    "evoformer/template_embedding/single_template_embedding/embedding2d":
        "template_embedder.linear_t",
    "evoformer/template_embedding/single_template_embedding/output_layer_norm":
        "template_embedder.pair_stack.layer_norm",
    "evoformer/template_embedding/attention": "template_embedder.pointwise_attention.mha",
    "evoformer/template_single_embedding": "template_embedder.angle_embedder.linear_1",
    "evoformer/template_projection": "template_embedder.angle_embedder.linear_2",
    "structure_module/single_layer_norm": "structure_module.layer_norm_s",
    "structure_module/initial_projection": "structure_module.linear_in",
    "structure_module/pair_layer_norm": "structure_module.layer_norm_z",
    "predicted_lddt_head/input_layer_norm": "aux_heads.plddt.layer_norm",
    "predicted_lddt_head/act_0": "aux_heads.plddt.linear_1",
    "predicted_lddt_head/act_1": "aux_heads.plddt.linear_2",
    "predicted_lddt_head/logits": "aux_heads.plddt.linear_3",
    "distogram_head/half_logits": "aux_heads.distogram.linear",
    "experimentally_resolved_head/logits": "aux_heads.experimentally_resolved.linear",
    "masked_msa_head/logits": "aux_heads.masked_msa.linear",
    "predicted_aligned_error_head/logits": "aux_heads.tm.linear",
}
_FOLD_ITERATION = {
    "invariant_point_attention/q_scalar": "ipa.linear_q",
    "invariant_point_attention/kv_scalar": "ipa.linear_kv",
    "invariant_point_attention/q_point_local": "ipa.linear_q_points",
    "invariant_point_attention/kv_point_local": "ipa.linear_kv_points",
    "invariant_point_attention/attention_2d": "ipa.linear_b",
    "invariant_point_attention/output_projection": "ipa.linear_out",
    "invariant_point_attention": "ipa",
    "attention_layer_norm": "layer_norm_ipa",
    "transition": "transition.layers.0.0",
    "transition_1": "transition.layers.0.2",
    "transition_2": "transition.layers.0.4",
    "transition_layer_norm": "transition.layer_norm",
    "affine_update": "bb_update.linear",
    "rigid_sidechain/input_projection": "angle_resnet.linear_in",
    "rigid_sidechain/input_projection_1": "angle_resnet.linear_initial",
    "rigid_sidechain/resblock1": "angle_resnet.blocks.0.1",
    "rigid_sidechain/resblock2": "angle_resnet.blocks.0.3",
    "rigid_sidechain/resblock1_1": "angle_resnet.blocks.1.1",
    "rigid_sidechain/resblock2_1": "angle_resnet.blocks.1.3",
    "rigid_sidechain/unnormalized_angles": "angle_resnet.linear_out",
}
_STACKS = {
    "evoformer/evoformer_iteration": "evoformer.blocks",
    "evoformer/extra_msa_stack": "extra_msa_stack.blocks",
    "evoformer/template_embedding/single_template_embedding/template_pair_stack/"
    "__layer_stack_no_state": "template_embedder.pair_stack.blocks",
}
_BLOCK = {
    "msa_row_attention_with_pair_bias/query_norm": "msa_att_row.layer_norm_m",
    "msa_row_attention_with_pair_bias/feat_2d_norm": "msa_att_row.layer_norm_z",
    "msa_row_attention_with_pair_bias": "msa_att_row.linear_z",  # feat_2d_weights
    "msa_row_attention_with_pair_bias/attention": "msa_att_row.mha",
    "msa_column_attention/query_norm": "msa_att_col.layer_norm_m",
    "msa_column_attention/attention": "msa_att_col.mha",
    "msa_column_global_attention/query_norm": "msa_att_col.layer_norm_m",
    "msa_column_global_attention/attention": "msa_att_col.global_attention",
    "msa_transition/input_layer_norm": "msa_transition.layer_norm",
    "msa_transition/transition1": "msa_transition.linear_1",
    "msa_transition/transition2": "msa_transition.linear_2",
    "outer_product_mean/layer_norm_input": "outer_product_mean.layer_norm",
    "outer_product_mean/left_projection": "outer_product_mean.linear_1",
    "outer_product_mean/right_projection": "outer_product_mean.linear_2",
    "outer_product_mean": "outer_product_mean.linear_out",
    "pair_transition/input_layer_norm": "pair_transition.layer_norm",
    "pair_transition/transition1": "pair_transition.linear_1",
    "pair_transition/transition2": "pair_transition.linear_2",
}
for _node, _fold in (("starting", "start"), ("ending", "end")):
    _BLOCK |= {f"triangle_attention_{_node}_node/query_norm": f"tri_att_{_fold}.layer_norm",
               f"triangle_attention_{_node}_node": f"tri_att_{_fold}.linear_bias",
               f"triangle_attention_{_node}_node/attention": f"tri_att_{_fold}.mha"}
for _dir, _fold in (("outgoing", "out"), ("incoming", "in")):
    # Alg. 12 in AF2's code: 'kjc,kic->ijc', its left operand is fold's b (see the module doc)
    _l, _r = ("b", "a") if _dir == "incoming" else ("a", "b")
    _s = f"triangle_multiplication_{_dir}"
    _BLOCK |= {f"{_s}/layer_norm_input": f"tri_mul_{_fold}.layer_norm_in",
               f"{_s}/left_projection": f"tri_mul_{_fold}.linear_{_l}_p",
               f"{_s}/right_projection": f"tri_mul_{_fold}.linear_{_r}_p",
               f"{_s}/left_gate": f"tri_mul_{_fold}.linear_{_l}_g",
               f"{_s}/right_gate": f"tri_mul_{_fold}.linear_{_r}_g",
               f"{_s}/center_layer_norm": f"tri_mul_{_fold}.layer_norm_out",
               f"{_s}/output_projection": f"tri_mul_{_fold}.linear_z",
               f"{_s}/gating_linear": f"tri_mul_{_fold}.linear_g"}


def expected_fold(key: str, a: np.ndarray) -> tuple[str, torch.Tensor]:
    """Fold's name and value of the AF2 array ``a`` named ``key`` (one block of a stack)."""
    scope, name = key.split("//")
    for af2, fold in _STACKS.items():
        if scope == af2 or scope.startswith(af2 + "/"):
            module = "{i}." + _BLOCK[scope[len(af2) + 1:]] if scope != af2 else "{i}"
            module = f"{fold}.{module}"
            break
    else:
        if scope.startswith("structure_module/fold_iteration/"):
            module = "structure_module." + _FOLD_ITERATION[
                scope[len("structure_module/fold_iteration/"):]]
        else:
            module = _TOP[scope]
    t = torch.from_numpy(np.asarray(a, dtype=np.float32))
    role = {  # Haiku name -> (fold parameter, how the array is laid out)
        "weights": ("weight", "T"), "bias": ("bias", ""), "scale": ("weight", ""),
        "offset": ("bias", ""), "feat_2d_weights": ("weight", "T"),
        "trainable_point_weights": ("head_weights", ""),
        "query_w": ("linear_q.weight", "in"), "key_w": ("linear_k.weight", "in"),
        "value_w": ("linear_v.weight", "in"), "gating_w": ("linear_g.weight", "in"),
        "gating_b": ("linear_g.bias", "flat"), "output_w": ("linear_o.weight", "out"),
        "output_b": ("linear_o.bias", ""),
    }[name]
    if "outer_product_mean" in module and name == "output_w":  # [c, c, C_z]
        return f"{module}.weight", t.reshape(-1, t.shape[-1]).T
    if "outer_product_mean" in module and name == "output_b":
        return f"{module}.bias", t
    param, how = role
    if how == "T" or (how == "in" and t.dim() == 2):  # global attention: one k/v head
        t = t.T
    elif how == "in":
        t = t.reshape(t.shape[0], -1).T
    elif how == "out":
        t = t.reshape(-1, t.shape[-1]).T
    elif how == "flat":
        t = t.reshape(-1)
    return f"{module}.{param}", t


def write_params(path, shapes, seed=0):
    """Random arrays of ``shapes``; array ``n`` (block ``b`` of a stack: ``n + b``) holds values
    in ``[n, n + 0.5)``, its known value."""
    g = np.random.default_rng(seed)
    arrays, n = {}, 0
    for key, shape in sorted(shapes.items()):
        a = g.random(shape, dtype=np.float32) * 0.5
        stacked = any(key.startswith(s + "/") for s in _STACKS)
        if stacked:
            a += (n + np.arange(shape[0], dtype=np.float32)).reshape(-1, *[1] * (len(shape) - 1))
            n += shape[0]
        else:
            a += n
            n += 1
        arrays[PREFIX + key] = a
    np.savez(path, **arrays)
    return arrays


VARIANTS = [f"model_{i}{s}" for i in range(1, 6) for s in ("", "_ptm")]


def _check_import(arrays, cfg, state):
    model_keys = set(AlphaFold2(cfg).state_dict()) if cfg.evoformer.no_blocks < 8 else None
    seen = {}
    for key, a in arrays.items():
        key = key[len(PREFIX):]
        stacked = any(key.startswith(s + "/") for s in _STACKS)
        for b, block in enumerate(a if stacked else [a]):
            fold_key, want = expected_fold(key, block)
            fold_key = fold_key.format(i=b)
            assert fold_key not in seen, f"{key} and {seen[fold_key]} both land on {fold_key}"
            seen[fold_key] = key
            assert torch.equal(state[fold_key], want), f"{key}[{b}] -> {fold_key}"
    assert set(state) == set(seen)  # nothing of fold's left unfilled, nothing invented
    if model_keys is not None:
        assert set(state) == model_keys


@pytest.mark.parametrize("variant", VARIANTS)
def test_import_every_variant(tmp_path, variant):
    templates = variant.split("_")[1] in ("1", "2")  # models 3-5 were trained without
    ptm = variant.endswith("_ptm")
    shapes = af2_shapes(templates, ptm, n_evo=2, n_extra=1, n_templ=1)
    path = tmp_path / f"params_{variant}.npz"
    arrays = write_params(path, shapes)
    cfg, state = load_alphafold_params(path)
    assert cfg.template.enabled is templates and cfg.heads.tm_enabled is ptm
    assert (cfg.evoformer.no_blocks, cfg.extra_msa.no_blocks) == (2, 1)
    assert cfg.template.use_unit_vector is False and cfg.evoformer.opm_divide_bias is True
    _check_import(arrays, cfg, state)
    model = AlphaFold2(cfg)
    model.load_state_dict(state)  # strict: the same keys and shapes


def test_import_full_depth(tmp_path):
    """A file of the released size (93 M parameters: 48 / 4 / 2 blocks), model_1_ptm layout."""
    shapes = af2_shapes(True, True, n_evo=48, n_extra=4, n_templ=2)
    arrays = write_params(tmp_path / "params_model_1_ptm.npz", shapes)
    cfg, state = load_alphafold_params(tmp_path / "params_model_1_ptm.npz")
    ref = config("af2_finetune", heads__tm_enabled=True)
    assert (cfg.evoformer, cfg.extra_msa, cfg.template) == (ref.evoformer, ref.extra_msa,
                                                          ref.template)
    _check_import(arrays, cfg, state)
    with torch.device("meta"):
        shapes_fold = {k: v.shape for k, v in AlphaFold2(cfg).state_dict().items()}
    assert {k: v.shape for k, v in state.items()} == shapes_fold


def _small(tmp_path, change=None, name="params_model_3.npz"):
    shapes = af2_shapes(False, False, n_evo=1, n_extra=1, n_templ=1)
    arrays = write_params(tmp_path / name, shapes)
    if change is not None:
        change(arrays)
        np.savez(tmp_path / name, **arrays)
    return tmp_path / name


def test_missing_key_is_named(tmp_path):
    key = PREFIX + "structure_module/fold_iteration/affine_update//bias"
    path = _small(tmp_path, lambda a: a.pop(key))
    with pytest.raises(ParamsError, match="1 missing key.*affine_update//bias") as e:
        load_alphafold_params(path)
    assert str(path) in str(e.value)


def test_unexpected_key_is_named(tmp_path):
    path = _small(tmp_path, lambda a: a.update(
        {PREFIX + "structure_module/something_new//weights": np.zeros(3, np.float32)}))
    with pytest.raises(ParamsError, match="1 unexpected key.*something_new"):
        load_alphafold_params(path)


def test_wrong_shape_names_key_and_shapes(tmp_path):
    key = PREFIX + "evoformer/evoformer_iteration/outer_product_mean//output_w"
    path = _small(tmp_path, lambda a: a.update({key: np.zeros((1, 32, 16, 128), np.float32)}))
    with pytest.raises(ParamsError, match=r"outer_product_mean//output_w: expected shape "
                                          r"\(1, 32, 32, 128\), got \(1, 32, 16, 128\)"):
        load_alphafold_params(path)


def test_not_a_parameter_file(tmp_path):
    text = tmp_path / "params_model_1.npz"
    text.write_text("not a zip archive")
    with pytest.raises(ParamsError, match="not an AlphaFold2 parameter file"):
        load_alphafold_params(text)
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ParamsError, match="expected keys 'alphafold/alphafold_iteration/"):
        load_alphafold_params(tmp_path / "other.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ParamsError, match="got a single array"):
        load_alphafold_params(tmp_path / "single.npy")


def test_export_round_trip(tmp_path):
    """fold -> AF2 layout -> fold is the identity, and the export has AF2's names and shapes."""
    cfg = config("af2_finetune", heads__tm_enabled=True, evoformer__no_blocks=2,
                 extra_msa__no_blocks=1, template__no_blocks=1)
    state = {k: torch.randn(v.shape) for k, v in AlphaFold2(cfg).state_dict().items()}
    arrays = alphafold_arrays(cfg, state)
    want = af2_shapes(True, True, n_evo=2, n_extra=1, n_templ=1)
    assert {k[len(PREFIX):]: v.shape for k, v in arrays.items()} == want
    np.savez(tmp_path / "params_model_1_ptm.npz", **arrays)
    _, back = load_alphafold_params(tmp_path / "params_model_1_ptm.npz")
    assert set(back) == set(state) and all(torch.equal(back[k], v) for k, v in state.items())
