"""fold-kernels' Triton backend in the op registry for the integration tests: on a GPU as users
get it; without one, the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by the
noxfile) and the backend is told that CPU tensors are fine (it only accepts GPU tensors)."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def register_triton(monkeypatch) -> None:
    """Register the Triton backend (skip the test without a GPU or the interpreter)."""
    from fold_kernels import registration
    from fold_model import ops
    from fold_model.ops import registry

    if DEVICE == "cpu":
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            pytest.skip("needs a GPU or TRITON_INTERPRET=1")
        monkeypatch.setattr(registration, "_on_gpu", lambda *tensors: True)
    if "triton" not in ops.backends("attention"):
        registration.register(registry)
