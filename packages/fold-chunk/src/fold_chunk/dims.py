"""Chunk-dimension flow through one op (FastFold section 5.3, rules 2 and 3).

Given a node and a dimension ``d`` of its output along which the output is to be chunked,
:func:`input_dims` says which dimension of each tensor input carries that output dimension:

* an ``int``: the input must be sliced along it (the chunk dimension flows through the op),
* ``None``: the input does not carry ``d`` (broadcast, or a matmul operand whose dims are all
  contracted or kept); it is used whole in every chunk,

or returns an :class:`Illegal` when ``d`` is not a *free* dimension of the op (rule 3): the op
computes across it (softmax / LayerNorm / cumsum over ``d``, a reshape that merges ``d`` with
another dim, a non-trivial slice of ``d``, advanced indexing) or the op is unknown. Creation ops
without tensor inputs return :data:`FULL`: they are loop-invariant and are hoisted out of the
chunk loop, where the chunked consumer slices them.

The ops of fold-ops' contract (attention, LayerNorm, the fused transitions, ...) are leaf nodes
of fold-model's traced graphs; their rules are in :mod:`fold_chunk.leaf_dims`.

Contracted dimensions never appear in an op's output, so walking from the outputs back to the
inputs can only reach free dimensions and dims that some op mixes; the latter are refused.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from fold_chunk.leaf_dims import fold_op, leaf_input_dims
from fold_chunk.trace import NodeInfo, TensorMeta

__all__ = ["Illegal", "FULL", "input_dims", "op_name", "tensor_inputs"]


@dataclass(frozen=True)
class Illegal:
    """The requested output dim cannot be chunked through this op (the reason says why)."""

    reason: str


class _Full:
    def __repr__(self) -> str:
        return "FULL"


FULL = _Full()

_OPERATOR_NAMES = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floordiv", operator.pow: "pow", operator.mod: "mod",
    operator.neg: "neg", operator.pos: "pos", operator.abs: "abs", operator.eq: "eq",
    operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
    operator.and_: "logical_and", operator.or_: "logical_or", operator.xor: "logical_xor",
    operator.invert: "logical_not", operator.matmul: "matmul", operator.getitem: "getitem",
}

_ELEMENTWISE = {
    "add", "sub", "mul", "div", "true_divide", "floordiv", "floor_divide", "pow", "mod",
    "remainder", "fmod", "neg", "negative", "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_not", "where",
    "masked_fill", "sigmoid", "relu", "gelu", "silu", "tanh", "exp", "expm1", "log", "log1p",
    "log2", "sqrt", "rsqrt", "sin", "cos", "erf", "sign", "clamp", "clip", "clamp_min",
    "clamp_max", "maximum", "minimum", "fmax", "fmin", "square", "reciprocal", "to", "type",
    "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool", "contiguous",
    "clone", "detach", "dropout", "softplus", "leaky_relu", "elu", "nan_to_num", "relu6",
    "hardtanh", "mish", "logsigmoid", "rsub", "lerp", "addcmul", "addcdiv", "isnan", "isinf",
    "isfinite", "floor", "ceil", "round", "trunc", "frac", "atan2", "hypot", "copysign",
    "full_like", "zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "radd",
    "rmul", "rtruediv", "sigmoid_gate",
}
_CREATION = {"zeros", "ones", "full", "empty", "arange", "linspace", "eye", "tensor",
             "rand", "randn", "randint", "scalar_tensor", "as_tensor", "new_zeros", "new_ones",
             "new_full", "new_empty", "new_tensor"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "prod", "any", "all", "std", "var", "logsumexp",
               "norm", "nansum", "nanmean", "count_nonzero"}
_NORMALIZING = {"softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp", "normalize"}
_RESHAPES = {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"}
_EXPANDS = {"expand", "expand_as", "broadcast_to"}
_SPLITS = {"split", "chunk", "tensor_split", "unbind", "split_with_sizes"}
_MODULE_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Dropout, nn.Identity,
                       nn.Softplus, nn.LeakyReLU, nn.ELU)


def op_name(node: fx.Node, root: nn.Module | None = None) -> str:
    """A short name for the op of ``node`` (``"linear"``, ``"softmax"``, ``"module:Linear"``;
    ``"fold_op:attention"`` for a leaf of fold-ops' contract)."""
    leaf = fold_op(node)
    if leaf is not None:
        return "fold_op:" + leaf
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        if node.target in _OPERATOR_NAMES:
            return _OPERATOR_NAMES[node.target]  # type: ignore[index]
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_module" and root is not None:
        return "module:" + type(root.get_submodule(str(node.target))).__name__
    return node.op


def _meta(info: dict[fx.Node, NodeInfo], n: Any) -> Any:
    return info[n].meta if isinstance(n, fx.Node) else None


def tensor_inputs(node: fx.Node, info: dict[fx.Node, NodeInfo]) -> list[fx.Node]:
    """The nodes ``node`` reads (tensors, or tuples of tensors), without repeats."""
    return list(dict.fromkeys(n for n in node.all_input_nodes if n in info))


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _norm(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _bcast(out_shape: tuple[int, ...], d: int, shape: tuple[int, ...]) -> int | None:
    """The dim of a broadcast operand of ``shape`` that lines up with output dim ``d``."""
    i = d - (len(out_shape) - len(shape))
    if i < 0 or (shape[i] == 1 and out_shape[d] != 1):
        return None
    return i


def _elementwise(node: fx.Node, d: int, info: dict[fx.Node, NodeInfo],
                 out: tuple[int, ...]) -> dict[fx.Node, int | None]:
    result: dict[fx.Node, int | None] = {}
    for n in tensor_inputs(node, info):
        m = info[n].meta
        result[n] = _bcast(out, d, m.shape) if isinstance(m, TensorMeta) else None
    return result


def _mixing_dims(node: fx.Node, name: str, x: TensorMeta, root: nn.Module | None) -> set[int]:
    """Dims of ``x`` that a normalising op computes across."""
    if name in ("layer_norm", "rms_norm"):
        k = len(tuple(_arg(node, 1, "normalized_shape")))
        return set(range(x.ndim - k, x.ndim))
    if name == "module:LayerNorm" and root is not None:
        k = len(root.get_submodule(str(node.target)).normalized_shape)
        return set(range(x.ndim - k, x.ndim))
    if name == "module:Softmax" and root is not None:
        return {_norm(root.get_submodule(str(node.target)).dim, x.ndim)}
    if name == "normalize":
        return {_norm(_arg(node, 2, "dim", 1), x.ndim)}
    dim = _arg(node, 1, "dim")
    if dim is None:
        return set(range(x.ndim))
    return {_norm(dim, x.ndim)}


def _reduction(node: fx.Node, d: int, x: TensorMeta, out: tuple[int, ...],
               name: str) -> int | Illegal:
    dim = _arg(node, 1, "dim")
    keepdim = bool(_arg(node, 2, "keepdim", False))
    if name in ("std", "var"):  # std(x, dim, unbiased, keepdim) positional quirk
        keepdim = bool(node.kwargs.get("keepdim", _arg(node, 3, "keepdim", False)))
    if dim is None:
        return Illegal(f"{name} reduces over every dim")
    dims = {_norm(k, x.ndim) for k in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    if keepdim:
        return Illegal(f"{name} reduces over dim {d}") if d in dims else d
    kept = [i for i in range(x.ndim) if i not in dims]
    return kept[d]


def _reshape(in_shape: tuple[int, ...], out_shape: tuple[int, ...], d: int) -> int | Illegal:
    """The input dim that output dim ``d`` of a reshape is an intact copy of."""
    before = math.prod(out_shape[:d])
    for i, size in enumerate(in_shape):
        if size == out_shape[d] and math.prod(in_shape[:i]) == before:
            return i
    return Illegal(f"reshape {in_shape} -> {out_shape} merges or splits dim {d}")


def _matmul(a: TensorMeta, b: TensorMeta, out: tuple[int, ...], d: int,
            an: fx.Node, bn: fx.Node) -> dict[fx.Node, int | None] | Illegal:
    if a.ndim < 2 or b.ndim < 2:
        return Illegal("matmul with a 1-D operand")
    if d == len(out) - 1:
        return {an: None, bn: b.ndim - 1} if an is not bn else Illegal("x @ x")
    if d == len(out) - 2:
        return {an: a.ndim - 2, bn: None} if an is not bn else Illegal("x @ x")
    batch_out = out[:-2]
    ia, ib = _bcast(batch_out, d, a.shape[:-2]), _bcast(batch_out, d, b.shape[:-2])
    if an is bn:
        return {an: ia}
    return {an: ia, bn: ib}


def _einsum(node: fx.Node, d: int, info: dict[fx.Node, NodeInfo],
            out: tuple[int, ...]) -> dict[fx.Node, int | None] | Illegal:
    eq = node.args[0]
    operands = node.args[1:]
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if not isinstance(eq, str):
        return Illegal("einsum in sublist form")
    eq = eq.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if not rhs and "->" not in eq:
        counts: dict[str, int] = {}
        for c in lhs.replace(",", ""):
            counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(c for c, k in counts.items() if k == 1))
    if "..." in eq:
        ell = "".join(chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) not in eq)
        n_ell = max(info[op].meta.ndim - (len(t) - 3) for op, t in zip(operands, terms)
                    if "..." in t)
        terms = [t.replace("...", ell[max(0, n_ell - (info[op].meta.ndim - (len(t) - 3))):n_ell])
                 for op, t in zip(operands, terms)]
        rhs = rhs.replace("...", ell[:n_ell])
    letter = rhs[d]
    result: dict[fx.Node, int | None] = {}
    for op, term in zip(operands, terms):
        if not isinstance(op, fx.Node):
            continue
        if term.count(letter) > 1:
            return Illegal(f"einsum {eq}: {letter!r} repeats in one operand")
        pos = term.find(letter)
        dim = None if pos < 0 or info[op].meta.shape[pos] != out[d] else pos
        if op in result and result[op] != dim:
            return Illegal(f"einsum {eq}: one operand used twice with different dims")
        result[op] = dim
    return result


def _getitem(idx: Any, x: TensorMeta, d: int) -> int | Illegal:
    items = idx if isinstance(idx, tuple) else (idx,)
    if any(isinstance(i, (fx.Node, list, torch.Tensor)) for i in items):
        return Illegal("advanced (tensor) indexing")
    consumed = sum(1 for i in items if isinstance(i, (int, slice)))
    expanded: list[Any] = []
    for i in items:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - consumed))
        else:
            expanded.append(i)
    expanded.extend([slice(None)] * (x.ndim - sum(isinstance(i, (int, slice)) for i in expanded)))
    in_dim, out_dim = 0, 0
    for i in expanded:
        if i is None:
            if out_dim == d:
                return Illegal("indexing inserts this dim")
            out_dim += 1
        elif isinstance(i, int):
            in_dim += 1
        else:
            if out_dim == d:
                full = (i.start in (None, 0) and (i.stop is None or i.stop >= x.shape[in_dim])
                        and i.step in (None, 1))
                return in_dim if full else Illegal(f"slice {i} of the chunk dim")
            in_dim += 1
            out_dim += 1
    return Illegal("indexing: dim out of range")


def input_dims(node: fx.Node, d: int, info: dict[fx.Node, NodeInfo],
               root: nn.Module | None = None) -> dict[fx.Node, int | None] | Illegal | _Full:
    """Which dim of each input carries output dim ``d`` of ``node`` (see module doc).

    For a node returning a tuple (``split``/``chunk``/``unbind``), ``d`` is a dim of its
    elements."""
    name = op_name(node, root)
    meta = info[node].meta
    ins = tensor_inputs(node, info)
    if node.op not in ("call_function", "call_method", "call_module"):
        return Illegal(f"{node.op} node")
    if name in _CREATION or not ins:
        return FULL
    leaf = fold_op(node)
    if leaf is not None:
        elem = meta[0] if isinstance(meta, (tuple, list)) and meta else meta
        if not isinstance(elem, TensorMeta):
            return Illegal(f"{name} does not return a tensor")
        r = leaf_input_dims(leaf, node, d, elem.shape, info)
        return Illegal(r) if isinstance(r, str) else r
    if isinstance(meta, (tuple, list)):
        if name not in _SPLITS:
            return Illegal(f"{name} returns several tensors")
        x = info[node.args[0]].meta
        default = 0
        dim = _norm(_arg(node, 2, "dim", default) if name != "unbind"
                    else _arg(node, 1, "dim", 0), x.ndim)
        if name == "unbind":
            return {node.args[0]: d if d < dim else d + 1}
        return Illegal(f"{name} splits the chunk dim") if d == dim else {node.args[0]: d}
    if not isinstance(meta, TensorMeta):
        return Illegal(f"{name} does not return a tensor")
    out = meta.shape
    x_node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    x = info[x_node].meta if x_node is not None else None

    if name == "getitem":
        if isinstance(x, (tuple, list)):
            return {x_node: d}
        r = _getitem(node.args[1], x, d)
        return r if isinstance(r, Illegal) else {x_node: r}
    if name in ("max", "min") and len(node.args) > 1 and not isinstance(node.args[1], fx.Node):
        return Illegal(f"{name} with a dim returns several tensors")
    if name in _ELEMENTWISE or name in ("max", "min") or (
        node.op == "call_module" and isinstance(root.get_submodule(str(node.target)),
                                                _MODULE_ELEMENTWISE)
    ):
        return _elementwise(node, d, info, out)
    if name in _NORMALIZING or name in ("layer_norm", "rms_norm", "module:LayerNorm",
                                        "module:Softmax"):
        if d in _mixing_dims(node, name, x, root):
            return Illegal(f"{name} computes across dim {d}")
        return _elementwise(node, d, info, out)
    if name in _REDUCTIONS:
        r = _reduction(node, d, x, out, name)
        return r if isinstance(r, Illegal) else {x_node: r}
    if name in ("linear", "module:Linear"):
        if d < len(out) - 1:
            return {n: (d if n is x_node else None) for n in ins}
        if name == "module:Linear":
            return Illegal("chunking the output features of an nn.Linear")
        w, b = _arg(node, 1, "weight"), _arg(node, 2, "bias")
        return {n: (None if n is x_node else 0) for n in ins if n in (x_node, w, b)} \
            if x_node not in (w, b) else Illegal("linear of its own weight")
    if name in ("matmul", "bmm", "mm"):
        a, b = node.args[0], node.args[1]
        return _matmul(info[a].meta, info[b].meta, out, d, a, b)
    if name == "einsum":
        return _einsum(node, d, info, out)
    if name == "permute":
        dims = node.args[1:] if not isinstance(_arg(node, 1, "dims"), (tuple, list)) \
            else _arg(node, 1, "dims")
        return {x_node: _norm(dims[d], x.ndim)}
    if name in ("transpose", "swapaxes", "swapdims"):
        a, b = _norm(node.args[1], x.ndim), _norm(node.args[2], x.ndim)
        return {x_node: b if d == a else a if d == b else d}
    if name == "t":
        return {x_node: (x.ndim - 1 - d) if x.ndim == 2 else d}
    if name in ("movedim", "moveaxis"):
        src, dst = _arg(node, 1, "source"), _arg(node, 2, "destination")
        src = [src] if isinstance(src, int) else list(src)
        dst = [dst] if isinstance(dst, int) else list(dst)
        src = [_norm(s, x.ndim) for s in src]
        dst = [_norm(s, x.ndim) for s in dst]
        order = [-1] * x.ndim
        for s, t in zip(src, dst):
            order[t] = s
        rest = iter(i for i in range(x.ndim) if i not in src)
        order = [o if o >= 0 else next(rest) for o in order]
        return {x_node: order[d]}
    if name == "unsqueeze":
        k = _norm(_arg(node, 1, "dim"), len(out))
        return Illegal("unsqueezed dim") if d == k else {x_node: d if d < k else d - 1}
    if name in _RESHAPES or name == "squeeze":
        r = _reshape(x.shape, out, d)
        return r if isinstance(r, Illegal) else {x_node: r}
    if name in _EXPANDS:
        return {x_node: _bcast(out, d, x.shape)}
    if name in ("cat", "concat", "concatenate", "stack"):
        tensors = node.args[0]
        k = _norm(_arg(node, 1, "dim", 0), len(out))
        if d == k:
            return Illegal(f"{name} along the chunk dim")
        src = d if name != "stack" or d < k else d - 1
        return {n: src for n in tensors if isinstance(n, fx.Node)}
    return Illegal(f"unknown op {name}")

