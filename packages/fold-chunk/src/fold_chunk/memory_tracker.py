"""Live-tensor accounting by storage: the method behind both the estimate and the measurement.

:class:`AllocationTracker` is a ``TorchDispatchMode`` that sees every aten op (after composite
ops are decomposed, so the copies that ``matmul``/``einsum``/``reshape`` make are seen too). Each
storage an op returns that no input of the op shares is a new allocation of
``storage.nbytes()``; it stays live while any Python tensor that references it is alive (a
``weakref.finalize`` per tensor decrements a reference count). Storages made outside the mode
(inputs, parameters) are never counted, so the numbers are activation bytes.

The same tracker runs on real tensors (a measured peak; CPU or CUDA) and on FakeTensors (the
estimate in :mod:`fold_chunk.trace`). Allocations inside a kernel that never become tensors
(workspaces) are invisible to both; they are small next to the activations chunking targets.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["AllocationTracker", "storage_key", "measure_peak_memory"]


def storage_key(t: torch.Tensor) -> int:
    """An id of the storage behind ``t``, shared by all its views."""
    return StorageWeakRef(t.untyped_storage()).cdata


class AllocationTracker(TorchDispatchMode):
    """Counts live bytes of the storages allocated while the mode is active.

    ``live``: bytes live now; ``peak``: the most ever seen; ``window_peak``: the most seen since
    :meth:`reset_window`; ``new_keys``: keys of the storages allocated since then.
    ``device_type`` (e.g. ``"cuda"``): count only storages on devices of that type (a module
    that keeps tensors in host memory on purpose, such as an offloaded MSA, is planned for the
    device's memory); None counts every storage.
    """

    def __init__(self, device_type: str | None = None) -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.window_peak = 0
        self.sizes: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.new_keys: list[int] = []
        self.external: set[int] = set()  # storages made outside the mode (inputs, parameters)

    def reset_window(self) -> None:
        self.window_peak = self.live
        self.new_keys = []

    def _release(self, key: int) -> None:
        count = self.refs.get(key)
        if count is None:
            return
        if count <= 1:
            del self.refs[key]
            self.live -= self.sizes.pop(key)
        else:
            self.refs[key] = count - 1

    def _track(self, t: torch.Tensor, input_keys: set[int]) -> None:
        key = storage_key(t)
        if key not in self.refs:
            if key in input_keys or key in self.external:  # view/in-place of an external one
                return
            if self.device_type is not None and t.device.type != self.device_type:
                return  # another device's memory (host copies of an offloaded tensor)
            self.refs[key] = 0
            self.sizes[key] = t.untyped_storage().nbytes()
            self.live += self.sizes[key]
            self.peak = max(self.peak, self.live)
            self.window_peak = max(self.window_peak, self.live)
            self.new_keys.append(key)
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        input_keys = {storage_key(a) for a in flat_in}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, input_keys)
        return out


def measure_peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Run ``fn(*args, **kwargs)`` under :class:`AllocationTracker` and return its peak live
    bytes of tensors allocated during the call (the returned outputs included; inputs and
    parameters excluded). Works on real tensors on any device; used by the tests on CPU."""
    tracker = AllocationTracker()
    with tracker:
        out = fn(*args, **kwargs)
    del out
    return tracker.peak
