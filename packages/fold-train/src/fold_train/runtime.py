"""What surrounds every forward of a run, training or evaluation: bf16 autocast and the op
backends of fold-model (``system.precision`` / ``system.ops_backend``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import nullcontext

import torch

__all__ = ["autocast", "ops_backend"]

_OPS_ENV = "FOLD_OPS_BACKEND"  # fold-model's op registry reads it on every dispatch


@contextlib.contextmanager
def ops_backend(spec: str | None) -> Iterator[None]:
    """fold-model's op backends ``spec`` (``ops_backend``) inside the block. Set through the
    registry's environment variable, not its thread-local ``use_backend``: backward, and the
    recompute of checkpointed blocks in it, runs in autograd's device threads, which see the
    environment but not another thread's selection."""
    if spec is None:
        yield
        return
    old = os.environ.get(_OPS_ENV)
    os.environ[_OPS_ENV] = spec
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_OPS_ENV, None)
        else:
            os.environ[_OPS_ENV] = old


def autocast(device: torch.device, precision: str, *, cache: bool = True):
    """bf16 autocast for ``precision="bf16"``. ``cache=False`` under CUDA Graphs: the autocast
    cache of cast weights is cleared when the context exits, so a captured graph must not read
    from it."""
    if precision != "bf16":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
