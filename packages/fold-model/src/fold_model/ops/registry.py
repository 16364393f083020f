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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fold_ops.contract import OPS as CONTRACT
from fold_ops.env import EnvVar
from fold_ops.tracing import fx_tracing

__all__ = [
    "OPS",
    "BackendUnavailable",
    "register",
    "backends",
    "resolve",
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


def register(
    op: str,
    backend: str,
    fn: Callable,
    *,
    supports: Callable[..., bool] | None = None,
    priority: int = 0,
) -> None:
    """Register ``fn`` as ``backend``'s implementation of ``op``.

    ``supports(*args, **kwargs) -> bool`` says whether the backend can run a given call (device,
    dtype, shapes); ``priority`` orders backends for ``"auto"`` (the torch reference has 0).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    _STATE.impls[op][backend] = _Impl(fn, supports, priority)
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
            register(op.name, "torch", fn, priority=0)
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


def resolve(op: str, *args, backend: str | None = None, **kwargs) -> Callable:
    """The implementation that :func:`dispatch` would run for this call.

    While torch.fx traces a module the torch reference is returned whatever was requested, so
    traced graphs contain plain torch ops (AutoChunk rewrites those) and ``supports`` is never
    asked about Proxy arguments.
    """
    _load_plugins()
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    impls = _STATE.impls[op]
    if fx_tracing():
        return impls["torch"].fn
    name = backend or _requested(op)
    if name == "auto":
        order = _SORTED.get(op) or backends(op)
        for b in order:
            impl = impls[b]
            if impl.supports is None or impl.supports(*args, **kwargs):
                return impl.fn
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
    return impl.fn


def dispatch(op: str, *args, backend: str | None = None, **kwargs):
    """Run ``op`` with the selected backend."""
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
