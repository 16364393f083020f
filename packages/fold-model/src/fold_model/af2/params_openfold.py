"""OpenFold's AF2 checkpoints (``.pt``) as a fold state dict, and back.

OpenFold's monomer model has fold's tensors with PyTorch layouts already (its importer of AF2's
parameters undoes the same Haiku layouts as :mod:`fold_model.af2.params_af2`, including the
incoming triangle multiplication's swap, and its IPA has AF2's projections), so only the names
differ: ``pair_stack.`` inside the Evoformer blocks, ``msa_att_col._msa_att``, the template
embedder's sub-module names, ``evoformer.linear``, the structure module's transition and angle
ResNet layers. Files come as a plain state dict (OpenFold's released ``finetuning_*.pt``), a
PyTorch Lightning checkpoint (``state_dict`` with ``model.`` names, the averaged weights under
``ema.params``) or a DeepSpeed ``mp_rank_00_model_states.pt`` (``module``); the EMA weights are
used when present. Names of OpenFold before its multimer refactor (``core.``, top-level
``template_*``, ``template_angle_embedder``) are read too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from fold_model.af2.config import AlphaFold2Config, config
from fold_model.af2.params_af2 import ParamsError

__all__ = ["load_openfold_params", "openfold_state_dict", "fold_state_dict"]

# (OpenFold pattern, fold replacement), applied in order to each name.
_FROM_OPENFOLD = [
    # OpenFold before the multimer refactor (its convert_deprecated_v1_keys)
    (r"^template_(angle_embedder|pair_embedder|pair_stack|pointwise_att)\.",
     r"template_embedder.template_\1."),
    (r"template_angle_embedder\.", "template_single_embedder."),
    (r"\.core\.", "."),  # its blocks' pair stack, before being named pair_stack
    # the current names
    (r"^template_embedder\.template_pair_embedder\.linear\.", "template_embedder.linear_t."),
    (r"^template_embedder\.template_pair_stack\.", "template_embedder.pair_stack."),
    (r"^template_embedder\.template_pointwise_att\.", "template_embedder.pointwise_attention."),
    (r"^template_embedder\.template_single_embedder\.", "template_embedder.angle_embedder."),
    (r"\.pair_stack\.(tri_|pair_transition)", r".\1"),
    (r"\.msa_att_col\._msa_att\.", ".msa_att_col."),
    (r"\.(tri_att_start|tri_att_end)\.linear\.weight$", r".\1.linear_bias.weight"),
    (r"^evoformer\.linear\.", "evoformer.linear_s."),
    (r"\.ipa\.(linear_q_points|linear_kv_points)\.linear\.", r".ipa.\1."),
    (r"\.transition\.layers\.(\d+)\.linear_1\.", r".transition.layers.\1.0."),
    (r"\.transition\.layers\.(\d+)\.linear_2\.", r".transition.layers.\1.2."),
    (r"\.transition\.layers\.(\d+)\.linear_3\.", r".transition.layers.\1.4."),
    (r"\.angle_resnet\.layers\.(\d+)\.linear_1\.", r".angle_resnet.blocks.\1.1."),
    (r"\.angle_resnet\.layers\.(\d+)\.linear_2\.", r".angle_resnet.blocks.\1.3."),
]

# (fold pattern, OpenFold replacement): the current OpenFold names.
_TO_OPENFOLD = [
    (r"^template_embedder\.linear_t\.", "template_embedder.template_pair_embedder.linear."),
    (r"^template_embedder\.pair_stack\.", "template_embedder.template_pair_stack."),
    (r"^template_embedder\.pointwise_attention\.", "template_embedder.template_pointwise_att."),
    (r"^template_embedder\.angle_embedder\.", "template_embedder.template_single_embedder."),
    (r"^(evoformer|extra_msa_stack)\.blocks\.(\d+)\.(tri_|pair_transition)",
     r"\1.blocks.\2.pair_stack.\3"),
    (r"^evoformer\.blocks\.(\d+)\.msa_att_col\.", r"evoformer.blocks.\1.msa_att_col._msa_att."),
    (r"\.(tri_att_start|tri_att_end)\.linear_bias\.weight$", r".\1.linear.weight"),
    (r"^evoformer\.linear_s\.", "evoformer.linear."),
    (r"\.ipa\.(linear_q_points|linear_kv_points)\.", r".ipa.\1.linear."),
    (r"\.transition\.layers\.(\d+)\.0\.", r".transition.layers.\1.linear_1."),
    (r"\.transition\.layers\.(\d+)\.2\.", r".transition.layers.\1.linear_2."),
    (r"\.transition\.layers\.(\d+)\.4\.", r".transition.layers.\1.linear_3."),
    (r"\.angle_resnet\.blocks\.(\d+)\.1\.", r".angle_resnet.layers.\1.linear_1."),
    (r"\.angle_resnet\.blocks\.(\d+)\.3\.", r".angle_resnet.layers.\1.linear_2."),
]


def _rename(name: str, rules: list[tuple[str, str]]) -> str:
    for pattern, repl in rules:
        name = re.sub(pattern, repl, name)
    return name


def fold_state_dict(openfold: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An OpenFold AF2 state dict under fold's names."""
    return {_rename(k, _FROM_OPENFOLD): v for k, v in openfold.items()}


def openfold_state_dict(fold: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A fold AF2 state dict under OpenFold's (current) names."""
    return {_rename(k, _TO_OPENFOLD): v for k, v in fold.items()}


def _strip(state: Mapping[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict:
    out = {}
    for k, v in state.items():
        for p in prefixes:
            if k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def _unwrap(path: str | os.PathLike, obj, use_ema: bool) -> dict[str, torch.Tensor]:
    """The model's tensors out of a plain, Lightning or DeepSpeed checkpoint."""
    if not isinstance(obj, Mapping):
        raise ParamsError(path, f"not an OpenFold checkpoint: a {type(obj).__name__}, not a dict")
    ema = obj.get("ema")
    if use_ema and isinstance(ema, Mapping) and isinstance(ema.get("params"), Mapping):
        state = ema["params"]
    elif isinstance(obj.get("state_dict"), Mapping):  # Lightning
        state = {k: v for k, v in obj["state_dict"].items() if not k.startswith("ema.")}
    elif isinstance(obj.get("module"), Mapping):  # DeepSpeed
        state = obj["module"]
    else:
        state = obj
    state = _strip(state, ("_forward_module.", "module.", "model."))
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad or not state:
        raise ParamsError(path, "not an OpenFold checkpoint: expected a state dict of tensors "
                                f"(plain, Lightning or DeepSpeed), found {bad[:3] or 'nothing'}")
    return dict(state)


def _blocks(state: Mapping[str, torch.Tensor], stack: str) -> int:
    pattern = re.compile(re.escape(stack) + r"\.blocks\.(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def openfold_config(
    state: Mapping[str, torch.Tensor], preset: str = "af2_finetune"
) -> AlphaFold2Config:
    """``preset`` (OpenFold's AF2 sizes: ``af2_finetune``) with templates, the pTM head and the
    block counts of a fold-named OpenFold state dict."""
    templates = any(k.startswith("template_embedder.") for k in state)
    overrides = {
        "template__enabled": templates,
        "heads__tm_enabled": any(k.startswith("aux_heads.tm.") for k in state),
        "evoformer__no_blocks": _blocks(state, "evoformer"),
        "extra_msa__no_blocks": _blocks(state, "extra_msa_stack"),
    }
    if templates:
        overrides["template__no_blocks"] = _blocks(state, "template_embedder.pair_stack")
        overrides["template__embed_angles"] = any(
            k.startswith("template_embedder.angle_embedder.") for k in state)
    return config(preset, **overrides)


def load_openfold_params(
    path: str | os.PathLike, use_ema: bool = True, preset: str = "af2_finetune",
) -> tuple[AlphaFold2Config, dict[str, torch.Tensor]]:
    """``(config, state dict)`` of an OpenFold AF2 monomer checkpoint, checked against the sizes
    of fold's ``preset``. Missing, unexpected or misshapen tensors are a :class:`ParamsError`
    naming the file and the (OpenFold) key."""
    from fold_model.af2.model import AlphaFold2

    try:  # weights_only: a checkpoint must not run code when read
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the safe unpickler's refusals and non-torch files alike
        raise ParamsError(path, f"not a readable OpenFold checkpoint (torch.load with "
                                f"weights_only=True failed: {e}); a DeepSpeed ZeRO checkpoint "
                                "needs zero_to_fp32.py first") from e
    original = _unwrap(path, obj, use_ema)
    names = {_rename(k, _FROM_OPENFOLD): k for k in original}
    state = {k: original[v].float() for k, v in names.items()}
    try:
        cfg = openfold_config(state, preset)
    except (ValueError, TypeError) as e:
        raise ParamsError(path, f"the tensors do not describe an AF2 model: {e}") from e
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in AlphaFold2(cfg).state_dict().items()}
    missing = sorted(_rename(k, _TO_OPENFOLD) for k in set(shapes) - set(state))
    unexpected = sorted(names[k] for k in set(state) - set(shapes))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {missing[:3]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:3]}")
        raise ParamsError(path, "; ".join(parts) + " (not an OpenFold AF2 monomer checkpoint?)")
    for k, shape in shapes.items():
        if tuple(state[k].shape) != shape:
            raise ParamsError(path, f"{names[k]}: expected shape {shape}, got "
                                    f"{tuple(state[k].shape)}")
    return cfg, state
