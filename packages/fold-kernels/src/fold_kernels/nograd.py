"""An autograd function's forward without autograd when no gradient will be taken.

``torch.autograd.Function.apply`` costs microseconds of host time per call even when no input
requires a gradient or under ``torch.no_grad()`` (the arguments are unwrapped, a context made,
the outputs wrapped). For a small op that is a large share of its host time: AdaLN's forward
went from 19.6 to 14.5 us on the development CPU (launch stubbed) without it. Inference
(``fold-train predict`` eagerly, AutoChunk's chunk loops) takes no gradient, so :func:`apply`
runs the function's ``forward`` directly there, with a context that keeps the attributes the
forward sets and drops the tensors it would save.
"""

from __future__ import annotations

import torch

__all__ = ["apply", "records", "saves"]


class _NoBackward:
    """The ``ctx`` of a forward whose backward will never run."""

    def save_for_backward(self, *tensors) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass

    def mark_non_differentiable(self, *tensors) -> None:
        pass


def saves(ctx) -> bool:
    """Whether a forward's ``ctx`` will reach a backward (False under :func:`apply`'s
    inference path): a forward that writes something only for its backward can skip it."""
    return not isinstance(ctx, _NoBackward)


def records(*args) -> bool:
    """Whether autograd would record an op of ``args``: grad mode is on and a tensor argument
    requires a gradient."""
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return True
    return False


def apply(fn: type[torch.autograd.Function], *args):
    """``fn.apply(*args)``, or ``fn.forward`` on its own when autograd would record nothing
    (:func:`records`)."""
    if records(*args):
        return fn.apply(*args)
    return fn.forward(_NoBackward(), *args)
