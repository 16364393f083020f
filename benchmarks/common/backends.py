"""Which op backends a benchmark really times.

fold-kernels registers its Triton ops with fold-model through an entry point, which exists only
when the package is installed. From a source tree on ``PYTHONPATH`` it is missing and the
``auto`` backend quietly falls back to the torch reference, so a row labelled ``auto`` would time
the reference under the kernels' name. ``ensure_kernels`` registers fold-kernels directly in that
case and, on CUDA, refuses to go on when the Triton backend is still not there. The CPU tools
(op census, host overhead) also let fold-kernels' ops accept CPU tensors in Triton's interpreter.
"""

from __future__ import annotations

import torch


def ensure_kernels(device: torch.device | str, needed: bool = True) -> list[str]:
    """Make fold-kernels' backend available to fold-model's registry; return the backends that
    serve ``attention`` (highest priority first), for the benchmark's metadata.

    Raises ``SystemExit`` on a CUDA device when ``needed`` and the Triton backend cannot be
    registered (fold-kernels or Triton missing)."""
    from fold_model import ops

    if "triton" not in ops.backends("attention"):
        try:
            from fold_kernels import registration
            from fold_model.ops import registry
        except ImportError:
            pass  # no fold-kernels or no triton: checked below
        else:
            registration.register(registry)
    found = ops.backends("attention")
    if needed and torch.device(device).type == "cuda" and "triton" not in found:
        raise SystemExit(
            "fold-kernels' Triton backend is not registered with fold-model (backends of "
            f"'attention': {found}); install the packages (pip install --no-deps "
            "packages/fold-kernels ...) or put fold-kernels and triton on the path: the 'auto' "
            "rows would otherwise time the torch reference")
    return found


def allow_cpu_in_interpreter() -> None:
    """Let fold-kernels' ``supports`` accept CPU tensors under TRITON_INTERPRET=1 (the CPU tools
    op_census and host_overhead only: the registered predicates refuse CPU tensors everywhere
    else)."""
    from fold_kernels import registration, tuning

    if not tuning.interpreting():
        return

    def on_device(*tensors) -> bool:
        return all(t is None or isinstance(t, torch.Tensor) for t in tensors)

    registration._on_gpu = on_device
