"""Transitions: the position-wise two-layer MLPs after each attention, AF2's ReLU transition
(supplement Alg. 9 / 15) and AF3's SwiGLU transition (AF3 supplement Alg. 11)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from fold_ops.weight_casts import cast_weight
from torch import nn

from fold_model import ops
from fold_model.layers.primitives import LayerNorm, Linear, add_residual, chunked_rows
from fold_model.layers.residual_gemm import add_matmul_, residual_gemm

__all__ = ["Transition", "MSATransition", "PairTransition", "SwiGLUTransition"]


def call(fn: Callable[..., Any], *args) -> Any:
    """``fn(*args)``: the stacks' sub-layer runner when nothing wraps the call."""
    return fn(*args)


class Transition(nn.Module):
    """Alg. 9 / 15: ``Linear(relu(Linear(LayerNorm(x))))`` with an ``n``-fold hidden width.
    ``x: [*, C] -> [*, C]``; LayerNorm + first Linear go through ``ops.layer_norm_linear``."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c)
        self.linear_1 = Linear(c, n * c, init="relu")
        self.linear_2 = Linear(n * c, c, init="final")

    def _transition(self, x: torch.Tensor) -> torch.Tensor:
        h = ops.layer_norm_linear(
            x, self.layer_norm.weight, self.layer_norm.bias, cast_weight(self.linear_1.weight),
            cast_weight(self.linear_1.bias), self.layer_norm.eps,
        )
        return self.linear_2(torch.relu(h))

    def forward(self, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        return chunked_rows(self._transition, chunk_size, ((x, -3),), out_dim=-3)

    def forward_residual(
        self, x: torch.Tensor, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, x)``, the pair stack's sub-layer interface. Nothing is forked: the
        LayerNorm is fused with the first linear (``ops.layer_norm_linear``), so autograd still
        adds the residual's gradient of x."""
        return self(x, chunk_size), x

    def residual(self, x: torch.Tensor, chunk_size: int | None = None, *,
                 run: Callable[..., Any] = call, in_place: bool = False) -> torch.Tensor:
        """``x + transition(x)``, the stacks' residual sum (in x's storage with ``in_place``),
        the sub-layer called through ``run`` (a checkpointing wrapper)."""
        update, x = run(self.forward_residual, x, chunk_size)
        return add_residual(x, update, in_place)


class MSATransition(Transition):
    """Alg. 9 (n = 4)."""


class PairTransition(Transition):
    """Alg. 15 (n = 4 in the Evoformer, 2 in the template pair stack)."""


class SwiGLUTransition(nn.Module):
    """Alg. 11: ``LinearNoBias(silu(a) * b)`` with ``a, b = LinearNoBias(LayerNorm(x))``, hidden
    width ``n * c``. ``x: [*, C] -> [*, C]``; with ``chunk_size`` rows of ``row_dim`` in slices."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c)
        self.linear_ab = Linear(c, 2 * n * c, bias=False, init="relu")  # [a | b] stacked
        self.linear_out = Linear(n * c, c, bias=False, init="final")

    def _transition(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x)
        return self.linear_out(ops.swiglu(x, self.linear_ab.weight))  # [*, n C] -> [*, C]

    def forward(
        self, x: torch.Tensor, chunk_size: int | None = None, row_dim: int = -3
    ) -> torch.Tensor:
        return chunked_rows(self._transition, chunk_size, ((x, row_dim),), out_dim=row_dim)

    def forward_residual(
        self, x: torch.Tensor, chunk_size: int | None = None, row_dim: int = -3
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(update, x)``: the update and x passed on for the residual sum, x's LayerNorm
        forked (``LayerNorm.fork``) so that the residual's gradient joins its backward pass.
        With ``chunk_size`` (inference: nothing to join) the rows are sliced as in forward."""
        if chunk_size is not None:
            return self(x, chunk_size, row_dim), x
        x, x_ln = self.layer_norm.fork(x)
        return self.linear_out(ops.swiglu(x_ln, self.linear_ab.weight)), x

    def residual(self, x: torch.Tensor, chunk_size: int | None = None, row_dim: int = -3, *,
                 run: Callable[..., Any] = call, in_place: bool = False) -> torch.Tensor:
        """``x + transition(x)``, the stacks' residual sum: in inference (no chunk size,
        :func:`~fold_model.layers.residual_gemm.residual_gemm`) written into x by the output
        GEMM (:meth:`add_into`: the stacks call this on a stream their own block made), else
        :meth:`forward_residual`'s update added (in x's storage with ``in_place``), the
        sub-layer called through ``run`` (a checkpointing wrapper)."""
        if chunk_size is None and residual_gemm(x, self.training):
            return self.add_into(x)
        update, x = run(self.forward_residual, x, chunk_size, row_dim)
        return add_residual(x, update, in_place)

    def add_into(self, x: torch.Tensor) -> torch.Tensor:
        """Inference: ``x + transition(x)`` written into x's storage by the output projection's
        GEMM (:func:`~fold_model.layers.residual_gemm.add_matmul_`); returns x. Only for an x
        that nothing else reads afterwards (the caller's own stream)."""
        _, x_ln = self.layer_norm.fork(x)
        return add_matmul_(x, ops.swiglu(x_ln, self.linear_ab.weight), self.linear_out.weight)
