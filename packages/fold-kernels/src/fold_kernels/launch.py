"""Cached kernel launchers: a Triton kernel launched through its compiled handle.

``kernel[grid](*args, **meta)`` runs Triton's JIT path on every call: it binds the arguments to
the signature, computes the specialization of each one, builds a cache key from them and the
options, looks the compiled kernel up, and only then calls the C launcher. For the small, many
launches of an eager AlphaFold block (hundreds per forward+backward) that path is a large share
of the host time per launch. :func:`fast` wraps a ``@triton.jit`` kernel so that the first call
of each specialization goes through Triton (which compiles and returns the compiled kernel), and
later calls go straight to the compiled kernel's launcher, keyed by fold's own specialization
key (:func:`spec_key`).

The key must distinguish every pair of calls that Triton would compile differently, or a kernel
compiled for one set of assumptions would run on arguments that break them. It is deliberately
finer than Triton's own rules (a finer key only costs a cache entry):

* a tensor: its dtype, whether its data pointer is 16-byte aligned (Triton's pointer
  alignment specialization) and whether it is a GPU tensor (a CPU tensor misses the cache, and
  Triton's path gives its own error);
* an int: whether it equals 1, whether it is divisible by 16, and whether it fits in int32
  (Triton specializes ``== 1`` to a constant, ``% 16 == 0`` to a divisibility attribute, and
  types ints as i32 / i64 / u64 by range);
* bool, float and None by type; any other argument type is not cached (Triton's path runs);
* the keyword arguments (the ``tl.constexpr`` meta-parameters, ``num_warps``, ``num_stages``)
  by value, and the current device.

A cached launch hands each tensor to the launcher as its data pointer, an int, which the key
has read anyway. Given a tensor, Triton's C launcher calls its ``data_ptr`` method and asks the
driver whether the pointer is a device pointer (``cuPointerGetAttribute``): per pointer
argument, per launch. Given an int, it takes the value as the pointer. The key's GPU flag
stands in for that check: a CPU tensor misses the cache and goes through Triton's path, which
refuses it.

On Triton 3.6, whose launcher object is a Python ``__call__`` that allocates no scratch for
kernels that need none, a cached launch calls the launcher's C function directly
(:func:`direct_launch`); other versions go through ``__call__``.

Under ``TRITON_INTERPRET=1`` (CPU tests) and with ``FOLD_KERNELS_FAST_LAUNCH=0`` every call takes
Triton's path unchanged.

A kernel with a ``PDL: tl.constexpr`` parameter gets it here, on every path, and with it Triton's
``launch_pdl`` option where programmatic dependent launch is on (:mod:`fold_kernels.pdl`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from fold_ops.env import EnvVar

from fold_kernels import pdl
from fold_kernels.tuning import interpreting

__all__ = ["FastKernel", "fast", "spec_key", "launch_args", "enabled", "raw_stream",
           "active_hook", "direct_launch"]

_ENABLED = EnvVar("FOLD_KERNELS_FAST_LAUNCH", lambda v: (v if v is not None else "1") != "0")
_INT32 = (-(2**31), 2**31)
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")


def enabled() -> bool:
    """The cached launch path is in use (not under the interpreter, not switched off)."""
    return _ENABLED.get() and not interpreting()


def _arg_key(a) -> object:
    t = type(a)
    if t is int:
        return (a == 1, a % 16 == 0, _INT32[0] <= a < _INT32[1])
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0, a.is_cuda)
    if t is float:
        return "f"
    if t is bool:
        return "b"
    if a is None:
        return None
    raise TypeError(t)  # not a type the key understands: Triton's own path decides


def launch_args(args: Sequence[object]) -> tuple[list, list]:
    """``(keys, launch)``: ``[_arg_key(a) for a in args]``, with the two common types inlined
    (a launch of the LayerNorm backward has 37 arguments; without a call per argument their key
    takes about a quarter less host time), and the arguments to launch with: each tensor
    replaced by its data pointer (an int: see the module docstring), the rest as given."""
    lo, hi = _INT32
    keys = []
    out = list(args)
    for i, a in enumerate(args):
        if type(a) is int:
            keys.append((a == 1, a % 16 == 0, lo <= a < hi))
        elif isinstance(a, torch.Tensor):
            ptr = out[i] = a.data_ptr()
            keys.append((a.dtype, ptr % 16 == 0, a.is_cuda))
        else:
            keys.append(_arg_key(a))
    return keys, out


def spec_key(args: Sequence[object]) -> tuple:
    """fold's specialization key of positional kernel arguments (see the module docstring).

    Raises ``TypeError`` for an argument type the key does not cover."""
    return tuple(launch_args(args)[0])


# The current CUDA stream's handle for a device index (what Triton's own launch path reads).
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)


def active_hook(hook):
    """A launch hook to hand to Triton's launcher, or None when nothing would run.

    Triton 3.6 and later keep each launch hook in a ``HookChain`` that is never None, empty
    unless a profiler adds to it. Handed over as is, an empty chain costs every launch the
    launch metadata (a Python object) and two calls from the launcher into Python; as None, the
    launcher skips all three, as it does on Tritons whose hooks are plain attributes."""
    if hook is None:
        return None
    calls = getattr(hook, "calls", None)  # a HookChain's hooks; a plain callable has none
    return hook if calls is None or calls else None


def direct_launch(run) -> Callable | None:
    """The C launch function of Triton's launcher object ``run``, to call with Triton 3.6's
    argument order ``(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch,
    profile_scratch, metadata, launch_metadata, enter_hook, exit_hook, *args)``; None where that
    is not known to be right (another Triton, or a kernel that needs scratch memory, which only
    the launcher's ``__call__`` allocates): the launcher object is then called as it is."""
    import triton

    if tuple(int(p) for p in triton.__version__.split(".")[:2]) != (3, 6):
        return None
    if (getattr(run, "global_scratch_size", 1) != 0
            or getattr(run, "profile_scratch_size", 1) != 0
            or not hasattr(run, "launch_cooperative_grid") or not hasattr(run, "launch_pdl")):
        return None
    return getattr(run, "launch", None)


class _Launch:
    """One compiled specialization: the launcher, its handles and the trailing arguments
    (the meta-parameters, in signature order) appended to every call."""

    __slots__ = ("compiled", "run", "direct", "flags", "function", "metadata", "tail", "knobs")

    def __init__(self, compiled, tail: tuple) -> None:
        from triton import knobs

        self.knobs = knobs.runtime
        self.compiled = compiled
        self.run = compiled.run  # loads the module on first access
        self.direct = direct_launch(self.run)
        self.flags = ((self.run.launch_cooperative_grid, self.run.launch_pdl)
                      if self.direct is not None else None)
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.tail = tail


class FastKernel:
    """A ``@triton.jit`` kernel whose launches after the first of each specialization skip
    Triton's argument binding (``kernel[grid](*args, **meta)``, same call as the JIT kernel).

    Attributes not defined here are the wrapped JIT function's (``fn``, ``src``, ...)."""

    def __init__(self, jit_fn) -> None:
        self.jit = jit_fn
        self._cache: dict[tuple, _Launch] = {}
        params = getattr(jit_fn, "params", None)
        self._params = [(p.name, p.default) for p in params] if params else None
        fn = getattr(jit_fn, "fn", jit_fn)  # the Python function (the interpreter's too)
        self._pdl = pdl.PARAM in inspect.signature(fn).parameters

    def __getattr__(self, name: str):
        return getattr(self.jit, name)

    def __getitem__(self, grid) -> Callable[..., object]:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def _tail(self, n_args: int, kwargs: dict) -> tuple | None:
        if self._params is None or n_args > len(self._params):
            return None
        tail = []
        for name, default in self._params[n_args:]:
            if name in kwargs:
                tail.append(kwargs[name])
            elif default is not inspect.Parameter.empty and default is not None:
                tail.append(default)
            else:
                return None  # a parameter we cannot fill: let Triton bind it
        return tuple(tail)

    def launch(self, grid, args: tuple, kwargs: dict):
        if interpreting():  # the interpreter: Triton's path, never PDL
            if self._pdl:
                kwargs = {**kwargs, pdl.PARAM: False}
            return self.jit[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        if self._pdl:  # the kernel waits for its predecessors itself when PDL is True
            kwargs = ({**kwargs, pdl.PARAM: True, "launch_pdl": True} if pdl.on(device)
                      else {**kwargs, pdl.PARAM: False})
        if callable(grid) or not _ENABLED.get():
            return self.jit[grid](*args, **kwargs)
        try:
            keys, ptrs = launch_args(args)
        except TypeError:
            return self.jit[grid](*args, **kwargs)  # an argument type the key does not cover
        key = (device, tuple(kwargs.items()), *keys)
        entry = self._cache.get(key)
        if entry is None:
            return self._miss(key, grid, args, kwargs)
        return self._launch_cached(entry, grid, args, ptrs, device)

    def _launch_cached(self, entry: _Launch, grid, args: tuple, ptrs: list, device: int):
        """Launch ``entry`` (a cache hit) with ``ptrs``: ``args`` with each tensor as its data
        pointer (:func:`launch_args`)."""
        n = len(grid)
        stream = raw_stream(device)
        rt = entry.knobs  # Triton's launch hooks, read per launch as its own path does
        enter, exit_ = active_hook(rt.launch_enter_hook), active_hook(rt.launch_exit_hook)
        # the launch metadata is only handed to the hooks (a profiler's): none set, none built
        meta = (entry.compiled.launch_metadata(grid, stream, *args, *entry.tail)
                if enter is not None or exit_ is not None else None)
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        if entry.direct is not None:
            entry.direct(gx, gy, gz, stream, entry.function, *entry.flags, None, None,
                         entry.metadata, meta, enter, exit_, *ptrs, *entry.tail)
        else:
            entry.run(gx, gy, gz, stream, entry.function, entry.metadata, meta, enter, exit_,
                      *ptrs, *entry.tail)
        return entry.compiled

    def _miss(self, key: tuple, grid, args: tuple, kwargs: dict):
        compiled = self.jit[grid](*args, **kwargs)
        tail = self._tail(len(args), {k: v for k, v in kwargs.items()
                                      if k not in _LAUNCH_OPTIONS})
        if compiled is not None and tail is not None and hasattr(compiled, "packed_metadata"):
            try:
                self._cache[key] = _Launch(compiled, tail)
            except AttributeError:
                pass  # a Triton without these handles: keep its own path
        return compiled


def fast(jit_fn) -> FastKernel:
    """Wrap a ``@triton.jit`` kernel in a :class:`FastKernel` (use as a decorator above
    ``@triton.jit``)."""
    return FastKernel(jit_fn)
