"""Feature values on the host for inference shortcuts, without a device read where one must not
happen.

Some inference shortcuts look at feature values: "no template is present: skip the template
stack", "template slot k is empty in every batch entry: skip it". Reading a device tensor's
values synchronizes the host with the device (prediction is kept free of that), is not allowed
while a CUDA graph is captured (and would bake one input's values into a graph replayed for
others), is not possible while torch.compile traces, and is impossible on FakeTensors
(``fold-train predict --dry-run`` plans memory without values).

So the caller that has the values states what the shortcuts need with :func:`known_slots` (the
predictors, once per prediction, keying their CUDA graphs by it; the dry run, from the real
batch), and the model asks :func:`slots_present`. Without a stated value the model reads the
tensor when that is allowed (eval-mode use of the module on its own), else takes the full path
(an upper bound of time and memory, the same numbers)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["values_readable", "slot_presence", "slots_present", "slot_filled", "batch_slots",
           "known_slots", "SLOT_FEATURES"]

# the features whose filled slots the model's inference shortcuts read
SLOT_FEATURES = ("template_mask",)

# feature name -> per slot of its last dim, whether any entry is set (stated by the caller)
_KNOWN: contextvars.ContextVar[dict[str, tuple[bool, ...]] | None] = contextvars.ContextVar(
    "fold_known_slots", default=None)


def values_readable(t: torch.Tensor) -> bool:
    """True when ``t``'s values may be read now (module docstring)."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(t) or torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def slot_presence(mask: torch.Tensor) -> tuple[bool, ...]:
    """``mask [..., T]`` (readable values) -> per slot of the last dim, whether any entry of
    the leading dims is set (one host read)."""
    flat = mask.detach().reshape(-1, mask.shape[-1]) if mask.dim() else mask.reshape(1, 1)
    return tuple(bool(x) for x in (flat != 0).any(0).tolist())


def slots_present(name: str, mask: torch.Tensor) -> tuple[bool, ...] | None:
    """Per slot of feature ``name``'s last dim (``mask`` is its tensor here), whether any
    entry is set: as stated by :func:`known_slots`, else read from ``mask`` when readable,
    else None (unknown: take the full path). A stated tuple may be shorter than the slots
    here (padded slots are empty)."""
    known = (_KNOWN.get() or {}).get(name)
    if known is not None:
        return known
    return slot_presence(mask) if values_readable(mask) else None


def slot_filled(present: tuple[bool, ...] | None, k: int) -> bool:
    """Whether slot ``k`` may hold something: unknown (None) counts as filled; past the end of
    a stated tuple is a padding slot, empty."""
    return present is None or (k < len(present) and present[k])


def batch_slots(batch: dict[str, torch.Tensor]) -> dict[str, tuple[bool, ...]]:
    """:func:`slot_presence` of each :data:`SLOT_FEATURES` feature of ``batch`` whose values
    are readable: what a caller states with :func:`known_slots`."""
    return {name: slot_presence(batch[name]) for name in SLOT_FEATURES
            if name in batch and values_readable(batch[name])}


@contextlib.contextmanager
def known_slots(values: dict[str, tuple[bool, ...]]) -> Iterator[None]:
    """Within the block, :func:`slots_present` answers ``values[name]``."""
    token = _KNOWN.set({**(_KNOWN.get() or {}), **values})
    try:
        yield
    finally:
        _KNOWN.reset(token)
