"""The op registry: one dispatch point for the primitives that kernels accelerate.

fold-model calls every attention, LayerNorm, softmax-with-bias and fused transition through
:func:`dispatch`. Each op has a plain PyTorch implementation (backend ``"torch"``, always present,
the references of :mod:`fold_ops.reference`). Other packages add backends without fold-model
knowing them: a package exposes an entry point in the group ``fold_model.ops`` whose target is a
function ``register(registry_module)``; fold-kernels registers its Triton ops this way.

Selection, per op:

* ``backend="auto"`` (default): the highest-priority backend whose ``supports(*args, **kwargs)``
  accepts the call (e.g. Triton only for CUDA/ROCm tensors); otherwise the torch reference, quietly.
* an explicit backend (argument, :func:`use_backend` context, or the ``FOLD_OPS_BACKEND``
  environment variable, e.g. ``FOLD_OPS_BACKEND=triton`` or ``attention=triton,layer_norm=torch``):
  if it is not registered or does not support the call, :class:`BackendUnavailable` is raised.

Ops, their signatures and their references are the contract of :mod:`fold_ops.contract`
(shared with fold-kernels); the torch backend of each op is its reference there, or, for an op
that falls back to another, a dispatch of that op.

Under autocast, the ops the contract marks ``lowered`` get their floating inputs cast to the
autocast dtype here, before any backend is chosen (:mod:`fold_ops.autocast`): every backend
then computes the same thing, and a kernel serves the bf16 projections of fp32 streams.

Two other situations, both AutoChunk's (fold-chunk):

* **While torch.fx traces** a module, each op is recorded as one ``call_function`` node of its
  leaf function (:mod:`fold_model.ops.leaves`: ``leaves.attention_packed`` etc., each with a
  ``fold_op`` attribute naming the op). The graph then runs :func:`dispatch` per call: the
  chunked code that AutoChunk generates gets the same backend choice as eager code (the Triton
  kernels on a GPU), and AutoChunk follows chunk dims through the op by its contract.
* **On FakeTensors** (AutoChunk's planning run, the ``predict --dry-run`` estimate) the backend
  is chosen as for real tensors, and then its ``fake`` implementation runs: a shape-only
  stand-in that allocates what the backend allocates (fold-kernels: the outputs and the small
  statistics, never the reference's ``[rows, H, N, N]`` logits), so the memory counted is that
  of the backend that will run. The torch backend's fake is its reference; a backend registered
  without a ``fake`` is passed over for FakeTensor calls (it may launch device code).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fold_ops.autocast import lower
from fold_ops.contract import OPS as CONTRACT
from fold_ops.env import EnvVar
from fold_ops.tracing import fx_tracing
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Proxy
from torch.utils._pytree import tree_flatten

from fold_model.ops import leaves

__all__ = [
    "OPS",
    "BackendUnavailable",
    "register",
    "unregister",
    "backends",
    "resolve",
    "selected_backend",
    "dispatch",
    "use_backend",
]

OPS = tuple(CONTRACT)
ENV_VAR = "FOLD_OPS_BACKEND"
ENTRY_POINT_GROUP = "fold_model.ops"


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend is not registered or cannot run this call."""


@dataclass
class _Impl:
    fn: Callable
    supports: Callable[..., bool] | None
    priority: int
    fake: Callable | None = None  # shape-only stand-in run on FakeTensors


@dataclass
class _State:
    impls: dict[str, dict[str, _Impl]] = field(default_factory=lambda: {op: {} for op in OPS})
    plugins_loaded: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()
_OVERRIDE = threading.local()


def _parse_env(text: str | None) -> dict[str, str]:
    """``"triton"`` -> {"*": "triton"}; ``"attention=triton,layer_norm=torch"`` -> per op."""
    mapping: dict[str, str] = {}
    for p in (p.strip() for p in (text or "").strip().split(",")):
        if not p:
            continue
        if "=" in p:
            name, value = p.split("=", 1)
            mapping.setdefault(name.strip(), value.strip())
        else:
            mapping.setdefault("*", p)
            break  # a bare default ends the list (later entries are ignored)
    return mapping


_ENV = EnvVar(ENV_VAR, _parse_env)
_SORTED: dict[str, list[str]] = {}  # op -> backends by priority (cleared by register)
_LOWERED = frozenset(name for name, o in CONTRACT.items() if o.lowered)  # cast under autocast


def register(
    op: str,
    backend: str,
    fn: Callable,
    *,
    supports: Callable[..., bool] | None = None,
    priority: int = 0,
    fake: Callable | None = None,
) -> None:
    """Register ``fn`` as ``backend``'s implementation of ``op``.

    ``supports(*args, **kwargs) -> bool`` says whether the backend can run a given call (device,
    dtype, shapes; it is also asked about FakeTensors, which carry them); ``priority`` orders
    backends for ``"auto"`` (the torch reference has 0). ``fake(*args, **kwargs)``, optional:
    what runs instead of ``fn`` when the arguments are FakeTensors, returning outputs of the
    right shapes, dtypes and devices and allocating what ``fn`` allocates on the way (memory
    estimates count it); without it the backend is not used for FakeTensor calls.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    _STATE.impls[op][backend] = _Impl(fn, supports, priority, fake)
    _SORTED.clear()


def unregister(op: str, backend: str) -> None:
    """Remove ``backend``'s implementation of ``op`` (the torch reference stays)."""
    if backend == "torch":
        raise ValueError(f"op {op!r}: the torch reference cannot be unregistered")
    if backend not in _STATE.impls.get(op, {}):
        raise ValueError(f"op {op!r}: backend {backend!r} is not registered")
    del _STATE.impls[op][backend]
    _SORTED.clear()


def _load_plugins() -> None:
    if _STATE.plugins_loaded:
        return
    with _STATE.lock:
        if _STATE.plugins_loaded:
            return
        _STATE.plugins_loaded = True
        import sys
        from importlib.metadata import entry_points

        for op in CONTRACT.values():  # the torch backend: the contract's references
            fn = op.reference if op.falls_back_to is None else _fallback(op.falls_back_to)
            register(op.name, "torch", fn, priority=0, fake=fn)  # the reference runs on fakes
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()(sys.modules[__name__])
            except Exception as exc:  # a broken plugin must not break the reference path
                import warnings

                warnings.warn(f"fold_model.ops: plugin {ep.name!r} failed to register: {exc}",
                              RuntimeWarning, stacklevel=2)


def _fallback(target: str) -> Callable:
    """The torch backend of an op that falls back to ``target``: whichever backend serves
    ``target`` serves it (same signature)."""

    def fallback(*args, **kwargs):
        return dispatch(target, *args, **kwargs)

    fallback.__name__ = f"fallback_to_{target}"
    return fallback


def backends(op: str) -> list[str]:
    """Registered backends of ``op``, highest priority first."""
    _load_plugins()
    order = _SORTED.get(op)
    if order is None:
        impls = _STATE.impls[op]
        order = _SORTED[op] = sorted(impls, key=lambda b: -impls[b].priority)
    return list(order)


def _requested(op: str) -> str:
    override = getattr(_OVERRIDE, "stack", None)
    if override:
        for mapping in reversed(override):
            if op in mapping:
                return mapping[op]
            if "*" in mapping:
                return mapping["*"]
    env = _ENV.get()
    if env:
        name = env.get(op) or env.get("*")
        if name:
            return name
    return "auto"


def _is_fake(args: tuple, kwargs: dict) -> bool:
    """Whether the call is on FakeTensors: every op's first argument is its data tensor."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    return isinstance(first, FakeTensor)


def _record(op: str, backend: str | None) -> Callable:
    """While torch.fx traces: a function that records the call as one node of the op's leaf
    (:mod:`fold_model.ops.leaves`), or runs the reference when no argument is a Proxy."""
    leaf = leaves.LEAVES[op]

    def record(*args, **kwargs):
        proxy = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Proxy)), None)
        if proxy is None:  # constants only: nothing to trace
            return _STATE.impls[op]["torch"].fn(*args, **kwargs)
        if backend is not None:
            kwargs = {**kwargs, "backend": backend}
        return proxy.tracer.create_proxy("call_function", leaf, args, kwargs)

    return record


def selected_backend(op: str, *args, backend: str | None = None, **kwargs) -> str:
    """The name of the backend :func:`dispatch` would run for this call (real tensors or
    FakeTensors of the shapes, dtypes and device in question: a memory estimate asks whether an
    op's kernel serves a call without materialising what the reference does)."""
    _load_plugins()
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    if op in _LOWERED:
        args, kwargs = lower(args, kwargs)
    return _select(op, args, kwargs, backend, _is_fake(args, kwargs))


def _select(op: str, args: tuple, kwargs: dict, backend: str | None, fake: bool) -> str:
    impls = _STATE.impls[op]
    name = backend or _requested(op)
    if name == "auto":
        order = _SORTED.get(op) or backends(op)
        for b in order:
            impl = impls[b]
            if fake and impl.fake is None:
                continue  # it may launch device code on the FakeTensors
            if impl.supports is None or impl.supports(*args, **kwargs):
                return b
        raise BackendUnavailable(f"op {op!r}: no backend supports this call")  # torch always does
    if name not in impls:
        raise BackendUnavailable(
            f"op {op!r}: backend {name!r} was requested but is not registered "
            f"(registered: {backends(op)}); install the package that provides it"
        )
    impl = impls[name]
    if impl.supports is not None and not impl.supports(*args, **kwargs):
        raise BackendUnavailable(
            f"op {op!r}: backend {name!r} was requested but cannot run this call "
            f"(device/dtype/shape not supported)"
        )
    if fake and impl.fake is None:
        raise BackendUnavailable(
            f"op {op!r}: backend {name!r} was requested on FakeTensors (a memory estimate) "
            "but registered no shape-only fake implementation")
    return name


def resolve(op: str, *args, backend: str | None = None, **kwargs) -> Callable:
    """The implementation that :func:`dispatch` would run for this call.

    While torch.fx traces a module it is a recorder of the op's leaf node (see the module doc;
    ``supports`` is never asked about Proxy arguments); on FakeTensors it is the chosen
    backend's ``fake``.
    """
    _load_plugins()
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    if fx_tracing():
        return _record(op, backend)
    fake = _is_fake(args, kwargs)
    impl = _STATE.impls[op][_select(op, args, kwargs, backend, fake)]
    return impl.fake if fake else impl.fn


def dispatch(op: str, *args, backend: str | None = None, **kwargs):
    """Run ``op`` with the selected backend (a lowered op's inputs cast under autocast)."""
    if op in _LOWERED:
        args, kwargs = lower(args, kwargs)
    return resolve(op, *args, backend=backend, **kwargs)(*args, **kwargs)


@contextlib.contextmanager
def use_backend(backend: str | dict[str, str]) -> Iterator[None]:
    """Select backends inside a ``with`` block: ``use_backend("triton")`` or a per-op dict."""
    mapping = {"*": backend} if isinstance(backend, str) else dict(backend)
    stack = getattr(_OVERRIDE, "stack", None)
    if stack is None:
        stack = _OVERRIDE.stack = []
    stack.append(mapping)
    try:
        yield
    finally:
        stack.pop()
