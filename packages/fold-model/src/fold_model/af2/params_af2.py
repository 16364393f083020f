"""AlphaFold2's released parameters (``params_model_{1..5}[_ptm].npz``) as a fold state dict.

The ``.npz`` holds one array per Haiku parameter, keyed ``"<module scope>//<name>"`` under
``alphafold/alphafold_iteration/``. Differences from fold's layout, undone here:

* Haiku ``Linear`` weights are ``[in, out]`` (torch: ``[out, in]``); layer norms are
  ``scale`` / ``offset``;
* attention weights are per head: ``query_w [in, H, c]``, ``output_w [H, c, out]``,
  ``gating_b [H, c]``; the outer product mean's ``output_w`` is ``[c, c, C_z]``;
* the 48 Evoformer blocks, 4 extra-MSA blocks and 2 template pair blocks are stacked along a
  leading axis (``hk.layer_stack``: ``evoformer_iteration``, ``extra_msa_stack``,
  ``template_pair_stack/__layer_stack_no_state``);
* incoming triangle multiplication computes ``sum_k left_kj right_ki`` (``'kjc,kic->ijc'``),
  so AF2's ``left_*`` projections are fold's ``b`` and ``right_*`` fold's ``a``;
* models 3-5 have no template embedding; the ``_ptm`` models add
  ``predicted_aligned_error_head``.

``load_alphafold_params(path)`` reads a file, checks every key and shape (a missing, unexpected
or misshapen parameter is a :class:`ParamsError` naming the file and the key) and returns the
:class:`AlphaFold2Config` it needs (``af2_finetune`` with templates and the pTM head as the file
has them) with the state dict. Get the files from AlphaFold's release
(``https://storage.googleapis.com/alphafold/alphafold_params_2022-12-06.tar``).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fold_model.af2.config import AlphaFold2Config, config

__all__ = ["PREFIX", "ParamsError", "af2_key_map", "alphafold_arrays", "alphafold_config",
           "load_alphafold_params"]

PREFIX = "alphafold/alphafold_iteration/"


class ParamsError(ValueError):
    """A parameter file that cannot be imported: names the file and what was wrong."""

    def __init__(self, path: str | os.PathLike, message: str) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {message}")


@dataclass(frozen=True)
class _Layout:
    """How one AF2 array becomes one fold tensor (``to_fold``), back (``to_af2``), and which AF2
    shape a fold shape implies (``af2_shape``: the expected shape in error messages)."""

    to_fold: Callable[[np.ndarray], np.ndarray]
    to_af2: Callable[[np.ndarray], np.ndarray]
    af2_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


_SAME = _Layout(lambda a: a, lambda a: a, lambda s: s)
_LINEAR = _Layout(lambda a: a.T, lambda a: a.T, lambda s: s[::-1])  # [in, out] -> [out, in]


def _heads_in(h: int) -> _Layout:  # [in, H, c] -> [H * c, in]
    return _Layout(lambda a: a.reshape(a.shape[0], -1).T,
                   lambda a: a.T.reshape(a.shape[1], h, -1), lambda s: (s[1], h, s[0] // h))


def _heads_out(h: int) -> _Layout:  # [H, c, out] -> [out, H * c]
    return _Layout(lambda a: a.reshape(-1, a.shape[-1]).T,
                   lambda a: a.T.reshape(h, -1, a.shape[0]), lambda s: (h, s[1] // h, s[0]))


def _heads_bias(h: int) -> _Layout:  # [H, c] -> [H * c]
    return _Layout(lambda a: a.reshape(-1), lambda a: a.reshape(h, -1), lambda s: (h, s[0] // h))


def _opm_out(c: int) -> _Layout:  # [c, c, C_z] -> [C_z, c * c]
    return _Layout(lambda a: a.reshape(-1, a.shape[-1]).T,
                   lambda a: a.T.reshape(c, c, a.shape[0]), lambda s: (c, c, s[0]))


# An entry: AF2 key (without PREFIX) -> (fold key, layout); ``{i}`` in a fold key marks a
# stacked parameter whose leading axis runs over the blocks.
KeyMap = dict[str, tuple[str, _Layout]]


def _linear(af2: str, fold: str, bias: bool = True) -> KeyMap:
    out = {f"{af2}//weights": (f"{fold}.weight", _LINEAR)}
    if bias:
        out[f"{af2}//bias"] = (f"{fold}.bias", _SAME)
    return out


def _norm(af2: str, fold: str) -> KeyMap:
    return {f"{af2}//scale": (f"{fold}.weight", _SAME), f"{af2}//offset": (f"{fold}.bias", _SAME)}


def _attention(af2: str, fold: str, h: int, gated: bool = True) -> KeyMap:
    """AF2 ``Attention``: q/k/v without bias, optional gate, output with bias."""
    out = {
        f"{af2}//query_w": (f"{fold}.linear_q.weight", _heads_in(h)),
        f"{af2}//key_w": (f"{fold}.linear_k.weight", _heads_in(h)),
        f"{af2}//value_w": (f"{fold}.linear_v.weight", _heads_in(h)),
        f"{af2}//output_w": (f"{fold}.linear_o.weight", _heads_out(h)),
        f"{af2}//output_b": (f"{fold}.linear_o.bias", _SAME),
    }
    if gated:
        out[f"{af2}//gating_w"] = (f"{fold}.linear_g.weight", _heads_in(h))
        out[f"{af2}//gating_b"] = (f"{fold}.linear_g.bias", _heads_bias(h))
    return out


def _global_attention(af2: str, fold: str, h: int) -> KeyMap:
    """AF2 ``GlobalAttention``: one shared key/value head (``key_w [in, c]``)."""
    out = _attention(af2, fold, h)
    out[f"{af2}//key_w"] = (f"{fold}.linear_k.weight", _LINEAR)
    out[f"{af2}//value_w"] = (f"{fold}.linear_v.weight", _LINEAR)
    return out


def _triangle_attention(af2: str, fold: str, h: int) -> KeyMap:
    return {
        **_norm(f"{af2}/query_norm", f"{fold}.layer_norm"),
        f"{af2}//feat_2d_weights": (f"{fold}.linear_bias.weight", _LINEAR),
        **_attention(f"{af2}/attention", f"{fold}.mha", h),
    }


def _triangle_multiplication(af2: str, fold: str, incoming: bool) -> KeyMap:
    # incoming: AF2's einsum 'kjc,kic->ijc' takes left as the j operand, i.e. fold's b
    left, right = ("b", "a") if incoming else ("a", "b")
    return {
        **_norm(f"{af2}/layer_norm_input", f"{fold}.layer_norm_in"),
        **_linear(f"{af2}/left_projection", f"{fold}.linear_{left}_p"),
        **_linear(f"{af2}/right_projection", f"{fold}.linear_{right}_p"),
        **_linear(f"{af2}/left_gate", f"{fold}.linear_{left}_g"),
        **_linear(f"{af2}/right_gate", f"{fold}.linear_{right}_g"),
        **_norm(f"{af2}/center_layer_norm", f"{fold}.layer_norm_out"),
        **_linear(f"{af2}/output_projection", f"{fold}.linear_z"),
        **_linear(f"{af2}/gating_linear", f"{fold}.linear_g"),
    }


def _transition(af2: str, fold: str) -> KeyMap:
    return {
        **_norm(f"{af2}/input_layer_norm", f"{fold}.layer_norm"),
        **_linear(f"{af2}/transition1", f"{fold}.linear_1"),
        **_linear(f"{af2}/transition2", f"{fold}.linear_2"),
    }


def _pair_stack(af2: str, fold: str, h: int) -> KeyMap:
    return {
        **_triangle_multiplication(f"{af2}/triangle_multiplication_outgoing",
                                   f"{fold}.tri_mul_out", incoming=False),
        **_triangle_multiplication(f"{af2}/triangle_multiplication_incoming",
                                   f"{fold}.tri_mul_in", incoming=True),
        **_triangle_attention(f"{af2}/triangle_attention_starting_node",
                              f"{fold}.tri_att_start", h),
        **_triangle_attention(f"{af2}/triangle_attention_ending_node", f"{fold}.tri_att_end", h),
        **_transition(f"{af2}/pair_transition", f"{fold}.pair_transition"),
    }


def _evoformer_block(af2: str, fold: str, cfg, extra: bool) -> KeyMap:
    """One Evoformer / extra-MSA block (Alg. 6 / 18) of ``EvoformerConfig`` / ``ExtraMsaConfig``."""
    row, col = f"{af2}/msa_row_attention_with_pair_bias", f"{fold}.msa_att_row"
    opm, fold_opm = f"{af2}/outer_product_mean", f"{fold}.outer_product_mean"
    out = {
        **_norm(f"{row}/query_norm", f"{col}.layer_norm_m"),
        **_norm(f"{row}/feat_2d_norm", f"{col}.layer_norm_z"),
        f"{row}//feat_2d_weights": (f"{col}.linear_z.weight", _LINEAR),
        **_attention(f"{row}/attention", f"{col}.mha", cfg.no_heads_msa),
        **_transition(f"{af2}/msa_transition", f"{fold}.msa_transition"),
        **_norm(f"{opm}/layer_norm_input", f"{fold_opm}.layer_norm"),
        **_linear(f"{opm}/left_projection", f"{fold_opm}.linear_1"),
        **_linear(f"{opm}/right_projection", f"{fold_opm}.linear_2"),
        f"{opm}//output_w": (f"{fold_opm}.linear_out.weight", _opm_out(cfg.c_hidden_opm)),
        f"{opm}//output_b": (f"{fold_opm}.linear_out.bias", _SAME),
        **_pair_stack(af2, fold, cfg.no_heads_pair),
    }
    if extra:
        scope = f"{af2}/msa_column_global_attention"
        out.update(_norm(f"{scope}/query_norm", f"{fold}.msa_att_col.layer_norm_m"))
        out.update(_global_attention(f"{scope}/attention", f"{fold}.msa_att_col.global_attention",
                                     cfg.no_heads_msa))
    else:
        scope = f"{af2}/msa_column_attention"
        out.update(_norm(f"{scope}/query_norm", f"{fold}.msa_att_col.layer_norm_m"))
        out.update(_attention(f"{scope}/attention", f"{fold}.msa_att_col.mha", cfg.no_heads_msa))
    return out


def _template(cfg: AlphaFold2Config) -> KeyMap:
    t = cfg.template
    single = "evoformer/template_embedding/single_template_embedding"
    out = {
        **_linear(f"{single}/embedding2d", "template_embedder.linear_t"),
        **_norm(f"{single}/output_layer_norm", "template_embedder.pair_stack.layer_norm"),
        **_attention("evoformer/template_embedding/attention",
                     "template_embedder.pointwise_attention.mha", t.no_heads_pointwise,
                     gated=False),
    }
    stack = f"{single}/template_pair_stack/__layer_stack_no_state"
    out.update(_pair_stack(stack, "template_embedder.pair_stack.blocks.{i}", t.no_heads_tri_att))
    if t.embed_angles:
        out.update(_linear("evoformer/template_single_embedding",
                           "template_embedder.angle_embedder.linear_1"))
        out.update(_linear("evoformer/template_projection",
                           "template_embedder.angle_embedder.linear_2"))
    return out


def _structure_module(cfg: AlphaFold2Config) -> KeyMap:
    sm, it, fs = "structure_module", "structure_module/fold_iteration", "structure_module"
    ipa = f"{it}/invariant_point_attention"
    out = {
        **_norm(f"{sm}/single_layer_norm", f"{fs}.layer_norm_s"),
        **_linear(f"{sm}/initial_projection", f"{fs}.linear_in"),
        **_norm(f"{sm}/pair_layer_norm", f"{fs}.layer_norm_z"),
        **_linear(f"{ipa}/q_scalar", f"{fs}.ipa.linear_q"),
        **_linear(f"{ipa}/kv_scalar", f"{fs}.ipa.linear_kv"),
        **_linear(f"{ipa}/q_point_local", f"{fs}.ipa.linear_q_points"),
        **_linear(f"{ipa}/kv_point_local", f"{fs}.ipa.linear_kv_points"),
        f"{ipa}//trainable_point_weights": (f"{fs}.ipa.head_weights", _SAME),
        **_linear(f"{ipa}/attention_2d", f"{fs}.ipa.linear_b"),
        **_linear(f"{ipa}/output_projection", f"{fs}.ipa.linear_out"),
        **_norm(f"{it}/attention_layer_norm", f"{fs}.layer_norm_ipa"),
        **_norm(f"{it}/transition_layer_norm", f"{fs}.transition.layer_norm"),
        **_linear(f"{it}/affine_update", f"{fs}.bb_update.linear"),
    }
    # AF2's transition: Linear, ReLU, Linear, ReLU, Linear named transition, transition_1, ...
    n_layers = 3 * cfg.structure_module.no_transition_layers
    for k in range(n_layers):
        name = "transition" if k == 0 else f"transition_{k}"
        out.update(_linear(f"{it}/{name}", f"{fs}.transition.layers.{k // 3}.{2 * (k % 3)}"))
    rs = f"{it}/rigid_sidechain"
    out.update(_linear(f"{rs}/input_projection", f"{fs}.angle_resnet.linear_in"))
    out.update(_linear(f"{rs}/input_projection_1", f"{fs}.angle_resnet.linear_initial"))
    for b in range(cfg.structure_module.no_resnet_blocks):
        suffix = "" if b == 0 else f"_{b}"
        # each block is ReLU, Linear (resblock1), ReLU, Linear (resblock2)
        out.update(_linear(f"{rs}/resblock1{suffix}", f"{fs}.angle_resnet.blocks.{b}.1"))
        out.update(_linear(f"{rs}/resblock2{suffix}", f"{fs}.angle_resnet.blocks.{b}.3"))
    out.update(_linear(f"{rs}/unnormalized_angles", f"{fs}.angle_resnet.linear_out"))
    return out


def _heads(cfg: AlphaFold2Config) -> KeyMap:
    out = {
        **_linear("distogram_head/half_logits", "aux_heads.distogram.linear"),
        **_linear("masked_msa_head/logits", "aux_heads.masked_msa.linear"),
        **_linear("experimentally_resolved_head/logits",
                  "aux_heads.experimentally_resolved.linear"),
        **_norm("predicted_lddt_head/input_layer_norm", "aux_heads.plddt.layer_norm"),
        **_linear("predicted_lddt_head/act_0", "aux_heads.plddt.linear_1"),
        **_linear("predicted_lddt_head/act_1", "aux_heads.plddt.linear_2"),
        **_linear("predicted_lddt_head/logits", "aux_heads.plddt.linear_3"),
    }
    if cfg.heads.tm_enabled:
        out.update(_linear("predicted_aligned_error_head/logits", "aux_heads.tm.linear"))
    return out


def af2_key_map(cfg: AlphaFold2Config) -> KeyMap:
    """Every AF2 parameter of a monomer model with ``cfg``'s modules: AF2 key (without
    :data:`PREFIX`) -> (fold key, with ``{i}`` for stacked blocks, layout)."""
    ev = "evoformer"
    out = {
        **_linear(f"{ev}/preprocess_1d", "input_embedder.linear_tf_m"),
        **_linear(f"{ev}/preprocess_msa", "input_embedder.linear_msa_m"),
        **_linear(f"{ev}/left_single", "input_embedder.linear_tf_z_i"),
        **_linear(f"{ev}/right_single", "input_embedder.linear_tf_z_j"),
        **_linear(f"{ev}/pair_activiations", "input_embedder.linear_relpos"),  # AF2's spelling
        **_linear(f"{ev}/prev_pos_linear", "recycling_embedder.linear"),
        **_norm(f"{ev}/prev_msa_first_row_norm", "recycling_embedder.layer_norm_m"),
        **_norm(f"{ev}/prev_pair_norm", "recycling_embedder.layer_norm_z"),
        **_linear(f"{ev}/extra_msa_activations", "extra_msa_embedder.linear"),
        **_evoformer_block(f"{ev}/extra_msa_stack", "extra_msa_stack.blocks.{i}",
                           cfg.extra_msa, extra=True),
        **_evoformer_block(f"{ev}/evoformer_iteration", "evoformer.blocks.{i}", cfg.evoformer,
                           extra=False),
        **_linear(f"{ev}/single_activations", "evoformer.linear_s"),
        **_structure_module(cfg),
        **_heads(cfg),
    }
    if cfg.template.enabled:
        out.update(_template(cfg))
    return out


def _stack_depth(arrays: Mapping[str, np.ndarray], scope: str) -> int:
    """Blocks of a stacked scope: the leading size of one of its arrays (0 when absent)."""
    for key, a in arrays.items():
        if key.startswith(PREFIX + scope + "/"):
            return int(a.shape[0])
    return 0


def alphafold_config(arrays: Mapping[str, np.ndarray]) -> AlphaFold2Config:
    """The fold config of an AF2 parameter set: ``af2_finetune`` (the released weights are
    fine-tuned) with templates and the pTM head where the file has them and the block counts
    of its stacks (48 / 4 / 2 in every released model)."""
    templates = any(k.startswith(PREFIX + "evoformer/template_embedding/") for k in arrays)
    overrides = {
        "template__enabled": templates,
        "heads__tm_enabled": any(k.startswith(PREFIX + "predicted_aligned_error_head/")
                                 for k in arrays),
        "evoformer__no_blocks": _stack_depth(arrays, "evoformer/evoformer_iteration"),
        "extra_msa__no_blocks": _stack_depth(arrays, "evoformer/extra_msa_stack"),
    }
    if templates:
        overrides["template__no_blocks"] = _stack_depth(
            arrays, "evoformer/template_embedding/single_template_embedding/template_pair_stack")
    return config("af2_finetune", **overrides)


def _read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ParamsError(path, f"not an AlphaFold2 parameter file (.npz): {e}") from e
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ParamsError(path, "not an AlphaFold2 parameter file (expected an .npz archive of "
                                "arrays, got a single array)")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ParamsError(path, f"unreadable parameter archive: {e}") from e


def _fold_shapes(cfg: AlphaFold2Config) -> dict[str, tuple[int, ...]]:
    from fold_model.af2.model import AlphaFold2

    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = AlphaFold2(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def alphafold_arrays(
    cfg: AlphaFold2Config, state: dict[str, torch.Tensor]
) -> dict[str, np.ndarray]:
    """A fold AF2 state dict in AF2's layout and names (``np.savez(path, **arrays)`` writes a
    file :func:`load_alphafold_params` and AF2's own code read)."""
    out = {}
    for af2_key, (fold_key, layout) in af2_key_map(cfg).items():
        if "{i}" in fold_key:
            stack = fold_key.split("{i}")[0]
            n = len({k[len(stack):].split(".")[0] for k in state if k.startswith(stack)})
            blocks = [layout.to_af2(state[fold_key.format(i=i)].detach().cpu().numpy())
                      for i in range(n)]
            out[PREFIX + af2_key] = np.stack(blocks)
        else:
            out[PREFIX + af2_key] = layout.to_af2(state[fold_key].detach().cpu().numpy())
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def load_alphafold_params(
    path: str | os.PathLike,
) -> tuple[AlphaFold2Config, dict[str, torch.Tensor]]:
    """``(config, state dict)`` of an AF2 ``params_model_*.npz``: float32 tensors under fold's
    names, every parameter of the model filled and every array of the file used."""
    arrays = _read_npz(path)
    if not arrays or not all(k.startswith(PREFIX) and "//" in k for k in arrays):
        odd = next((k for k in arrays if not (k.startswith(PREFIX) and "//" in k)), None)
        raise ParamsError(path, "not an AlphaFold2 parameter file: expected keys "
                                f"'{PREFIX}<scope>//<name>', found {odd!r}"
                                if odd else "the archive is empty")
    try:
        cfg = alphafold_config(arrays)
    except (ValueError, TypeError) as e:
        raise ParamsError(path, f"the parameters do not describe an AF2 model: {e}") from e
    key_map = af2_key_map(cfg)
    expected = {PREFIX + k for k in key_map}
    missing, unexpected = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {missing[:3]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:3]}")
        raise ParamsError(path, "; ".join(parts) + " (not an AF2 monomer model_1..5[_ptm] file?)")
    shapes = _fold_shapes(cfg)
    state: dict[str, torch.Tensor] = {}
    for af2_key, (fold_key, layout) in key_map.items():
        array = arrays[PREFIX + af2_key]
        if "{i}" in fold_key:
            stack = fold_key.split("{i}")[0]  # e.g. "evoformer.blocks."
            n = len({k[len(stack):].split(".")[0] for k in shapes if k.startswith(stack)})
            want = (n, *layout.af2_shape(shapes[fold_key.format(i=0)]))
            blocks = [(fold_key.format(i=i), array[i]) for i in range(min(n, len(array)))]
        else:
            want = layout.af2_shape(shapes[fold_key])
            blocks = [(fold_key, array)]
        if tuple(array.shape) != want:
            raise ParamsError(path, f"{PREFIX + af2_key}: expected shape {want}, got "
                                    f"{tuple(array.shape)}")
        for key, a in blocks:
            state[key] = torch.from_numpy(np.ascontiguousarray(layout.to_fold(a),
                                                               dtype=np.float32))
    left = sorted(set(shapes) - set(state))
    if left:  # a fold parameter no AF2 array fills: a bug of the key map, not of the file
        raise ParamsError(path, f"{len(left)} fold parameter(s) without an AF2 array, e.g. "
                                f"{left[:3]}")
    return cfg, state
