"""Duality Async Operations (FastFold section 5.1).

A DAO is a pair of autograd functions sharing one in-flight collective:

* forward: :func:`start` launches the collective asynchronously and returns a handle;
  independent work runs; :func:`wait` blocks on it and returns the result;
* backward (the roles swap): the backward of ``wait`` launches the dual collective of the
  gradient asynchronously; autograd then runs the backward of the independent work (it was
  recorded later, so the engine reaches it first); the backward of ``start`` blocks on it.

``start`` returns an empty *token* tensor that ``wait`` consumes, so autograd orders the two
backward nodes correctly. In the Evoformer block the MSA's ``col_to_row`` is started before the
pair stack and waited for after it (``EvoformerBlock.forward``), so the MSA all-to-all overlaps the
pair stack in forward and the gradient's all-to-all overlaps its backward.

``overlap_forward`` / ``overlap_backward`` switch each overlap off (the collective then runs
synchronously inside ``wait`` / inside the backward of ``wait``) so its benefit can be measured.

Activation checkpointing: the recomputation of a checkpointed block runs its forward again inside
the backward pass and (non-reentrant checkpoint, early stop) stops after the last tensor the
backward needs. The Evoformer block waits for its MSA ``col_to_row`` *after* the pair stack, past
that point, so a collective launched by ``start`` during recomputation would never be waited for:
a whole MSA all-to-all per block sent for nothing, its buffers held by the backend until it
notices completion. So ``start`` launches only outside backward; inside (recomputation) the
launch is deferred to ``wait``, which early stop never reaches. A synchronous DAO
(``overlap_forward=False``) also launches in ``wait``: same order of collectives on every rank,
same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fold_parallel.comm import Collectives, Pending

__all__ = ["AsyncHandle", "start", "wait", "start_all_to_all", "start_all_gather"]

Launch = Callable[[torch.Tensor, bool], Pending]  # (tensor, async_op) -> Pending

# -1 outside a backward pass; the id of the running graph task inside one (where checkpoint
# recomputes). torch.utils.checkpoint keys its recomputation on the same id. Without it
# (an unexpected torch build) every forward `start` launches, as if outside backward.
_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)


def in_backward() -> bool:
    """Whether this code runs inside a backward pass (e.g. a checkpoint's recomputation)."""
    return _graph_task_id is not None and _graph_task_id() != -1


class _DaoState:
    """What the two halves of one DAO share."""

    def __init__(
        self, forward_op: Launch, backward_op: Launch, overlap_forward: bool, overlap_backward: bool
    ) -> None:
        self.forward_op = forward_op
        self.backward_op = backward_op
        self.overlap_forward = overlap_forward
        self.overlap_backward = overlap_backward
        self.forward_pending: Pending | None = None
        self.deferred_input: torch.Tensor | None = None  # launched by `wait` (see module doc)
        self.backward_pending: Pending | None = None


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, state: _DaoState) -> torch.Tensor:
        ctx.state = state
        if state.overlap_forward and not in_backward():
            state.forward_pending = state.forward_op(x, True)
        else:
            state.deferred_input = x
        return x.new_empty(0)  # token: orders the backward of `wait` before this one

    @staticmethod
    def backward(ctx, grad_token: torch.Tensor):
        state: _DaoState = ctx.state
        pending, state.backward_pending = state.backward_pending, None
        if pending is None:
            raise RuntimeError("DAO: backward of start without the backward of its wait")
        return pending.wait(), None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token: torch.Tensor, state: _DaoState) -> torch.Tensor:
        ctx.state = state
        ctx.token_meta = (token.dtype, token.device)
        pending, state.forward_pending = state.forward_pending, None
        if pending is None:
            x, state.deferred_input = state.deferred_input, None
            if x is None:
                raise RuntimeError("DAO: a handle can be waited for only once")
            return state.forward_op(x, False).wait()
        return pending.wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        state: _DaoState = ctx.state
        state.backward_pending = state.backward_op(grad, state.overlap_backward)
        dtype, device = ctx.token_meta
        return torch.zeros(0, dtype=dtype, device=device), None


@dataclass
class AsyncHandle:
    """An in-flight DAO: pass it to :func:`wait` exactly once."""

    token: torch.Tensor
    state: _DaoState


def start(
    x: torch.Tensor,
    forward_op: Launch,
    backward_op: Launch,
    overlap_forward: bool = True,
    overlap_backward: bool = True,
) -> AsyncHandle:
    """Launch ``forward_op(x)``; its gradient goes through ``backward_op`` (the dual)."""
    state = _DaoState(forward_op, backward_op, overlap_forward, overlap_backward)
    return AsyncHandle(_Start.apply(x, state), state)


def wait(handle: AsyncHandle) -> torch.Tensor:
    """Finish the collective started by :func:`start` and return its result."""
    return _Wait.apply(handle.token, handle.state)


def start_all_to_all(
    x: torch.Tensor,
    split_dim: int,
    cat_dim: int,
    coll: Collectives,
    overlap_forward: bool = True,
    overlap_backward: bool = True,
) -> AsyncHandle:
    """Async all-to-all (see :meth:`Collectives.all_to_all`); backward: the inverse one."""
    return start(
        x,
        lambda t, a: coll.all_to_all(t, split_dim, cat_dim, async_op=a),
        lambda g, a: coll.all_to_all(g, cat_dim, split_dim, async_op=a),
        overlap_forward,
        overlap_backward,
    )


def start_all_gather(
    x: torch.Tensor,
    dim: int,
    coll: Collectives,
    overlap_forward: bool = True,
    overlap_backward: bool = True,
) -> AsyncHandle:
    """Async all-gather along ``dim``; backward: async reduce-scatter of the gradient."""
    return start(
        x,
        lambda t, a: coll.all_gather(t, dim, async_op=a),
        lambda g, a: coll.reduce_scatter(g, dim, async_op=a),
        overlap_forward,
        overlap_backward,
    )
