"""Failure behaviour: every surviving rank gets a clear error, never a silent hang.

* :func:`check_consistent` (at startup) all-gathers a small description of each rank's
  configuration (or input shapes) and raises :class:`ConsistencyError` on *every* rank, naming the
  keys and the value each rank had, when they differ. Ranks with different DAP sizes or N_res
  would otherwise deadlock or exchange garbage inside a collective.
* :func:`guarded` wraps every collective of :mod:`fold_parallel.comm`: a failure of the backend
  (a peer that died closes its connections; a peer that stopped calling makes the wait hit the
  process group's timeout, set by :func:`fold_parallel.groups.init_distributed`) is re-raised as
  :class:`CollectiveError` saying which collective, which group and rank, and the likely causes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CollectiveError",
    "ConsistencyError",
    "guarded",
    "check_consistent",
    "check_shapes",
]


class CollectiveError(RuntimeError):
    """A collective could not complete (dead peer, timeout, or ranks out of step)."""


class ConsistencyError(RuntimeError):
    """Ranks of a group were started with different configurations or input shapes."""


@contextlib.contextmanager
def guarded(what: str | Callable[[], str], timeout_s: float | None = None) -> Iterator[None]:
    """Turn a backend failure inside the block into a :class:`CollectiveError` about ``what``
    (a string, or a callable that makes it: collectives pass a callable so that the message is
    formatted only on failure, not on every call)."""
    try:
        yield
    except (CollectiveError, ConsistencyError):
        raise
    except RuntimeError as err:  # DistBackendError and gloo/NCCL errors derive from it
        if callable(what):
            what = what()
        limit = f"{timeout_s:g} s" if timeout_s is not None else "the process group timeout"
        raise CollectiveError(
            f"rank {dist.get_rank() if dist.is_initialized() else '?'}: {what} failed: a peer "
            f"rank died, stopped calling collectives (ranks out of step), or did not answer "
            f"within {limit}. Backend said: {err}"
        ) from err


def _canonical(value: Any) -> Any:
    """A JSON-able, order-stable form of ``value`` (dataclasses, dtypes, shapes, tuples)."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: _canonical(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, torch.Size)):
        return [_canonical(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def check_consistent(
    values: Mapping[str, Any],
    group: dist.ProcessGroup | None = None,
    what: str = "configuration",
    timeout_s: float | None = None,
) -> None:
    """Raise :class:`ConsistencyError` on every rank of ``group`` unless all ranks passed equal
    ``values`` (a flat or nested mapping of config entries / shapes)."""
    mine = json.dumps(_canonical(values), sort_keys=True)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    with guarded(f"consistency check of the {what}", timeout_s):
        dist.all_gather_object(gathered, mine, group=group)
    if all(g == mine for g in gathered):
        return
    decoded = [json.loads(g) for g in gathered]
    keys = sorted({k for d in decoded for k in d})
    diffs = []
    for key in keys:
        per_rank = [d.get(key, "<missing>") for d in decoded]
        if any(v != per_rank[0] for v in per_rank):
            listing = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(per_rank))
            diffs.append(f"  {key}: {listing}")
    raise ConsistencyError(
        f"rank {dist.get_rank(group)}: the ranks of the group disagree on the {what} "
        f"(every rank of a DAP/BP group must be started with the same settings and see the same "
        f"shapes):\n" + "\n".join(diffs)
    )


def check_shapes(
    tensors: Mapping[str, torch.Tensor],
    group: dist.ProcessGroup | None = None,
    timeout_s: float | None = None,
) -> None:
    """:func:`check_consistent` on the shapes and dtypes of ``tensors``."""
    desc = {k: [list(t.shape), str(t.dtype)] for k, t in tensors.items()}
    check_consistent(desc, group, "input shapes", timeout_s)
