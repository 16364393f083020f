"""``activation_checkpointing=auto``: checkpoint only the blocks that do not fit in memory.

Activation checkpointing (AF2 supplement 1.11.8) recomputes every block's forward in backward:
about a third more compute, for a fraction of the memory. Where the device has room, some blocks
can keep their activations instead. This module plans how many, from the device's memory:

1. with every block of the model's checkpointed stacks recomputed, one step's memory ``M_0``;
2. per stack, with ``probe`` of its last blocks exempt, ``M_probe``: the bytes one exempt block
   keeps are ``b = (M_probe - M_0) / probe`` (a stack's blocks all save the same tensors);
3. greedily, stack by stack in the model's order (the most recompute saved per byte first: AF2
   the Evoformer, then the extra MSA stack; AF3 the Pairformer, then the diffusion transformer),
   as many blocks as fit in ``budget - M_0``;
4. one step with the plan, which must fit the budget and not run out of memory; otherwise the
   counts are scaled down by the measured overshoot (halved after an out-of-memory error) and
   the step tried again.

"Memory" comes from a :class:`MemorySource`: :class:`CudaMemory` (the step's peak allocated
bytes, against a fraction of the memory this process can use) on a GPU, or
:class:`SavedTensorMemory` (the bytes autograd saves during the step, against a given budget:
device independent, what the CPU tests use). The model supplies ``checkpointed_stacks()``,
``uncheckpointed_blocks()`` and ``set_uncheckpointed_blocks(**counts)`` (fold-model's
``AlphaFold2`` and ``AlphaFold3``).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

__all__ = ["CheckpointPlan", "CudaMemory", "MemorySource", "SavedTensorMemory",
           "choose_uncheckpointed", "plan_checkpointing"]

_MIB = 2**20


class MemorySource(Protocol):
    """Where a plan's numbers come from."""

    def budget(self) -> int:
        """Bytes a step may use (what :meth:`measure` must stay under)."""

    def measure(self, step: Callable[[], Any]) -> int:
        """Run ``step()`` once and return the bytes it used (raises ``OutOfMemoryError`` when it
        does not fit)."""


class CudaMemory:
    """A CUDA device: :meth:`measure` is the step's peak allocated bytes; :meth:`budget` is
    ``fraction`` of the memory this process can use (free on the device plus what its caching
    allocator already holds), taken when the plan starts. The rest is headroom: CUDA graphs' private
    pools, fragmentation, the data of the next step."""

    def __init__(self, device: torch.device | str, fraction: float) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.device = torch.device(device)
        self.fraction = fraction
        self._budget: int | None = None

    def budget(self) -> int:
        if self._budget is None:
            free, _ = torch.cuda.mem_get_info(self.device)
            usable = free + torch.cuda.memory_reserved(self.device)
            self._budget = int(self.fraction * usable)
        return self._budget

    def measure(self, step: Callable[[], Any]) -> int:
        self.budget()  # before the first probe grows the cache
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        step()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))


class SavedTensorMemory:
    """Bytes that autograd saves for backward while ``step()`` runs (each storage once), against
    a fixed ``budget_bytes``. Blocks under non-reentrant checkpointing save only their inputs
    through their own hooks, so exempting a block adds exactly its saved activations: the plan's
    arithmetic on any device, without an allocator to ask."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)

    def budget(self) -> int:
        return self.budget_bytes

    def measure(self, step: Callable[[], Any]) -> int:
        seen: set[int] = set()
        # the counted storages stay referenced until the step ends: a storage freed early (a
        # branch of the graph dropped in forward) cannot lend its address to a later one,
        # which would then be taken for the same storage and not counted
        alive: list[torch.UntypedStorage] = []
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                alive.append(storage)
                total += storage.nbytes()
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                step()
        finally:
            alive.clear()
        return total


@dataclasses.dataclass
class CheckpointPlan:
    """A plan: ``uncheckpointed[stack]`` last blocks of each stack run without checkpointing.

    ``base_bytes``: the step with every block checkpointed; ``per_block_bytes[stack]``: what one
    exempt block adds; ``budget_bytes``: the limit; ``tried``: the counts tried in step 4 with
    their measured bytes (None: out of memory); ``final_bytes``: the accepted plan's."""

    uncheckpointed: dict[str, int]
    blocks: dict[str, int]
    base_bytes: int
    per_block_bytes: dict[str, float]
    budget_bytes: int
    tried: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    final_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers in MiB (for logs and benchmark tables)."""
        out: dict[str, Any] = {"budget_mib": self.budget_bytes / _MIB,
                               "base_mib": self.base_bytes / _MIB,
                               "headroom_mib": (self.budget_bytes - self.base_bytes) / _MIB,
                               "final_mib": None if self.final_bytes is None
                               else self.final_bytes / _MIB, "tried": self.tried}
        for name, n in self.blocks.items():
            out[f"{name}_blocks"] = n
            out[f"{name}_block_mib"] = self.per_block_bytes[name] / _MIB
            out[f"no_ckpt_{name}"] = self.uncheckpointed[name]
        return out

    def describe(self) -> str:
        parts = ", ".join(f"{k} of {self.blocks[n]} {n} blocks" for n, k in
                          self.uncheckpointed.items())
        return (f"activation_checkpointing=auto: without checkpointing the last {parts or '-'} "
                f"(budget {self.budget_bytes / _MIB:.0f} MiB, fully checkpointed step "
                f"{self.base_bytes / _MIB:.0f} MiB)")


def choose_uncheckpointed(stacks: Sequence[tuple[str, int, float]], base_bytes: int,
                          budget_bytes: int) -> dict[str, int]:
    """Greedy choice: for ``(name, blocks, bytes per exempt block)`` in order, as many blocks
    as fit in ``budget_bytes - base_bytes``, the rest of that room passed to the next stack."""
    room = max(0, budget_bytes - base_bytes)
    out = {}
    for name, blocks, per_block in stacks:
        per_block = max(per_block, 1.0)
        k = 0 if per_block == float("inf") else min(blocks, int(room // per_block))
        out[name] = k
        if k:
            room -= k * per_block
    return out


def _free(device_type: str) -> None:
    gc.collect()
    if device_type == "cuda":
        torch.cuda.empty_cache()


def _fewer(counts: dict[str, int], used: int | None, base: int, budget: int) -> dict[str, int]:
    """The counts to try after ``counts`` did not fit: scaled by the room over what the step
    measured above the fully checkpointed one (the probes' per-block bytes were an estimate; the
    measured overshoot tells by how much), at least one block fewer per stack; halved after an
    out-of-memory error, which says nothing about by how much."""
    if used is None or used <= base:
        return {name: k // 2 for name, k in counts.items()}
    scale = max(0, budget - base) / (used - base)
    return {name: min(k - 1, int(k * scale)) if k else 0 for name, k in counts.items()}


def plan_checkpointing(model: torch.nn.Module, step: Callable[[], Any], memory: MemorySource,
                       *, device_type: str = "cuda") -> CheckpointPlan:
    """Plan (and set on ``model``) how many of each checkpointed stack's last blocks run without
    checkpointing. ``step()`` runs one forward + backward of the model (the caller makes it
    leave no state behind: gradients zeroed, RNG restored). See the module docstring."""
    stacks: Mapping[str, int] = model.checkpointed_stacks()
    model.set_uncheckpointed_blocks(**{name: 0 for name in stacks})
    base = memory.measure(step)
    budget = memory.budget()
    per_block: dict[str, float] = {}
    for name, n in stacks.items():
        probe = max(1, n // 12)
        model.set_uncheckpointed_blocks(**{name: probe})
        try:
            used = memory.measure(step)
        except torch.cuda.OutOfMemoryError:
            used = None  # not even the probe fits: this stack stays checkpointed
        finally:
            model.set_uncheckpointed_blocks(**{name: 0})
        if used is None:
            _free(device_type)
            per_block[name] = float("inf")
        else:
            per_block[name] = max((used - base) / probe, 1.0)
    counts = choose_uncheckpointed([(n, stacks[n], per_block[n]) for n in stacks], base, budget)
    plan = CheckpointPlan(uncheckpointed=dict(counts), blocks=dict(stacks), base_bytes=base,
                          per_block_bytes=per_block, budget_bytes=budget)
    while True:
        model.set_uncheckpointed_blocks(**counts)
        if not any(counts.values()):
            plan.final_bytes = base
            break
        oom = False
        try:
            used = memory.measure(step)
        except torch.cuda.OutOfMemoryError:
            oom, used = True, None
        if oom:
            _free(device_type)  # outside the except block: its traceback held the step's tensors
        plan.tried.append({**counts, "mib": None if used is None else used / _MIB})
        if used is not None and used <= budget:
            plan.final_bytes = used
            break
        counts = _fewer(counts, used, base, budget)
    plan.uncheckpointed = dict(counts)
    return plan
