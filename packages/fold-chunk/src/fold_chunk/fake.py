"""Estimate the activation memory of eager code without running it: the code runs on
FakeTensors (shapes, dtypes and devices; no data, no memory) under the same live-tensor
accounting (:class:`~fold_chunk.memory_tracker.AllocationTracker`) that measures a real run.

:func:`fake_memory` is what :mod:`fold_chunk.trace` does for one fx graph, for any Python code
(a whole prediction with its loops): ``with fake_memory(model) as run: out = f(run.fake(x))``,
then ``run.tracker.peak``. With ``device`` (e.g. ``"cuda:0"``; FakeTensors of a CUDA device
need a CUDA build of PyTorch) the fakes of the parameters, buffers and inputs are on that device
whatever the real tensors' device: code that picks an implementation by device (fold-model's op
registry: fold-kernels' Triton kernels on CUDA, whose shape-only fakes allocate no attention
logits) is counted as it would run there, and only that device's storages are counted. The code
must not read tensor values on the host (``.item()``, ``.tolist()``, data-dependent shapes); the
result is the peak of the tensors allocated inside the block, not counting the faked inputs and
the modules' parameters and buffers.
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

    def __init__(self, mode: FakeTensorMode, tracker: AllocationTracker,
                 device: torch.device | None = None) -> None:
        self.mode = mode
        self.tracker = tracker
        self.device = device
        self._on_device: dict[int, torch.Tensor] = {}  # id(real) -> its fake on ``device``

    def _fake(self, x: torch.Tensor) -> torch.Tensor:
        if self.device is None or x.device == self.device:
            return self.mode.from_tensor(x)  # memoised: shared tensors stay shared
        f = self._on_device.get(id(x))
        if f is None:
            with self.mode:  # a fake of x's shape, strides and dtype on the target device
                f = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=self.device)
            self._on_device[id(x)] = f
        return f

    def fake(self, tree: Any) -> Any:
        """``tree`` (tensors in dicts / lists / tuples) with every tensor a FakeTensor of the
        same shape and dtype, on the same device (or the block's ``device``), registered as an
        input (never counted)."""
        def convert(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            f = self._fake(x)
            self.tracker.external.add(storage_key(f))
            return f
        return tree_map(convert, tree)


@contextlib.contextmanager
def fake_memory(*modules: nn.Module, device: torch.device | str | None = None,
                ) -> Iterator[FakeRun]:
    """A block in which new tensors are FakeTensors and the parameters and buffers of
    ``modules`` are replaced by FakeTensors (the real ones are back after the block; on
    ``device`` when given), under ``torch.no_grad()``; yields a :class:`FakeRun` (see the module
    doc)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    device = None if device is None else torch.device(device)
    # on an accelerator: count its storages only (as fold_chunk.trace does)
    tracker = AllocationTracker(device.type if device is not None and device.type != "cpu"
                                else None)
    run = FakeRun(mode, tracker, device)
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
                        f = run._fake(t)  # memoised: shared weights stay shared
                        tracker.external.add(storage_key(f))
                        store[name] = f
        with torch.no_grad(), mode, tracker:
            yield run
    finally:
        for store, name, t in reversed(saved):
            store[name] = t
