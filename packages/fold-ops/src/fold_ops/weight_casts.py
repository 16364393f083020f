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

**Training** (:func:`grouped_casts`): there the casts must carry gradients and are made again
every forward, yet each is still one kernel and one autograd node per parameter in the forward,
and another of each in the backward (the gradient cast back to fp32): 85 casts in a tiny AF2
Evoformer block's training step on fold-kernels' ops. A block whose ``forward`` is wrapped by
:func:`grouped` casts the parameters its forward reads in one op (:class:`_GroupCast`: two
launches, one node; its backward two launches) and hands out those casts while its forward
runs (19 casts in that step). The values are those of the per-call casts; a parameter read
twice in one forward gets its gradients summed in the autocast dtype before the cast back, as
under autocast's own cast cache.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import torch

from fold_ops.env import EnvVar
from fold_ops.tracing import compiling, fx_tracing

__all__ = ["WeightCasts", "weight_casts", "cast_weight", "cast_stacked", "concatenated",
           "grouped_casts", "grouped"]


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
    group = _GROUP.get()
    if group is not None:
        served = group.serve(w, dtype)
        if served is not None:
            return served
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
    group = _GROUP.get()
    if group is not None:
        served = [group.serve(s) for s in sources]
        if all(c is not None for c in served):
            return make(*served)
    found = _cache_dtype(sources)
    if found is not None:
        cached = found[0].get(sources, tag, found[1], make)
        if cached is not None:
            return cached
    return make(*sources)


# ``FOLD_GROUPED_CASTS=0``: under training autocast every parameter is cast per call, as before
# (for comparisons: benchmarks/tools/switch_ab.py)
_GROUPED = EnvVar("FOLD_GROUPED_CASTS", lambda v: (v if v is not None else "1") != "0")


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' values one after another, ``[sum of numels]`` (one launch; the views and
    the concatenation are made in C++: per tensor a Python loop would cost more host time than
    the cast it saves)."""
    return torch._C._nn.flatten_dense_tensors(list(tensors))


def _unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Views of ``flat`` shaped as ``like`` (no launch)."""
    return tuple(torch._C._nn.unflatten_dense_tensors(flat, list(like)))


class _GroupCast(torch.autograd.Function):
    """``(dtype, *params) -> casts``: every ``p.to(dtype)`` from one flat copy (a concatenation
    and one cast, two launches); the backward casts the gradients back the same way. The casts
    are views of that flat tensor (none is modified in place: they are weights)."""

    @staticmethod
    def forward(ctx, dtype, *params):
        ctx.params = params  # their shapes for the backward (parameters: held anyway)
        ctx.set_materialize_grads(False)  # an unread parameter's gradient stays None
        return _unflatten(_flatten(params).to(dtype), params)

    @staticmethod
    def backward(ctx, *grads):
        read = [i for i, g in enumerate(grads) if g is not None]
        out: list = [None] * len(grads)
        if read:
            flat = _flatten([grads[i] for i in read]).to(ctx.params[0].dtype)
            for i, part in zip(read, _unflatten(flat, [ctx.params[i] for i in read]),
                               strict=True):
                out[i] = part
        return (None, *out)


class _Group:
    """The casts one :func:`grouped_casts` made, by ``id`` of their parameter, and which
    parameters its forward asked for."""

    __slots__ = ("casts", "dtype", "kind", "served", "missed")

    def __init__(self, params: list, dtype: torch.dtype, kind: str) -> None:
        casts = _GroupCast.apply(dtype, *params) if params else ()
        self.casts = {id(p): (p, c) for p, c in zip(params, casts, strict=True)}
        self.dtype = dtype
        self.kind = kind
        self.served: set[int] = set()  # ids of the parameters handed out
        self.missed: list[torch.nn.Parameter] = []  # asked for, not in the group

    def serve(self, w, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """``w``'s cast, where the caller would cast ``w`` to this dtype now (autocast on with
        it), else None."""
        if (dtype is not None and dtype != self.dtype) or not torch.is_autocast_enabled(
                self.kind) or torch.get_autocast_dtype(self.kind) != self.dtype:
            return None
        found = self.casts.get(id(w))
        if found is None or found[0] is not w:
            if isinstance(w, torch.nn.Parameter) and w.requires_grad:
                self.missed.append(w)
            return None
        self.served.add(id(w))
        return found[1]


_GROUP: ContextVar[_Group | None] = ContextVar("fold_grouped_casts", default=None)


class _Plan:
    """A module's parameters (listed once: they change only by registration, assignment or
    ``register_parameter`` / ``add_module``, which bumps the generation) and those its grouped
    forwards have asked for (None until the first one ran: it casts every candidate)."""

    __slots__ = ("generation", "params", "asked")

    def __init__(self, module: torch.nn.Module) -> None:
        self.generation = _GENERATION[0]
        self.params = tuple(module.parameters())
        self.asked: tuple | None = None

    def learn(self, group: _Group) -> None:
        """Keep what ``group``'s forward asked for: a later group casts only those (a
        parameter asked for later joins them; until then it is cast per call)."""
        if self.asked is not None and not group.missed:
            return  # the group held only asked parameters: nothing new
        owned = {id(p) for p in self.params}
        keep = set(group.served)
        if self.asked is not None:
            keep.update(id(p) for p in self.asked)
        keep.update(id(p) for p in group.missed if id(p) in owned)
        asked = [p for p in self.params if id(p) in keep]  # in the module's order
        self.asked = tuple(asked)


_GENERATION = [0]
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> _Plan


def _bump(*_args) -> None:
    _GENERATION[0] += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_bump)
torch.nn.modules.module.register_module_module_registration_hook(_bump)


def _plan(module: torch.nn.Module) -> _Plan:
    plan = _PLANS.get(module)
    if plan is None or plan.generation != _GENERATION[0]:
        plan = _PLANS[module] = _Plan(module)
    return plan


@contextlib.contextmanager
def grouped_casts(module: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``module``'s trainable parameters are cast to the autocast dtype in one
    op and :func:`cast_weight` / :func:`cast_stacked` hand those casts out (module doc).

    Made only under autocast with autograd on, outside torch.fx tracing and torch.compile, and
    not inside another block's group. A candidate requires grad, is floating and is neither
    fp64 nor in the autocast dtype, and has the first such parameter's device and dtype (others
    are cast per call, as before). The first group of a module casts every candidate; later
    ones only those its forwards asked for (the LayerNorms' parameters, read in fp32, are left
    out)."""
    if not (torch.is_grad_enabled() and _GROUPED.get()) or fx_tracing() or compiling():
        yield
        return
    plan = _plan(module)
    first = next((p for p in plan.params if p.requires_grad), None)
    if first is None or not torch.is_autocast_enabled(first.device.type):
        yield
        return
    kind = first.device.type
    dtype = torch.get_autocast_dtype(kind)
    if _GROUP.get() is not None:
        yield  # an enclosing block's group holds them (its parameters include this module's)
        return
    source = None
    chosen = []
    for p in plan.params if plan.asked is None else plan.asked:
        if not p.requires_grad or not p.is_floating_point() or p.dtype in (dtype, torch.float64):
            continue
        if source is None:
            source = (p.device, p.dtype)
        if (p.device, p.dtype) == source:
            chosen.append(p)
    group = _Group(chosen, dtype, kind)
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)
        plan.learn(group)


def grouped(forward: Callable) -> Callable:
    """A block's ``forward`` run inside :func:`grouped_casts` of its module."""

    @functools.wraps(forward)
    def run(self, *args, **kwargs):
        with grouped_casts(self):
            return forward(self, *args, **kwargs)
    return run
