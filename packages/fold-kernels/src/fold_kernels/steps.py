"""Autograd Functions run as the steps of one other Function: one autograd node for all.

A training step's host time on the small shapes of variable-size training and prediction is
mostly per node: each ``Function.apply`` wraps its arguments and outputs, each node is a call
of the autograd engine in backward, and the views and casts between the nodes are nodes too.
A layer made of a dozen such nodes (triangle multiplication) can run its ops' Functions as
steps of one Function instead: its forward calls each step's ``forward`` with a :class:`Step`
for ``ctx``, its backward calls the steps' ``backward`` in reverse order. The steps' code (the
kernels, their launch choices, what each saves) is used as it is.

Every tensor a step saves is saved through the outer ``ctx.save_for_backward``
(:func:`save`, :func:`restore`), so saved-tensor hooks see all of them: activation
checkpointing drops and recomputes them as it does a node's own. After the backward the steps
hold none of them (:func:`release`), as autograd frees a node's saved tensors then: a caller
who keeps the outputs after ``backward()`` does not keep the activations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Step", "save", "restore", "release"]


class Step:
    """The ``ctx`` of one Function's forward run inside another's: attributes the forward sets
    are kept, the tensors it saves are held until :func:`save` hands them to the outer ctx.
    ``needs_input_grad``: what the step's backward reads as its inputs' needs."""

    def __init__(self, needs_input_grad: Sequence[bool]) -> None:
        self.needs_input_grad = tuple(needs_input_grad)
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass  # the outer backward passes each step what it has (None where nothing came)

    def mark_non_differentiable(self, *tensors) -> None:
        pass


def save(ctx, steps: Sequence[Step], *own) -> None:
    """Save the ``steps``' tensors and ``own`` through ``ctx.save_for_backward``, in order."""
    ctx.steps = tuple(steps)
    ctx.step_counts = tuple(len(s.saved_tensors) for s in steps)
    flat = [t for s in steps for t in s.saved_tensors]
    for s in steps:
        s.saved_tensors = ()  # held by ctx alone from here
    ctx.save_for_backward(*flat, *own)


def restore(ctx) -> tuple[torch.Tensor | None, ...]:
    """Give each step back its saved tensors (from ``ctx.saved_tensors``) and return ``own``."""
    flat = ctx.saved_tensors
    i = 0
    for step, n in zip(ctx.steps, ctx.step_counts, strict=True):
        step.saved_tensors = flat[i:i + n]
        i += n
    return flat[i:]


def release(ctx) -> None:
    """Drop the steps' handles on the saved tensors (the end of the outer backward)."""
    for step in ctx.steps:
        step.saved_tensors = ()
