"""A backend for tests of code that chooses or plans by backend (AutoChunk, the dry run, the
size check): :func:`attention_spy` registers the three attention ops of the contract under a
backend that runs the reference and records each call's first-argument shape, with the
output-only fake a kernel that keeps its logits in registers registers (fold-kernels'), at a
priority above every other backend."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from fold_ops.contract import OPS as CONTRACT

from fold_model.ops import registry

__all__ = ["ATTENTION_OPS", "attention_spy"]

ATTENTION_OPS = ("attention", "attention_packed", "triangle_attention")
_GATED = 6  # the position of attention_packed's ``gated``


def _spy(name: str, calls: list) -> tuple:
    ref = CONTRACT[name].reference

    def fn(*args, **kwargs):
        calls.append((name, tuple(args[0].shape)))
        return ref(*args, **kwargs)

    def fake(*args, **kwargs):  # the output only: o [*, R, H, N, D] / [*, R, N, H*D]
        x = args[0]
        if name == "attention":
            return torch.empty_like(x)
        gated = args[_GATED] if len(args) > _GATED else kwargs.get("gated", True)
        return x.new_empty((*x.shape[:-1], x.shape[-1] // (4 if gated else 3)))

    return fn, fake


@contextlib.contextmanager
def attention_spy(backend: str = "spy") -> Iterator[list[tuple[str, tuple[int, ...]]]]:
    """Inside: ``backend`` serves the attention ops; yields the ``(op, shape)`` calls list."""
    calls: list[tuple[str, tuple[int, ...]]] = []
    for name in ATTENTION_OPS:
        fn, fake = _spy(name, calls)
        registry.register(name, backend, fn, supports=lambda *a, **k: True, priority=10_000,
                          fake=fake)
    try:
        yield calls
    finally:
        for name in ATTENTION_OPS:
            registry.unregister(name, backend)
