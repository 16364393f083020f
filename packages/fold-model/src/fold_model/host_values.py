"""Whether a feature's values may be read on the host at this point of a forward, and what a
memory plan knows of them when they may not.

Inference shortcuts that look at feature values (e.g. "no template is present: skip the template
stack") need a host read. That read is not allowed, or would bake one input's values into
something meant for every input, while a CUDA graph is captured (the graph must hold both
branches' work: it is replayed for other inputs of the same shape) or while torch.compile traces;
on FakeTensors (``fold-train predict --dry-run`` plans memory without values) it is impossible.
The planner knows the real batch, so it states the few facts the shortcuts need with
:func:`known_any`; without them the full path runs (an upper bound)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["values_readable", "any_true", "known_any"]

_KNOWN: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar(
    "fold_known_any", default=None)


def values_readable(t: torch.Tensor) -> bool:
    """True when ``bool(t.any())`` and the like may run now (module docstring)."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(t) or torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def any_true(name: str, t: torch.Tensor) -> bool | None:
    """``bool(t.any())`` of the feature ``name`` when its values are readable, else what
    :func:`known_any` states for ``name``, else None (unknown: take the full path)."""
    if values_readable(t):
        return bool(t.any())
    return (_KNOWN.get() or {}).get(name)


@contextlib.contextmanager
def known_any(facts: dict[str, bool]) -> Iterator[None]:
    """Within the block, :func:`any_true` answers ``facts[name]`` for features whose values it
    cannot read (a dry run on FakeTensors of a real batch)."""
    token = _KNOWN.set({**(_KNOWN.get() or {}), **facts})
    try:
        yield
    finally:
        _KNOWN.reset(token)
