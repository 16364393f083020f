"""The op registry: one dispatch point for the primitives that kernels accelerate.

fold-model calls every attention, LayerNorm, softmax-with-bias and fused transition through
:func:`dispatch`. Each op has a plain PyTorch implementation (backend ``"torch"``, always present,
registered by :mod:`fold_model.ops.reference`). Other packages add backends without fold-model
knowing them: a package exposes an entry point in the group ``fold_model.ops`` whose target is a
function ``register(registry_module)``; fold-kernels registers its Triton ops this way.

Selection, per op:

* ``backend="auto"`` (default): the highest-priority backend whose ``supports(*args, **kwargs)``
  accepts the call (e.g. Triton only for CUDA/ROCm tensors); otherwise the torch reference, quietly.
* an explicit backend (argument, :func:`use_backend` context, or the ``FOLD_OPS_BACKEND``
  environment variable, e.g. ``FOLD_OPS_BACKEND=triton`` or ``attention=triton,layer_norm=torch``):
  if it is not registered or does not support the call, :class:`BackendUnavailable` is raised.

Op signatures (all backends implement exactly these):

``attention(q, k, v, bias=None, mask=None, scale=None, gate=None) -> o``
    ``o = softmax(scale * q @ k^T + bias + mask_bias) @ v`` (then ``o * sigmoid(gate)`` if given).
    q, k, v, gate: ``[*, R, H, N_q|N_k, D]``; bias: ``[*, H, N_q, N_k]`` shared by the R rows (or
    None); mask: ``[*, R, N_k]``, bool or float, true/1 = attend (or None); scale defaults to
    ``D**-0.5``. A query whose keys are all masked gets the mean of v (uniform weights), as a
    masked softmax with a large negative bias gives.
``attention_packed(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None, gated=True)``
    self-attention whose q, k, v (and gate) are packed in one projection ``proj [*, R, N,
    P*H*D]`` (P = 4: q | k | v | gate, or 3 without ``gated``; each part head-major ``[H, D]``);
    the gate is ``sigmoid(gate + gate_bias)``. Returns ``[*, R, N, H*D]``. One GEMM of the
    stacked weights feeds it: a backend reads the parts in place and writes their gradients
    into one packed gradient (no split, no concatenation, no gradient sum over four GEMMs).
``triangle_attention(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None, gated=True)``
    triangle attention (AF2 Alg. 13-14): ``attention_packed``'s contract; the torch reference
    dispatches to ``attention_packed`` (whichever backend serves it), so a kernel for triangle
    attention alone is one registration of this op.
``linear(x, weight, bias=None) -> y``                ``F.linear``; a backend may compute the
    backward differently (fold-kernels: the bias gradient as a fast deterministic column sum).
``layer_norm(x, weight, bias, eps=1e-5) -> y``        over the last dim, like F.layer_norm.
``layer_norm_linear(x, ln_weight, ln_bias, weight, bias=None, eps=1e-5) -> y``
    ``F.linear(F.layer_norm(x), weight, bias)``.
``softmax_mask_bias(logits, mask=None, bias=None) -> p``
    softmax over the last dim of ``logits + bias + (mask - 1) * inf``; mask/bias broadcast.
``swiglu(x, weight, bias=None) -> y``
    ``a, b = F.linear(x, weight, bias).chunk(2, -1); y = silu(a) * b`` (AF3 transition).
``bias_sigmoid_gate(x, gate, bias=None) -> y``       ``x * sigmoid(gate + bias)``.
``bias_dropout_residual(x, residual, bias=None, dropout_mask=None) -> y``
    ``residual + (x + bias) * dropout_mask``; the mask is pre-scaled by 1/(1-p) and broadcasts
    (AF2's shared row/column dropout).
``triangle_projection_gate(proj, bias, mask) -> (a, b)``
    the gated, masked operands of triangle multiplication from the channel-first projections
    ``proj [*, 4c, I, J]`` (rows ``p_a, g_a, p_b, g_b``), ``bias [4c]``, ``mask [*, I, J]``:
    ``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) * mask``, likewise b, each ``[*, c, I, J]``.
``linear_channel_first(x, weight) -> y``
    ``y[..., o, i, j] = sum_c weight[o, c] x[..., i, j, c]``: x ``[*, I, J, C]``, weight
    ``[O, C]``, y ``[*, O, I, J]`` (no bias; triangle multiplication's projections). The torch
    reference is an einsum; fold-kernels returns ``d(x)`` in x's channel-last layout.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "OPS",
    "BackendUnavailable",
    "register",
    "backends",
    "resolve",
    "dispatch",
    "use_backend",
]

OPS = (
    "linear",
    "attention",
    "attention_packed",
    "triangle_attention",
    "layer_norm",
    "layer_norm_linear",
    "softmax_mask_bias",
    "swiglu",
    "bias_sigmoid_gate",
    "bias_dropout_residual",
    "triangle_projection_gate",
    "linear_channel_first",
)
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


class _EnvVar:
    """An environment variable read cheaply on every call: the raw value is looked up in
    ``os.environ``'s backing dict and re-parsed only when that value object changes (so
    ``monkeypatch.setenv`` and ``os.environ[...] = ...`` take effect at once)."""

    def __init__(self, name: str, parse: Callable[[str], object]) -> None:
        self.name = name
        self.parse = parse
        data = getattr(os.environ, "_data", None)
        encode = getattr(os.environ, "encodekey", None)
        self._data = data if isinstance(data, dict) and encode is not None else None
        self._key = encode(name) if self._data is not None else name
        self._raw: object = object()  # matches nothing: the first get() parses
        self._value: object = None

    def get(self):
        raw = self._data.get(self._key) if self._data is not None else os.environ.get(self.name)
        if raw is not self._raw:
            text = "" if raw is None else (raw.decode() if isinstance(raw, bytes) else raw)
            self._value = self.parse(text)
            self._raw = raw
        return self._value


def _parse_env(text: str) -> dict[str, str]:
    """``"triton"`` -> {"*": "triton"}; ``"attention=triton,layer_norm=torch"`` -> per op."""
    mapping: dict[str, str] = {}
    for p in (p.strip() for p in text.strip().split(",")):
        if not p:
            continue
        if "=" in p:
            name, value = p.split("=", 1)
            mapping.setdefault(name.strip(), value.strip())
        else:
            mapping.setdefault("*", p)
            break  # a bare default ends the list (later entries are ignored)
    return mapping


_ENV = _EnvVar(ENV_VAR, _parse_env)
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

        import fold_model.ops.reference  # noqa: F401  (registers the torch backend)

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()(sys.modules[__name__])
            except Exception as exc:  # a broken plugin must not break the reference path
                import warnings

                warnings.warn(f"fold_model.ops: plugin {ep.name!r} failed to register: {exc}",
                              RuntimeWarning, stacklevel=2)


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


_FX_CHECK: list = []  # [is_fx_symbolic_tracing or None, the _symbolic_trace module], bound once


def _fx_tracing() -> bool:
    if not _FX_CHECK:
        from torch.fx import _symbolic_trace

        _FX_CHECK[:] = [getattr(_symbolic_trace, "is_fx_symbolic_tracing", None), _symbolic_trace]
    check, module = _FX_CHECK
    # is_fx_symbolic_tracing (no log warning) where it exists; the flag itself otherwise.
    if check is not None:
        return bool(check())
    return bool(getattr(module, "_is_fx_tracing_flag", False))


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
    if _fx_tracing():
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
