"""Building blocks shared by every layer of both families: Linear with AF2 inits, LayerNorm, gated
attention, global attention (Alg. 19), the per-head bias from the pair, AF2's shared dropout and
its residual, and a row-chunking helper.

Every LayerNorm, attention and gate goes through :mod:`fold_model.ops`, so a kernel backend
replaces them without touching the modules.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from fold_ops.tracing import fx_tracing
from fold_ops.weight_casts import cast_stacked, cast_weight, concatenated
from torch import nn

from fold_model import ops
from fold_model.seams import IDENTITY_COMM, AxialComm

__all__ = [
    "Linear",
    "LayerNorm",
    "Attention",
    "GlobalAttention",
    "pair_bias",
    "shared_dropout_mask",
    "dropout_residual",
    "chunked_rows",
    "stack_as_made",
    "InitName",
]

InitName = Literal["default", "relu", "glorot", "gating", "final"]

# std of a unit normal truncated to [-2, 2]; dividing by it makes the truncated draw have the
# intended variance (AF2 supplement 1.11.4: "truncated normal ... fan-in").
_TRUNC_STD = 0.87962566103423978


def _trunc_normal_fan_in(weight: torch.Tensor, scale: float) -> None:
    fan_in = weight.shape[1]
    std = math.sqrt(scale / max(1, fan_in)) / _TRUNC_STD
    with torch.no_grad():
        nn.init.trunc_normal_(weight, mean=0.0, std=1.0, a=-2.0, b=2.0)
        weight.mul_(std)


_SKIP_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("fold_skip_init", default=False)


@contextlib.contextmanager
def skip_weight_init() -> Iterator[None]:
    """Build modules whose weights a strict ``load_state_dict`` fills next: :class:`Linear`
    leaves its parameters uninitialised (``torch.empty``) instead of drawing them twice
    (``nn.Linear``'s own init, then AF2's). Building the 368M-parameter AF3 model spends
    about 20 s of CPU in those draws."""
    token = _SKIP_INIT.set(True)
    try:
        yield
    finally:
        _SKIP_INIT.reset(token)


class Linear(nn.Linear):
    """``nn.Linear`` with the AF2 initialisers (supplement 1.11.4).

    ``'default'``: LeCun (truncated) normal; ``'relu'``: He normal; ``'glorot'``: Glorot uniform;
    ``'gating'``: weights 0, bias 1 (gates start open); ``'final'``: weights 0 (residual branches
    start as the identity). Biases are 0 except for ``'gating'``.
    """

    def __init__(
        self, in_dim: int, out_dim: int, bias: bool = True, init: InitName = "default"
    ) -> None:
        super().__init__(in_dim, out_dim, bias=bias)
        self.init = init
        self.reset_af2_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s init (then replaced by :meth:`reset_af2_parameters`; kept so seeded
        models draw the same weights as before), skipped under :func:`skip_weight_init`."""
        if not _SKIP_INIT.get():
            super().reset_parameters()

    def reset_af2_parameters(self) -> None:
        if _SKIP_INIT.get():
            return
        with torch.no_grad():
            if self.init == "default":
                _trunc_normal_fan_in(self.weight, 1.0)
            elif self.init == "relu":
                _trunc_normal_fan_in(self.weight, 2.0)
            elif self.init == "glorot":
                nn.init.xavier_uniform_(self.weight)
            elif self.init in ("gating", "final"):
                self.weight.zero_()
            else:
                raise ValueError(f"unknown init {self.init!r}")
            if self.bias is not None:
                self.bias.fill_(1.0 if self.init == "gating" else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:  # nothing for a backend to fuse: no dispatch on the host path
            return F.linear(x, cast_weight(self.weight))
        return ops.linear(x, self.weight, self.bias)


class LayerNorm(nn.Module):
    """LayerNorm over the last dim through ``ops.layer_norm`` (fp32 statistics for bf16)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def fork(self, x: torch.Tensor, branches: int = 1) -> tuple[torch.Tensor, ...]:
        """``(x, y_1, ..., y_branches)`` through ``ops.layer_norm_fork``: x passed on for the
        residual sum and one ``y = LN(x)`` per layer that reads it, so that in backward every
        gradient of x meets in LayerNorm's pass instead of autograd adding them in pairs."""
        return ops.layer_norm_fork(x, self.weight, self.bias, self.eps, branches)


def chunked_rows(
    fn: Callable[..., torch.Tensor],
    chunk_size: int | None,
    chunked: tuple[tuple[torch.Tensor | None, int], ...],
    shared: tuple = (),
    out_dim: int = -3,
) -> Any:
    """``fn(*chunked_tensors, *shared)`` evaluated in slices of ``chunk_size`` rows.

    ``chunked`` holds ``(tensor, row_dim)`` pairs: each tensor is sliced along its own row dim
    (None passes through); ``shared`` arguments are passed whole; the results (or each result
    of a tuple) are concatenated along ``out_dim``. ``chunk_size=None`` calls ``fn`` once (the
    traceable path: no loop over a tensor size). Only valid when rows are independent
    (inference-time memory saving).
    """
    tensors = tuple(t for t, _ in chunked)
    if chunk_size is None:
        return fn(*tensors, *shared)
    n = next(t.shape[d] for t, d in chunked if t is not None)
    outs, several = None, False  # written in place: no list of parts beside their concatenation
    for start in range(0, n, chunk_size):
        size = min(chunk_size, n - start)
        sliced = tuple(None if t is None else t.narrow(d, start, size) for t, d in chunked)
        part = fn(*sliced, *shared)
        several = isinstance(part, tuple)
        parts = part if several else (part,)
        if outs is None:
            outs = tuple(p.new_empty(_with_dim(p.shape, out_dim, n)) for p in parts)
        for out, p in zip(outs, parts, strict=True):
            out.narrow(out_dim, start, size).copy_(p)
        del part, parts
    return outs if several else outs[0]


def stack_as_made(makers: list[Callable[[], torch.Tensor]]) -> torch.Tensor:
    """``torch.stack([make() for make in makers])`` with each result written into the stack as
    it is made: ``len(makers) + 1`` results live at most, not twice ``len(makers)``."""
    first = makers[0]()
    out = first.new_empty((len(makers), *first.shape))
    out[0] = first
    del first
    for i, make in enumerate(makers[1:], 1):
        out[i] = make()
    return out


def _with_dim(shape: torch.Size, dim: int, n: int) -> list[int]:
    out = list(shape)
    out[dim] = n
    return out


class Attention(nn.Module):
    """Gated multi-head attention (AF2 Alg. 7/8/13/14 core) calling ``ops.attention``, or
    ``ops.attention_packed`` for self-attention (``q_x is kv_x``).

    Inputs ``q_x: [*, R, N_q, C_q]``, ``kv_x: [*, R, N_k, C_kv]``; ``bias: [*, H, N_q, N_k]``
    shared by the R rows; ``mask: [*, R, N_k]``. Output ``[*, R, N_q, C_q]``. With
    ``chunk_size`` the R rows are processed in slices (inference memory saving). ``packed_op``
    is the registry op of the self-attention path (signature of ``ops.attention_packed``):
    triangle attention passes ``ops.triangle_attention``. ``q_bias``: the query projection has a
    bias (AF3's attention with pair bias, Alg. 24 line 6, and AF3's code; AF2's has none).
    ``out_bias=False`` (forward): the output projection without its bias, for a caller that
    adds ``linear_o.bias`` in its residual op (:func:`dropout_residual`).
    """

    def __init__(
        self,
        c_q: int,
        c_kv: int,
        c_hidden: int,
        no_heads: int,
        gating: bool = True,
        packed_op: Callable[..., torch.Tensor] = ops.attention_packed,
        q_bias: bool = False,
    ) -> None:
        super().__init__()
        self.packed_op = packed_op
        self.c_hidden = c_hidden
        self.no_heads = no_heads
        hd = c_hidden * no_heads
        self.linear_q = Linear(c_q, hd, bias=q_bias, init="glorot")
        self.linear_k = Linear(c_kv, hd, bias=False, init="glorot")
        self.linear_v = Linear(c_kv, hd, bias=False, init="glorot")
        self.linear_g = Linear(c_q, hd, init="gating") if gating else None
        self.linear_o = Linear(hd, c_q, init="final")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [*, R, N, H * D] -> [*, R, N, H, D] -> [*, R, H, N, D]
        x = x.unflatten(-1, (self.no_heads, self.c_hidden))
        return x.transpose(-2, -3)

    def _attend(
        self,
        q_x: torch.Tensor,
        kv_x: torch.Tensor,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
        out_bias: bool = True,
    ) -> torch.Tensor:
        return self.attend_projected(q_x, self.linear_k(kv_x), self.linear_v(kv_x), mask, bias,
                                     out_bias)

    def attend_projected(
        self,
        q_x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
        out_bias: bool = True,
    ) -> torch.Tensor:
        """Attention of ``q_x [*, R, N_q, C_q]`` to keys and values projected beforehand,
        ``k, v [*, R, N_k, H * D]`` (``linear_k``, ``linear_v`` of the keys; any strides: the atom
        transformer passes overlapping windows of a per-atom projection)."""
        q = self._heads(self.linear_q(q_x))  # [*, R, H, N_q, D]
        g = self._heads(self.linear_g(q_x)) if self.linear_g is not None else None
        o = ops.attention(q, self._heads(k), self._heads(v), bias, mask, self.c_hidden**-0.5,
                          g)  # [*, R, H, N_q, D]
        o = o.transpose(-2, -3).flatten(-2)  # [*, R, N_q, H * D]
        return self._project_out(o, out_bias)

    def _project_out(self, o: torch.Tensor, out_bias: bool) -> torch.Tensor:
        """``linear_o(o)``, or without its bias (``out_bias=False``)."""
        return self.linear_o(o) if out_bias else F.linear(o, cast_weight(self.linear_o.weight))

    def _packed_weight(self) -> torch.Tensor:
        """The q, k, v (and gate) weights stacked: ``[P * H * D, C]``, P = 4 when gated (made
        once per prediction in the autocast dtype: :mod:`fold_ops.weight_casts`)."""
        layers = [self.linear_q, self.linear_k, self.linear_v]
        if self.linear_g is not None:
            layers.append(self.linear_g)
        return cast_stacked([lin.weight for lin in layers], "cat", concatenated)

    def _packed_bias(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The query bias padded with zeros to ``[P * H * D]`` (k, v have none; the gate's bias
        goes to the attention op separately), or None without a query bias."""
        if self.linear_q.bias is None:
            return None
        n = weight.shape[0]
        return cast_stacked((self.linear_q.bias,), f"zero-padded to {n}",
                            lambda b: torch.cat([b, b.new_zeros(n - b.shape[0])]))

    def _self_attend(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
        weight: torch.Tensor,
        proj_bias: torch.Tensor | None = None,
        out_bias: bool = True,
    ) -> torch.Tensor:
        """Self-attention: q, k, v and the gate from one GEMM of the stacked ``weight``, handed
        to ``ops.attention_packed`` whole (a kernel backend reads the four parts in place and
        writes their gradients into one tensor: one GEMM each way instead of four, and no sum of
        four input gradients)."""
        gated = self.linear_g is not None
        proj = F.linear(x, weight, proj_bias)  # [*, R, N, P * H * D]
        gate_bias = self.linear_g.bias if gated else None
        o = self.packed_op(
            proj, self.no_heads, bias, mask, self.c_hidden**-0.5, gate_bias, gated
        )  # [*, R, N, H * D]
        return self._project_out(o, out_bias)

    def forward(
        self,
        q_x: torch.Tensor,
        kv_x: torch.Tensor,
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        chunk_size: int | None = None,
        out_bias: bool = True,
    ) -> torch.Tensor:
        if q_x is kv_x:
            # weights stacked once, not once per chunk
            weight = self._packed_weight()
            shared = (bias, weight, self._packed_bias(weight), out_bias)
            return chunked_rows(
                self._self_attend, chunk_size, ((q_x, -3), (mask, -2)), shared, out_dim=-3
            )
        return chunked_rows(
            self._attend, chunk_size, ((q_x, -3), (kv_x, -3), (mask, -2)), (bias, out_bias),
            out_dim=-3,
        )


class GlobalAttention(nn.Module):
    """Global gated attention (AF2 Alg. 19): one averaged query per row and a single shared
    key/value head.

    ``x: [*, R, N, C]`` with ``mask: [*, R, N]``; attention runs over N inside each row.
    Output ``[*, R, N, C]``.
    """

    def __init__(self, c_in: int, c_hidden: int, no_heads: int, eps: float = 1e-10) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.no_heads = no_heads
        self.eps = eps
        hd = c_hidden * no_heads
        self.linear_q = Linear(c_in, hd, bias=False, init="glorot")
        self.linear_k = Linear(c_in, c_hidden, bias=False, init="glorot")
        self.linear_v = Linear(c_in, c_hidden, bias=False, init="glorot")
        self.linear_g = Linear(c_in, hd, init="gating")
        self.linear_o = Linear(hd, c_in, init="final")

    def _attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(x.dtype)
        # Masked mean over the row's N entries (Alg. 19 line 2): [*, R, C]
        q_avg = (x * mask[..., None]).sum(-2) / (mask.sum(-1)[..., None] + self.eps)
        q = self.linear_q(q_avg).unflatten(-1, (self.no_heads, 1, self.c_hidden))  # [*,R,H,1,D]
        k = self.linear_k(x).unsqueeze(-3)  # [*, R, 1, N, D], shared by the H heads
        v = self.linear_v(x).unsqueeze(-3)  # [*, R, 1, N, D]
        heads_shape = q.shape[:-2] + k.shape[-2:]  # (*, R, H, N, D); no unpacking: fx-safe
        k = k.expand(heads_shape)  # [*, R, H, N, D], a view
        v = v.expand(heads_shape)
        o = ops.attention(q, k, v, None, mask, self.c_hidden**-0.5, None)  # [*, R, H, 1, D]
        o = o.squeeze(-2).flatten(-2).unsqueeze(-2)  # [*, R, 1, H * D], broadcast over N
        g = self.linear_g(x)  # [*, R, N, H * D]
        o = ops.bias_sigmoid_gate(o.expand_as(g), g)  # [*, R, N, H * D]
        return self.linear_o(o)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        return chunked_rows(self._attend, chunk_size, ((x, -3), (mask, -2)), out_dim=-3)


def pair_bias(
    z_ln: torch.Tensor, linear: Linear, comm: AxialComm = IDENTITY_COMM
) -> torch.Tensor:
    """Per-head bias from the (normalized) row-split pair: ``[*, N_i/P, N_j, C_z]`` ->
    ``[*, H, N_i, N_j]`` (gathered: the bias of every query row needs all of i).

    The GEMM writes the heads-first layout (``W z^T``, :func:`ops.linear_channel_first`): each
    head's ``N_i x N_j`` bias is dense, so the attention kernels read a bias tile row with vector
    loads. The heads-last projection ``[*, N_i, N_j, H]`` seen through ``movedim`` would hand them
    H-strided 2-byte gathers for the same values. ``linear`` has no bias (``bias=False`` in every
    caller)."""
    _check_no_bias(linear)
    bias = ops.linear_channel_first(z_ln, linear.weight)  # [*, H, N_i/P, N_j]
    return comm.gather(bias, -2)  # [*, H, N_i, N_j]


def _check_no_bias(linear: Linear) -> None:
    if linear.bias is not None:
        raise ValueError("pair_bias: the projection must have no bias (AF2/AF3 pair biases have "
                         "none)")


def fork_pair_bias(
    layer_norm: LayerNorm, z: torch.Tensor, linear: Linear, comm: AxialComm = IDENTITY_COMM,
    branches: int = 1,
) -> tuple[torch.Tensor, ...]:
    """``(z, y_1, ..., y_branches, bias)``: ``layer_norm.fork(z, branches + 1)`` with its last
    reader the per-head :func:`pair_bias` ``[*, H, N_i, N_j]`` (gathered under DAP). With
    autograd one op, ``ops.layer_norm_pair_bias``: a backend adds the bias's gradient times the
    projection into LayerNorm's backward pass, so the projection's ``d(y) [*, C]`` is neither
    written by a GEMM nor read back (a pair-sized write and read per bias). Inference and
    tracing (AutoChunk follows the fork and the projection) take the two ops."""
    _check_no_bias(linear)
    if torch.is_grad_enabled() and not fx_tracing():
        *out, bias = ops.layer_norm_pair_bias(z, layer_norm.weight, layer_norm.bias,
                                              linear.weight, layer_norm.eps, branches)
        return (*out, comm.gather(bias, -2))
    out = layer_norm.fork(z, branches + 1)  # indexed: an fx Proxy cannot be star-unpacked
    return (*(out[i] for i in range(branches + 1)), pair_bias(out[branches + 1], linear, comm))


def shared_dropout_mask(
    x: torch.Tensor, rate: float, shared_dim: int, training: bool
) -> torch.Tensor | None:
    """AF2's shared dropout (supplement 1.11.6): one Bernoulli mask broadcast along ``shared_dim``.

    ``DropoutRowwise`` shares the mask over rows (``shared_dim=-3`` of ``[*, N_rows, N_cols, C]``),
    ``DropoutColumnwise`` over columns (``shared_dim=-2``). Returns the mask pre-scaled by
    ``1 / (1 - rate)`` for ``ops.bias_dropout_residual``, or None when not training.
    """
    if not training or rate == 0.0:
        return None
    keep = 1.0 - rate
    return _shared_draws(x, keep, shared_dim, x.dtype).div_(keep)  # scaled in place


def _shared_draws(x: torch.Tensor, keep: float, shared_dim: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """0/1 Bernoulli(``keep``) draws in ``dtype``, x's shape with size 1 along ``shared_dim``."""
    return x.new_empty(x.narrow(shared_dim, 0, 1).shape, dtype=dtype).bernoulli_(keep)


def in_place_residuals(chunk_size: int | None, training: bool) -> bool:
    """Whether residual updates may be added in place (``x += update``): inference of a long
    input (a chunk size set: ``--chunk-size``, DAP), no autograd, not traced. Each ``x + update``
    otherwise makes a new pair next to the old one, which the callers' frames keep alive: up to
    four fp32 ``[N, N, C_z]`` copies in an Evoformer block. No other reader of a stack's
    activations exists at inference, so updating them in place gives the same numbers."""
    return (chunk_size is not None and not training and not torch.is_grad_enabled()
            and not fx_tracing()
            and not torch.compiler.is_compiling())


def add_residual(x: torch.Tensor, update: torch.Tensor, in_place: bool) -> torch.Tensor:
    """``x + update``, in ``x``'s storage when ``in_place`` (:func:`in_place_residuals`) and
    ``x`` can hold the sum (its dtype, a dense tensor of the full shape)."""
    if (in_place and x.is_contiguous() and update.shape == x.shape
            and torch.promote_types(x.dtype, update.dtype) == x.dtype):
        return x.add_(update)
    return x + update


def dropout_residual(
    update: torch.Tensor, x: torch.Tensor, rate: float, shared_dim: int, training: bool,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x + dropout(update + bias)`` with AF2's shared dropout along ``shared_dim`` (one fused
    ``ops.bias_dropout_residual``). The mask is drawn as 0/1 bytes and scaled by the op, in
    x's dtype as :func:`shared_dropout_mask`'s pre-scaled mask is: one launch for the mask,
    not two. ``bias [C]``: the sub-layer's output bias, left out of its last GEMM."""
    if not training or rate == 0.0:
        return ops.bias_dropout_residual(update, x, bias, None)
    keep = 1.0 - rate
    mask = _shared_draws(update, keep, shared_dim, torch.uint8)
    return ops.bias_dropout_residual(update, x, bias, mask, 1.0 / keep)
