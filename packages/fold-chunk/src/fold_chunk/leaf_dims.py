"""Chunk-dim flow through the ops of fold-ops' contract, traced as leaf nodes.

fold-model's op registry records each op of ``fold_ops.contract`` as one ``call_function`` node
whose target carries ``fold_op = "<op name>"`` (``fold_model.ops.leaves``): the graph calls the
op's dispatch, so the chunked code runs whichever backend serves the op (fold-kernels' Triton
kernels on a GPU). fold-chunk does not import fold-model or fold-ops; it knows each op by name
and its contract's shapes, stated here once as *layouts*: the named trailing dims of every
tensor parameter and of the output, after batch dims ``*`` that broadcast right-aligned.

For an output dim ``d`` to be chunked, :func:`leaf_input_dims` gives, per tensor input, the dim
that carries it (``None``: used whole), or :class:`~fold_chunk.dims.Illegal` when the op computes
across ``d`` (a softmax or LayerNorm over it, query and key rows taken from one projection,
channel groups split non-contiguously).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

__all__ = ["LEAF_OPS", "LeafOp", "fold_op", "leaf_input_dims"]


@dataclass(frozen=True)
class LeafOp:
    """An op's parameters in call order, the layout of each tensor parameter and of the output
    (one letter per named trailing dim), and the output letters that cannot be chunked, with
    the reason."""

    params: tuple[str, ...]
    layouts: dict[str, str]
    out: str
    illegal: dict[str, str]


_ATTN = "attention over the keys: "
_GROUPS = {"c": "the channels of a and b are four interleaved groups of the projection"}
LEAF_OPS: dict[str, LeafOp] = {
    # q, k, v, gate [*, R, H, N_q|N_k, D]; bias [*, H, N_q, N_k] shared by rows; mask [*, R, N_k]
    "attention": LeafOp(
        ("q", "k", "v", "bias", "mask", "scale", "gate"),
        {"q": "RHQD", "k": "RHKD", "v": "RHKD", "gate": "RHQD", "bias": "HQK", "mask": "RK"},
        "RHQD", {"D": _ATTN + "each output channel needs every channel of q and k"}),
    # proj [*, R, N, P*H*D] -> [*, R, N, H*D]; bias [*, H, N, N]; mask [*, R, N]
    "attention_packed": LeafOp(
        ("proj", "no_heads", "bias", "mask", "scale", "gate_bias", "gated"),
        {"proj": "RNP", "bias": "HNK", "mask": "RK", "gate_bias": "C"}, "RNC",
        {"N": _ATTN + "queries and keys come from the same rows of one projection",
         "C": "the heads and channels are packed with q, k, v and the gate"}),
    "linear": LeafOp(("x", "weight", "bias"), {"x": "C", "weight": "OC", "bias": "O"}, "O", {}),
    "layer_norm": LeafOp(("x", "weight", "bias", "eps"), {"x": "C", "weight": "C", "bias": "C"},
                         "C", {"C": "LayerNorm normalises over the channels"}),
    # -> (x, y_1, ..., y_branches), each [*, C]
    "layer_norm_fork": LeafOp(("x", "weight", "bias", "eps", "branches"),
                              {"x": "C", "weight": "C", "bias": "C"}, "C",
                              {"C": "LayerNorm normalises over the channels"}),
    # -> (x, y_1, ..., y_branches, bias [*, H, I, J]): outputs of two layouts, so no dim is
    # followed through it (fold-model calls it with autograd only; inference traces the fork
    # and linear_channel_first)
    "layer_norm_pair_bias": LeafOp(("x", "weight", "bias", "bias_weight", "eps", "branches"),
                                   {"x": "IJC", "weight": "C", "bias": "C", "bias_weight": "HC"},
                                   "IJC", {d: "its outputs are channel-last and heads-first"
                                           for d in "IJC"}),
    "layer_norm_linear": LeafOp(
        ("x", "ln_weight", "ln_bias", "weight", "bias", "eps"),
        {"x": "C", "ln_weight": "C", "ln_bias": "C", "weight": "OC", "bias": "O"}, "O", {}),
    # a [*, C], cond [*, 2C] = gate | shift, gate_bias [C] -> [*, C]
    "adaptive_layer_norm": LeafOp(("a", "cond", "gate_bias", "eps"),
                                  {"a": "C", "cond": "G", "gate_bias": "C"}, "C",
                                  {"C": "LayerNorm normalises over the channels"}),
    "softmax_mask_bias": LeafOp(("logits", "mask", "bias"),
                                {"logits": "L", "mask": "L", "bias": "L"}, "L",
                                {"L": "softmax over the last dim"}),
    "swiglu": LeafOp(("x", "weight", "bias"), {"x": "C", "weight": "OC", "bias": "O"}, "H",
                     {"H": "each output channel needs two rows of the weight, O/2 apart"}),
    "bias_sigmoid_gate": LeafOp(("x", "gate", "bias", "x_bias"),
                                {"x": "", "gate": "", "bias": "", "x_bias": ""}, "", {}),
    "bias_dropout_residual": LeafOp(
        ("x", "residual", "bias", "dropout_mask", "dropout_scale"),
        {"x": "", "residual": "", "bias": "", "dropout_mask": ""}, "", {}),
    # proj [*, 4c, I, J], bias [4c], mask [*, I, J] -> (a, b), each [*, c, I, J]
    "triangle_projection_gate": LeafOp(
        ("proj", "bias", "mask"), {"proj": "FIJ", "bias": "F", "mask": "IJ"}, "cIJ", _GROUPS),
    # z [*, I, J, C], weight [4c, C], bias [4c], mask [*, I, J] -> (a, b), each [*, c, I, J]
    "triangle_projection": LeafOp(
        ("z", "weight", "bias", "mask"), {"z": "IJC", "weight": "FC", "bias": "F", "mask": "IJ"},
        "cIJ", _GROUPS),
    # x [*, I, J, C], weight [O, C] -> [*, O, I, J]
    "linear_channel_first": LeafOp(("x", "weight"), {"x": "IJC", "weight": "OC"}, "OIJ", {}),
    # z [*, I, J, C], mask [*, I, J] -> (update, z), each [*, I, J, C]: the batch dims only
    # (fold-model calls it with autograd only; inference and AutoChunk trace the composed ops)
    "triangle_multiplication": LeafOp(
        ("z", "mask", "ln_in_weight", "ln_in_bias", "proj_weight", "proj_bias", "gate_weight",
         "gate_bias", "ln_out_weight", "ln_out_bias", "out_weight", "out_bias", "outgoing",
         "eps"),
        {"z": "IJC", "mask": "IJ", "ln_in_weight": "C", "ln_in_bias": "C", "proj_weight": "FC",
         "proj_bias": "F", "gate_weight": "OC", "gate_bias": "O", "ln_out_weight": "c",
         "ln_out_bias": "c", "out_weight": "Oc", "out_bias": "O"}, "IJC",
        {"I": "the sum over k reads every row of one operand",
         "J": "the sum over k reads every column of one operand",
         "C": "LayerNorm normalises over the channels"}),
}
LEAF_OPS["triangle_attention"] = LEAF_OPS["attention_packed"]  # the same contract
_NO_BATCH = {"weight", "ln_weight", "ln_bias", "gate_bias"}  # parameters: no batch dims
_NO_BATCH_BY_OP = {"linear": {"bias"}, "layer_norm": {"bias"}, "layer_norm_fork": {"bias"},
                   "layer_norm_pair_bias": {"bias", "bias_weight"},
                   "layer_norm_linear": {"bias"},
                   "swiglu": {"bias"}, "triangle_projection_gate": {"bias"},
                   "triangle_projection": {"bias"},
                   "triangle_multiplication": {"ln_in_weight", "ln_in_bias", "proj_weight",
                                               "proj_bias", "gate_weight", "gate_bias",
                                               "ln_out_weight", "ln_out_bias", "out_weight",
                                               "out_bias"}}


def fold_op(node: fx.Node) -> str | None:
    """The contract op a ``call_function`` node is a leaf of (its target's ``fold_op``)."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "fold_op", None)
    return name if isinstance(name, str) else None


def _bind(spec: LeafOp, node: fx.Node) -> dict[str, Any]:
    bound = dict(zip(spec.params, node.args))
    bound.update((k, v) for k, v in node.kwargs.items() if k in spec.params)
    return bound


def _shape(info: dict, n: Any) -> tuple[int, ...] | None:
    meta = info[n].meta if isinstance(n, fx.Node) and n in info else None
    return getattr(meta, "shape", None)


def leaf_input_dims(name: str, node: fx.Node, d: int, out: tuple[int, ...], info: dict,
                    ) -> dict[fx.Node, int | None] | str:
    """Per tensor input of leaf ``node`` (op ``name``) the dim carrying output dim ``d`` of
    ``out`` (an element's shape for a tuple output); a string: why ``d`` is not free."""
    spec = LEAF_OPS.get(name)
    if spec is None:
        return f"unknown fold op {name}"
    n_out = len(spec.out)
    n_lead = len(out) - n_out  # batch dims of the output
    if n_lead < 0:
        return f"{name}: output of rank {len(out)} below its layout {spec.out}"
    letter = spec.out[d - n_lead] if d >= n_lead else None
    if letter in spec.illegal:
        return f"{name}: {spec.illegal[letter]}"
    result: dict[fx.Node, int | None] = {}
    for param, value in _bind(spec, node).items():
        if not isinstance(value, fx.Node) or param not in spec.layouts:
            continue
        shape = _shape(info, value)
        if shape is None:
            return f"{name}: {param} is not a tensor"
        layout = spec.layouts[param]
        named = layout[len(layout) - min(len(layout), len(shape)):]  # trailing named dims
        lead = len(shape) - len(named)
        if letter is None:  # a batch dim: right-aligned broadcast of the batch dims
            no_batch = param in _NO_BATCH or param in _NO_BATCH_BY_OP.get(name, ())
            i = d - (n_lead - lead)
            dim = None if no_batch or i < 0 or (shape[i] == 1 and out[d] != 1) else i
        else:
            k = named.find(letter)
            dim = None if k < 0 else lead + k
            if dim is not None and shape[dim] == 1 and out[d] != 1:
                dim = None  # broadcast along it
        if value in result and result[value] != dim:
            return f"{name}: one tensor is two operands, along different dims"
        result[value] = dim
    return result
