"""Estimate the activation memory of eager code without running it: the code runs on
FakeTensors (shapes, dtypes and devices; no data, no memory) under the same live-tensor
accounting (:class:`~fold_chunk.memory_tracker.AllocationTracker`) that measures a real run.

:func:`fake_memory` is what :mod:`fold_chunk.trace` does for one fx graph, for any Python code
(a whole prediction with its loops): ``with fake_memory(model) as run: out = f(run.fake(x))``,
then ``run.tracker.peak``. The code must not read tensor values on the host (``.item()``,
``.tolist()``, data-dependent shapes); the result is the peak of the tensors allocated inside
the block, not counting the faked inputs and the modules' parameters and buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from fold_chunk.memory_tracker import AllocationTracker, storage_key

__all__ = ["FakeRun", "fake_memory"]


class FakeRun:
    """The state of a :func:`fake_memory` block: ``tracker`` (live / peak bytes) and
    :meth:`fake` (FakeTensor copies of inputs, not counted as allocations)."""

    def __init__(self, mode: FakeTensorMode, tracker: AllocationTracker) -> None:
        self.mode = mode
        self.tracker = tracker

    def fake(self, tree: Any) -> Any:
        """``tree`` (tensors in dicts / lists / tuples) with every tensor a FakeTensor of the
        same shape, dtype and device, registered as an input (never counted)."""
        def convert(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            f = self.mode.from_tensor(x)
            self.tracker.external.add(storage_key(f))
            return f
        return tree_map(convert, tree)


@contextlib.contextmanager
def fake_memory(*modules: nn.Module) -> Iterator[FakeRun]:
    """A block in which new tensors are FakeTensors and the parameters and buffers of
    ``modules`` are replaced by FakeTensors (the real ones are back after the block), under
    ``torch.no_grad()``; yields a :class:`FakeRun` (see the module doc)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = AllocationTracker()
    saved: list[tuple[dict, str, torch.Tensor]] = []
    try:
        seen: set[int] = set()
        for root in modules:
            for mod in root.modules():
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
                for store in (mod._parameters, mod._buffers):
                    for name, t in list(store.items()):
                        if t is None:
                            continue
                        saved.append((store, name, t))
                        f = mode.from_tensor(t)  # memoised: shared weights stay shared
                        tracker.external.add(storage_key(f))
                        store[name] = f
        with torch.no_grad(), mode, tracker:
            yield FakeRun(mode, tracker)
    finally:
        for store, name, t in reversed(saved):
            store[name] = t
