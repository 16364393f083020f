"""Whether a model is being traced (torch.fx: AutoChunk) or captured (torch.compile): while fx
traces, fold-model's registry records each op as one leaf node that dispatches when the graph
runs; while torch.compile captures, kernel backends decline and the reference is compiled."""

from __future__ import annotations

import torch

__all__ = ["fx_tracing", "compiling"]

_FX: list = []  # [is_fx_symbolic_tracing or None, the _symbolic_trace module], bound once
_COMPILING: list = []  # [torch.compiler.is_compiling or None], bound once


def fx_tracing() -> bool:
    """True while ``torch.fx.symbolic_trace`` runs."""
    if not _FX:
        from torch.fx import _symbolic_trace

        _FX[:] = [getattr(_symbolic_trace, "is_fx_symbolic_tracing", None), _symbolic_trace]
    check, module = _FX
    # is_fx_symbolic_tracing where it exists (is_fx_tracing logs a warning on every call in
    # newer PyTorch); the module's flag otherwise.
    if check is not None:
        return bool(check())
    return bool(getattr(module, "_is_fx_tracing_flag", False))


def compiling() -> bool:
    """True while torch.compile (dynamo) captures the code."""
    if not _COMPILING:
        _COMPILING.append(getattr(getattr(torch, "compiler", None), "is_compiling", None))
    check = _COMPILING[0]
    return bool(check is not None and check())
