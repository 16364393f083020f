"""Programmatic dependent launch (PDL): a kernel's launch overlaps the end of the one before it.

On Hopper and later NVIDIA GPUs, a kernel launched with the programmatic-stream-serialization
attribute may be scheduled before the previous kernel in its stream has finished; it must then
wait (``griddepcontrol.wait``) before it touches memory, which returns once every earlier kernel
has completed and its writes are visible. The previous kernel lets its dependents be scheduled
with ``griddepcontrol.launch_dependents``. What is saved is the gap between two kernels: the
dependent's launch and its programs' scheduling run while the previous kernel's last programs
finish. On an H200, in a CUDA graph of 100 dependent copy kernels, that was 0.4 us per kernel for
small kernels (1.2 -> 0.8 us) and 0.2-0.6 us for 8-32 MB ones. Replays of an AF3 Pairformer step
at 256 tokens (about 250 launches) and of an AF2 Evoformer step at (128, 256) were 1.4% and 1.0%
faster (benchmarks/results/tools/pdl_h200.md).

Every fold-kernels kernel takes a ``PDL: tl.constexpr`` parameter and calls :func:`enter` first,
before any load or store: with ``PDL`` it waits, then releases its own dependents (all of this
kernel's programs are resident or done when the release takes effect, so the early release costs
the kernel nothing). :class:`fold_kernels.launch.FastKernel` passes ``PDL`` and Triton's
``launch_pdl`` option to every kernel that has the parameter where :func:`active` holds:
NVIDIA sm_90 and later, not under the interpreter, and not with ``FOLD_KERNELS_PDL=0``.
Elsewhere ``PDL`` is False and the kernel compiles without the instructions.

Kernels of other libraries (cuBLAS, PyTorch) are launched without the attribute, so the stream
orders them as always; a fold kernel after one of them waits for it like any other.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fold_ops.env import EnvVar

from fold_kernels.tuning import arch, interpreting

__all__ = ["enter", "active", "on", "PARAM"]

PARAM = "PDL"  # the constexpr parameter name the launcher looks for

_ENABLED = EnvVar("FOLD_KERNELS_PDL", lambda v: (v if v is not None else "1") != "0")
_CAPABLE: dict[int, bool] = {}


def _capable(index: int) -> bool:
    """The device at ``index`` is an NVIDIA GPU of compute capability 9.0 or later."""
    ok = _CAPABLE.get(index)
    if ok is None:
        name = arch(torch.device("cuda", index))
        ok = _CAPABLE[index] = (torch.version.hip is None and name.startswith("sm")
                                and int(name[2:]) >= 90)
    return ok


def active(index: int) -> bool:
    """Kernels launched now on device ``index`` use programmatic dependent launch."""
    return not interpreting() and on(index)


def on(index: int) -> bool:
    """:func:`active` for a caller that knows it is not under the interpreter (the launcher)."""
    return _ENABLED.get() and _capable(index)


try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton built without its NVIDIA backend (ROCm): PDL is never on
    gdc_wait = gdc_launch_dependents = None

if gdc_wait is not None:
    @triton.jit
    def enter(PDL: tl.constexpr):
        """A kernel's first statement: with ``PDL``, wait for the kernels before it, then let
        the next one be scheduled. Without it, nothing (the interpreter and pre-Hopper GPUs
        never see the instructions)."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
else:
    @triton.jit
    def enter(PDL: tl.constexpr):
        """Nothing: this Triton cannot emit the NVIDIA instructions (and PDL is never on)."""
        pass
