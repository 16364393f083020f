"""AF3's conditioned layers: adaptive LayerNorm (Alg. 26), attention with pair bias (Alg. 24; the
single representation's and the diffusion transformer's, conditioned on ``s`` there) and the
conditioned transition block (Alg. 25).

Attention runs through :class:`fold_model.layers.Attention` (``ops.attention``: the registry's
attention with a bias shared by rows, served by fold-kernels' EvoAttention); the conditioned
transition through ``ops.layer_norm`` and ``ops.swiglu`` (MegaFold's DeepFusion ops). The SwiGLU
transition itself is :class:`fold_model.layers.SwiGLUTransition`.
"""

from __future__ import annotations

import torch
from torch import nn

from fold_model import ops
from fold_model.layers import (
    Attention,
    LayerNorm,
    Linear,
    chunked_rows,
    fork_pair_bias,
    pair_bias,
)
from fold_model.seams import IDENTITY_COMM, AxialComm
from fold_model.upgrades import stack_gate_shift

__all__ = ["AdaLN", "AttentionPairBias", "ConditionedTransitionBlock"]


class AdaLN(nn.Module):
    """Alg. 26: ``sigmoid(Linear(LN(s))) * LN(a) + LinearNoBias(LN(s))``; the LayerNorm of ``a`` has
    no affine parameters, that of ``s`` a gain only. ``a: [*, N, C_a]``, ``s: [*, N, C_s]``.

    The two projections of ``LN(s)`` are one GEMM of their stacked weights,
    ``linear_gate_shift.weight [2 C_a, C_s]`` (rows: the gate's ``Linear``, then the shift's
    ``LinearNoBias``), and the gate's bias ``gate_bias [C_a]`` is added inside
    ``ops.adaptive_layer_norm``: one GEMM each way instead of two, and no sum of two gradients
    of ``LN(s)``. State dicts with the two layers (``linear_gate.weight``, ``linear_gate.bias``,
    ``linear_shift.weight``) load into the stacked form.
    """

    def __init__(self, c_a: int, c_s: int) -> None:
        super().__init__()
        self.s_weight = nn.Parameter(torch.ones(c_s))
        self.linear_gate_shift = Linear(c_s, 2 * c_a, bias=False)
        self.gate_bias = nn.Parameter(torch.zeros(c_a))
        self.register_load_state_dict_pre_hook(_stack_gate_shift)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = ops.layer_norm(s, self.s_weight, None)
        # one op (fold-kernels: one pass over a each way instead of LayerNorm, bias, sigmoid,
        # product and sum in turn)
        return ops.adaptive_layer_norm(a, self.linear_gate_shift(s), self.gate_bias)


def _stack_gate_shift(module, state_dict, prefix, *_) -> None:
    """Load-time conversion of an AdaLN saved with separate gate and shift layers."""
    stack_gate_shift(state_dict, prefix)


class AttentionPairBias(nn.Module):
    """Alg. 24: gated multi-head attention over tokens with a bias from the pair representation.

    ``a: [*, R, N, C_a]`` (R rows share the bias: 1 for the Pairformer's single representation,
    the diffusion samples in the diffusion transformer), ``bias: [*, H, N_q, N_k]`` (from
    :meth:`bias_from_pair` or a window's pair bias), ``mask: [*, R, N_k]``; with ``c_s`` the input
    is normalised by :class:`AdaLN` on ``s: [*, R, N, C_s]`` and the output gated by
    ``sigmoid(Linear(s))`` with bias -2 (adaptive zero init). :meth:`attend` takes separately
    normalised queries and keys (the atom transformer's query and key windows).

    ``key_norm`` (the atom transformer's cross-attention between query and key windows): the keys
    get an AdaLN of their own (AF3's code, ``cross_attention``: ``x_k = adaptive_layernorm(x_k,
    single_cond_k)``), applied to the raw activations (``"input"``, AF3) or to the queries'
    AdaLN output (``"query"``, Protenix 2.0's ``layernorm_kv(layernorm_a(a, s), s)``); None: the
    keys are the normalised queries (self-attention).
    """

    def __init__(self, c_a: int, c_z: int | None, no_heads: int, c_s: int | None = None,
                 key_norm: str | None = None) -> None:
        super().__init__()
        if key_norm not in (None, "input", "query") or (key_norm is not None and c_s is None):
            raise ValueError(f"key_norm must be None, 'input' or 'query' (with c_s), got "
                             f"{key_norm!r}")
        self.ada_ln = AdaLN(c_a, c_s) if c_s is not None else None
        self.key_norm = key_norm
        self.ada_ln_kv = AdaLN(c_a, c_s) if key_norm is not None else None
        self.layer_norm_a = LayerNorm(c_a) if c_s is None else None
        if c_z is not None:
            self.layer_norm_z = LayerNorm(c_z)
            self.linear_z = Linear(c_z, no_heads, bias=False)
        self.mha = Attention(c_a, c_a, c_a // no_heads, no_heads, gating=True, q_bias=True)
        if c_s is not None:
            self.linear_s_gate = Linear(c_s, c_a)
            with torch.no_grad():
                self.linear_s_gate.bias.fill_(-2.0)

    def bias_from_pair(self, z: torch.Tensor, comm: AxialComm = IDENTITY_COMM,
                       chunk_size: int | None = None) -> torch.Tensor:
        """``z: [*, N_i/P, N_j, C_z]`` -> ``[*, H, N_i, N_j]``. With ``chunk_size`` the
        LayerNorm and projection run on ``chunk_size`` rows i at a time: the normalised pair
        ``[*, N_i, N_j, C_z]`` (C_z / H times the bias) is never whole (inference)."""
        if chunk_size is None:
            return pair_bias(self.layer_norm_z(z), self.linear_z, comm)

        def project(z_rows: torch.Tensor) -> torch.Tensor:
            return self.linear_z(self.layer_norm_z(z_rows))  # [*, chunk, N_j, H]

        bias = chunked_rows(project, chunk_size, ((z, -3),), out_dim=-3)  # [*, N_i/P, N_j, H]
        return comm.gather(bias, -3).movedim(-1, -3)  # [*, H, N_i, N_j]

    def bias_from_pair_residual(self, z: torch.Tensor, comm: AxialComm = IDENTITY_COMM,
                                chunk_size: int | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(bias, z)``: :meth:`bias_from_pair` and z passed on, its LayerNorm forked
        (``LayerNorm.fork``: the gradient of the z read after this joins LayerNorm's backward
        pass). With ``chunk_size`` (inference) z is returned as it came."""
        if chunk_size is not None:
            return self.bias_from_pair(z, comm, chunk_size), z
        z, bias = fork_pair_bias(self.layer_norm_z, z, self.linear_z, comm, 0)
        return bias, z

    def normalize(self, a: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
        if self.ada_ln is not None:
            return self.ada_ln(a, s)
        return self.layer_norm_a(a)

    def normalize_keys(self, a: torch.Tensor, a_norm: torch.Tensor, s: torch.Tensor | None
                       ) -> torch.Tensor:
        """The keys' normalisation of ``a`` (``a_norm``: :meth:`normalize` of it): see
        ``key_norm`` in the class docstring."""
        if self.ada_ln_kv is None:
            return a_norm
        return self.ada_ln_kv(a if self.key_norm == "input" else a_norm, s)

    def forward(
        self,
        a: torch.Tensor,
        bias: torch.Tensor | None,
        mask: torch.Tensor | None,
        s: torch.Tensor | None = None,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        """Self-attention of ``a [*, R, N, C_a]`` -> update ``[*, R, N, C_a]``."""
        x = self.normalize(a, s)
        return self.attend(x, x, mask, bias, s, chunk_size)

    def forward_residual(
        self,
        a: torch.Tensor,
        bias: torch.Tensor | None,
        mask: torch.Tensor | None,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, a)`` of the unconditioned attention (a LayerNorm, no ``s``): the update
        and ``a`` passed on for the residual sum, its LayerNorm forked (``LayerNorm.fork``)."""
        if self.layer_norm_a is None:
            raise ValueError("forward_residual: the conditioned attention (AdaLN) has no plain "
                             "LayerNorm to fork")
        a, x = self.layer_norm_a.fork(a)
        return self.attend(x, x, mask, bias, None, chunk_size), a

    def attend(
        self,
        q_x: torch.Tensor,
        kv_x: torch.Tensor,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
        s_q: torch.Tensor | None = None,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        """Attention of normalised queries ``[*, R, N_q, C_a]`` to normalised keys/values
        ``[*, R, N_k, C_a]``; ``s_q: [*, R, N_q, C_s]`` gates the output when conditioned."""
        return self._gated(self.mha(q_x, kv_x, mask, bias, chunk_size), s_q)  # [*, R, N_q, C_a]

    def attend_projected(self, q_x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor | None, bias: torch.Tensor | None,
                         s_q: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`attend` with the keys and values projected beforehand (``k, v [*, R, N_k,
        C_a]``: :meth:`Attention.attend_projected`)."""
        return self._gated(self.mha.attend_projected(q_x, k, v, mask, bias), s_q)

    def _gated(self, out: torch.Tensor, s_q: torch.Tensor | None) -> torch.Tensor:
        if self.ada_ln is not None:  # out * sigmoid(Linear(s)): one fused op each way
            out = ops.bias_sigmoid_gate(out, self.linear_s_gate(s_q))
        return out


class ConditionedTransitionBlock(nn.Module):
    """Alg. 25: SwiGLU transition on ``AdaLN(a, s)``, output gated by ``sigmoid(Linear(s))`` (bias
    -2). ``a: [*, N, C_a]``, ``s: [*, N, C_s]`` -> ``[*, N, C_a]``."""

    def __init__(self, c_a: int, c_s: int, n: int = 2) -> None:
        super().__init__()
        self.ada_ln = AdaLN(c_a, c_s)
        self.linear_ab = Linear(c_a, 2 * n * c_a, bias=False, init="relu")
        self.linear_out = Linear(n * c_a, c_a, bias=False)
        self.linear_s_gate = Linear(c_s, c_a)
        with torch.no_grad():
            self.linear_s_gate.bias.fill_(-2.0)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        a = self.ada_ln(a, s)
        b = ops.swiglu(a, self.linear_ab.weight)  # [*, N, n C_a]
        return ops.bias_sigmoid_gate(self.linear_out(b), self.linear_s_gate(s))
