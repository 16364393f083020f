"""The weights' autocast casts made once per prediction instead of once per call.

Under bf16 autocast a matrix product casts its fp32 weight to bf16 on every call, and so does
fold's dispatcher for a lowered op (:func:`fold_ops.autocast.lower`). Training needs that: the
weights change every step and their gradient flows back through the cast. A prediction's weights
do not change between its steps, yet each AF3 sampler step cast them again: 436 of its 478 cast
kernels (768 tokens on an H200: the step went from 12.83 to 11.63 ms as CUDA-graph replays when
they were made once; eager, each was also an op on the host).

:class:`WeightCasts` keeps the cast of each parameter, and of a tensor stacked from parameters
(the attention's packed q, k, v, gate projection), and hands it out while it is active
(:func:`weight_casts`). A cached weight is ``w.to(dtype)`` of the same ``w``: the values a call
computes do not change. It is used only where that holds:

* for an ``nn.Parameter`` (an activation is new every call);
* under autocast on the parameter's device, for a floating parameter that is neither fp64 nor
  already in the autocast dtype;
* without autograd through the parameter (grad mode off, or ``requires_grad`` False): a cast
  made outside autograd has no path back to ``w``;
* not while torch.fx traces or torch.compile compiles (their graphs own their casts);
* while a CUDA graph is captured, only an entry made before the capture (a cast made during a
  capture would be written only by that graph's replays): the capture's eager warm-up run makes
  them.

Staleness: an entry records its sources' version counters and storage addresses. A lookup that
finds them changed (an optimizer step, ``load_state_dict``) casts again into the same tensor;
:meth:`WeightCasts.refresh` does so for every entry, for CUDA graphs that replay without Python
(``fold-train``'s predictors call it before each prediction).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import torch

from fold_ops.tracing import compiling, fx_tracing

__all__ = ["WeightCasts", "weight_casts", "cast_weight", "cast_stacked", "concatenated"]


def _stamp(sources: Sequence[torch.Tensor]) -> tuple:
    return tuple((s._version, s.data_ptr()) for s in sources)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _Entry:
    __slots__ = ("sources", "make", "dtype", "kind", "stamp", "value")

    def __init__(self, sources, make, dtype) -> None:
        self.sources = sources  # held: their ids key the entry
        self.make = make
        self.dtype = dtype
        self.kind = sources[0].device.type
        self.stamp = None
        self.value: torch.Tensor | None = None

    def cast(self) -> torch.Tensor:
        """``make(*sources)`` in ``dtype``, written into the same tensor when it has one of that
        shape (a captured graph reads it at its address)."""
        # a plain tensor even inside inference_mode: a later call with autograd on (frozen
        # parameters) may save it for backward
        with torch.inference_mode(False), torch.no_grad():
            fresh = self.make(*self.sources)
            if self.value is not None and self.value.shape == fresh.shape:
                self.value.copy_(fresh)
            else:
                self.value = fresh.to(self.dtype, copy=True)
        self.stamp = _stamp(self.sources)
        return self.value


class WeightCasts:
    """The casts of parameters (and of tensors made from them) in the autocast dtype; see the
    module doc. Holds the parameters it has cast and one copy of each in that dtype (for AF3's
    368M parameters in bf16, 0.74 GB)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, _Entry] = {}
        # a parameter's own cast by id(parameter): cast_weight's lookup in a few attribute
        # reads (the eager path asks once per projection; a cast it saves costs a launch)
        self._weights: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.value.nbytes for e in self._entries.values() if e.value is not None)

    def get(self, sources: tuple[torch.Tensor, ...], tag: str, dtype: torch.dtype,
            make: Callable[..., torch.Tensor]) -> torch.Tensor | None:
        """The cached ``make(*sources)`` in ``dtype`` (made now when missing or stale), or None
        where no entry may be made (a CUDA graph capture)."""
        key = (tag, dtype, *map(id, sources))
        entry = self._entries.get(key)
        if entry is not None and entry.stamp == _stamp(sources):
            return entry.value
        if _capturing():
            return None
        if entry is None:
            entry = self._entries[key] = _Entry(sources, make, dtype)
            if tag == "weight":
                self._weights[id(sources[0])] = entry
        return entry.cast()

    def refresh(self) -> int:
        """Cast again every entry whose sources changed since it was made; the number recast."""
        stale = [e for e in self._entries.values() if e.stamp != _stamp(e.sources)]
        for e in stale:
            e.cast()
        return len(stale)

    def clear(self) -> None:
        self._entries.clear()
        self._weights.clear()


_ACTIVE: ContextVar[WeightCasts | None] = ContextVar("fold_weight_casts", default=None)


@contextlib.contextmanager
def weight_casts(cache: WeightCasts | None) -> Iterator[WeightCasts | None]:
    """Hand out ``cache``'s casts (None: none) inside the block."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)


def _cache_dtype(sources: Sequence[torch.Tensor], want: torch.dtype | None = None
                 ) -> tuple[WeightCasts, torch.dtype] | None:
    """The active cache and the autocast dtype, when ``sources`` may be served (module doc) and
    the autocast dtype is ``want`` (when given)."""
    cache = _ACTIVE.get()
    if cache is None:
        return None
    grad = torch.is_grad_enabled()
    if not all(isinstance(s, torch.nn.Parameter) and not (grad and s.requires_grad)
               for s in sources):  # (an fx Proxy is no Parameter)
        return None
    kind = sources[0].device.type
    if not torch.is_autocast_enabled(kind):
        return None
    dtype = torch.get_autocast_dtype(kind)
    if want is not None and want != dtype:
        return None
    if any(s.dtype in (dtype, torch.float64) or not s.is_floating_point() for s in sources):
        return None
    if fx_tracing() or compiling():
        return None
    return cache, dtype


def _same(w: torch.Tensor) -> torch.Tensor:
    return w


def concatenated(*tensors: torch.Tensor) -> torch.Tensor:
    """``torch.cat(tensors)``: a ``make`` for :func:`cast_stacked` (stacked projections)."""
    return torch.cat(tensors)


def cast_weight(w: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``w`` in the autocast dtype from the active :class:`WeightCasts` where it may be served
    (module doc), else ``w`` itself (autocast or the dispatcher casts it as before). ``dtype``:
    served only when that is the autocast dtype (a reference op casting a weight to its input's
    dtype)."""
    cache = _ACTIVE.get()
    if cache is None:
        return w
    entry = cache._weights.get(id(w))
    if entry is not None and entry.sources[0] is w and entry.stamp == (
            (w._version, w.data_ptr()),):  # the hot path: every check of _cache_dtype, cheaply
        kind = entry.kind
        if (torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == entry.dtype
                and (dtype is None or dtype == entry.dtype)
                and not (w.requires_grad and torch.is_grad_enabled()) and not compiling()):
            return entry.value
    found = _cache_dtype((w,), dtype)
    if found is None:
        return w
    cached = found[0].get((w,), "weight", found[1], _same)
    return w if cached is None else cached


def cast_stacked(sources: Sequence[torch.Tensor], tag: str,
                 make: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``make(*sources)`` (a tensor made from parameters, e.g. their concatenation), from the
    active :class:`WeightCasts` in the autocast dtype where the sources may be served, else made
    now in their dtype. ``tag`` names what ``make`` makes (one cache holds several makes of the
    same sources)."""
    sources = tuple(sources)
    found = _cache_dtype(sources)
    if found is not None:
        cached = found[0].get(sources, tag, found[1], make)
        if cached is not None:
            return cached
    return make(*sources)
