"""Bytes that autograd saves for backward while a function runs (for the memory columns of the
AF3 benchmarks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def saved_bytes(fn: Callable[[], Any], keep: list[torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves while ``fn()`` runs, counting each storage once and
    leaving out those of ``keep`` (inputs, parameters: resident anyway). Meta tensors have no
    storage address: each is counted by its size."""
    seen = {t.untyped_storage().data_ptr() for t in keep if t.device.type != "meta"}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.device.type == "meta":
            total += t.numel() * t.element_size()
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return total
