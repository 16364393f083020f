"""AutoChunk for prediction (FastFold 5.3): the Evoformer and extra MSA stacks of a trained
AlphaFold2 run as ``fold_chunk.autochunk`` code that fits a memory budget.

A stack's inputs are only known once the features are (``N_clust + N_templ`` MSA rows,
``N_extra``, ``N_res``), so :class:`AutoChunkedStack` plans on its first call, with the real
inputs as the example, and reuses the plan for every recycling pass (fold-chunk caches plans per
input signature). The budget is in activation bytes of one stack call (what fold-chunk
estimates: tensors allocated during the call, not its inputs or the weights), given in bytes or
``"auto"``: 90% of the memory free on the device when the stack is first called (the inputs and
the weights are already allocated then; the rest is margin for allocator fragmentation).

The traced stacks hold fold-model's ops as leaf nodes that dispatch when the generated code runs
(``fold_model.ops.leaves``): on a GPU the chunk loops call fold-kernels' Triton kernels, and the
plan counts what those kernels allocate (their shape-only fakes), not the PyTorch reference's
attention logits.

Inference only: the stacks must run in eval mode under ``torch.no_grad()`` (fold-chunk's
chunk loops keep no autograd graph, and dropout would draw different masks per chunk).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

__all__ = ["AUTO", "AutoChunkedStack", "autochunk_summary", "available_memory",
           "enable_autochunk",
           "parse_memory_budget"]

AUTO = "auto"
Budget = int | Literal["auto"]
_AUTO_FRACTION = 0.9
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "ki": 2**10, "mi": 2**20,
          "gi": 2**30}


def parse_memory_budget(text: str) -> Budget:
    """``"auto"``, a byte count (``"1500000"``, ``"1.5e6"``) or a size with a unit
    (``"512MiB"``, ``"2GB"``, ``"2 GiB"``) -> bytes or ``"auto"``; ValueError otherwise."""
    t = text.strip().lower()
    if t == AUTO:
        return AUTO
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)", t)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"memory budget {text!r}: expected 'auto', a number of bytes or a size "
                         "such as 512MiB / 2GB / 1.5GiB")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value < 1:
        raise ValueError(f"memory budget {text!r}: expected at least 1 byte")
    return int(value)


def available_memory(device: torch.device | str) -> int:
    """Bytes free for new allocations on ``device``: on CUDA the driver's free memory plus what
    PyTorch's caching allocator holds unused (reserved, not allocated: the blocks a stack that
    ran before left cached, which the next allocation reuses); else the host's available memory
    (``MemAvailable`` of ``/proc/meminfo``, else free pages).

    The cached part matters for the second stack planned in a prediction: after the extra MSA
    stack, the driver alone reported 3.5 GiB free on an 80 GiB H100 at 3072 residues, all but a
    few GiB of the rest being that stack's cached activations."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device.index)  # None: the current device
        cached = torch.cuda.memory_reserved(device.index) - torch.cuda.memory_allocated(
            device.index)
        return int(free) + max(int(cached), 0)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class AutoChunkedStack(nn.Module):
    """``stack`` run through ``fold_chunk.autochunk`` at ``memory_budget`` bytes (or ``"auto"``),
    planned on the first call. Same signature and outputs as ``stack``; ``report`` is the
    fold-chunk ``ChunkReport`` of the plan (None before the first call)."""

    def __init__(self, stack: nn.Module, memory_budget: Budget, *, min_chunk: int = 1) -> None:
        super().__init__()
        if memory_budget != AUTO and (not isinstance(memory_budget, int) or memory_budget < 0):
            raise ValueError(f"memory_budget must be bytes >= 0 or 'auto', got {memory_budget!r}")
        self.stack = stack
        self.memory_budget = memory_budget
        self.min_chunk = min_chunk
        self._chunked: nn.Module | None = None

    def set_chunk_size(self, chunk_size: int | None) -> None:
        """``AlphaFold2.set_chunk_size`` passes through here: only ``None`` fits AutoChunk."""
        if chunk_size is not None:
            raise ValueError("AutoChunk and the manual chunk size are alternatives")
        self.stack.set_chunk_size(None)

    @property
    def report(self) -> Any:
        return None if self._chunked is None else self._chunked.report

    def _budget(self, device: torch.device) -> int:
        if self.memory_budget == AUTO:
            return int(available_memory(device) * _AUTO_FRACTION)
        return int(self.memory_budget)

    def forward(self, *inputs: torch.Tensor) -> Any:
        if self.training or torch.is_grad_enabled():
            raise RuntimeError("AutoChunk is for inference: call the model in eval mode under "
                               "torch.no_grad() (training keeps autograd graphs and dropout)")
        if self._chunked is None:
            import fold_chunk

            device = next(x.device for x in inputs if isinstance(x, torch.Tensor))
            self._chunked = fold_chunk.autochunk(self.stack, inputs, self._budget(device),
                                                 min_chunk=self.min_chunk)
        return self._chunked(*inputs)


def enable_autochunk(model: nn.Module, memory_budget: Budget, *, min_chunk: int = 1,
                     names: Sequence[str] = ("evoformer", "extra_msa_stack"),
                     ) -> list[AutoChunkedStack]:
    """Replace the stacks ``model.<name>`` of ``names`` (when present; a name may be a dotted
    path such as ``diffusion.transformer``; default: the Evoformer and extra MSA stack of a
    fold-model ``AlphaFold2``) by :class:`AutoChunkedStack` wrappers (each with its own
    ``memory_budget``);
    returns the wrappers (their ``report`` after the first prediction). Load the weights
    first: the wrapped stacks' state-dict keys gain a ``.stack`` level."""
    if getattr(model, "chunk_size", None):
        raise ValueError("AutoChunk and the manual chunk size are alternatives: set the chunk "
                         "size to None first")
    wrappers = []
    for name in names:
        parent_path, _, attr = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_path)
        except AttributeError:  # a part the model was built without
            continue
        stack = getattr(parent, attr, None)
        if stack is None:
            continue
        if isinstance(stack, AutoChunkedStack):
            raise ValueError(f"model.{name} is already AutoChunked")
        wrapper = AutoChunkedStack(stack, memory_budget, min_chunk=min_chunk)
        wrapper.train(stack.training)
        setattr(parent, attr, wrapper)  # nn.Module.__setattr__ re-registers the submodule
        wrappers.append(wrapper)
    if not wrappers:
        raise ValueError(f"{type(model).__name__} has no {' / '.join(names)} to chunk")
    return wrappers


def autochunk_summary(autochunked: dict) -> dict:
    """``{stack: {budget, estimated peaks, regions}}`` of the AutoChunk plans in
    ``Parallelized.autochunked`` (a stack's plan is made on its first call: an unplanned stack
    is left out), for a prediction's printed summary."""
    return {stack: {"budget_bytes": w.report.memory_budget,
                    "estimated_peak_before": w.report.estimated_peak_before,
                    "estimated_peak_after": w.report.simulated_peak_after,
                    "regions": len(w.report.regions)}
            for stack, w in autochunked.items() if w.report is not None}
