"""Communication volume per block: counted from the collectives actually issued, and the
published models it is compared with (FastFold Table 3, HelixFold Table 4).

:class:`CommRecorder` is a context manager; every collective of :mod:`fold_parallel.comm` issued
inside it (forward and backward) is recorded with the bytes *this rank sends* under the ideal
algorithm (ring all-gather / reduce-scatter / all-reduce, direct all-to-all), whatever the
backend, so that counts are comparable with the papers:

==================  =====================  =====================================
collective          input on this rank     bytes sent per rank
==================  =====================  =====================================
all_gather          shard of ``s`` bytes   ``(P - 1) s``
reduce_scatter      whole ``X`` bytes      ``(P - 1) / P X``
all_to_all          local ``X`` bytes      ``(P - 1) / P X``
all_reduce          ``X`` bytes            ``2 (P - 1) / P X``
broadcast           ``X`` bytes            ``X`` (the source)
==================  =====================  =====================================

With ``K`` the bytes of a whole activation (e.g. the pair ``N_res^2 C_z``), FastFold's Table 3
gives per all-gather ``(N-1) K / N`` and per all-to-all ``(N-1) K / N^2``, which is this table
with ``s = K / N`` and ``X = K / N``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from fold_parallel import comm as C

__all__ = [
    "CommRecord",
    "CommRecorder",
    "sent_bytes",
    "fastfold_table3",
    "HELIXFOLD_TABLE4",
]


@dataclass(frozen=True)
class CommRecord:
    op: str
    group: str
    group_size: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    impl: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    @property
    def sent(self) -> float:
        """Bytes this rank sends under the ideal algorithm (see the module table)."""
        return sent_bytes(self.op, self.nbytes, self.group_size)


def sent_bytes(op: str, nbytes: int, p: int) -> float:
    """Bytes one rank sends for collective ``op`` on its ``nbytes`` input in a group of ``p``."""
    if op == "all_gather":
        return (p - 1) * nbytes
    if op in ("reduce_scatter", "all_to_all"):
        return (p - 1) / p * nbytes
    if op == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if op == "broadcast":
        return float(nbytes)
    raise ValueError(f"unknown collective {op!r}")


class CommRecorder:
    """Records the collectives issued while active (nestable; one list per recorder)."""

    def __init__(self) -> None:
        self.records: list[CommRecord] = []

    def note(
        self, op: str, group: str, size: int, shape: tuple[int, ...], dtype: torch.dtype, impl: str
    ) -> None:
        self.records.append(CommRecord(op, group, size, shape, dtype, impl))

    def __enter__(self) -> CommRecorder:
        C._RECORDERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        C._RECORDERS.remove(self)

    def counts(self) -> dict[str, int]:
        """Number of calls per collective."""
        return dict(Counter(r.op for r in self.records))

    def sent_by_op(self) -> dict[str, float]:
        """Bytes sent per rank, per collective."""
        out: dict[str, float] = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0.0) + r.sent
        return out

    def total_sent(self) -> float:
        return sum(r.sent for r in self.records)


def fastfold_table3(k_bytes: float, n: int) -> dict[str, float]:
    """FastFold Table 3, DAP column (forward pass, per Evoformer block): bytes per device for the
    outer product mean all-gather, the two triangle-update all-gathers and the 12 transposes
    (all-to-alls, forward and backward), with ``K`` the activation size and ``N`` devices."""
    return {
        "outer_product_mean": k_bytes * (n - 1) / n,
        "triangle_update": 2 * k_bytes * (n - 1) / n,
        "transpose": 12 * k_bytes * (n - 1) / n**2,
    }


# HelixFold Table 4: collective calls per Evoformer block (forward + backward).
HELIXFOLD_TABLE4 = {
    "DAP": {
        "msa_stack": {"all_to_all": 4, "all_gather": 1, "reduce_scatter": 1},
        "pair_stack": {"all_to_all": 8, "all_gather": 4, "reduce_scatter": 4},
        "outer_product_mean": {"all_gather": 1, "reduce_scatter": 1},
        "total": 24,
    },
    "BP": {
        "msa_stack": {"broadcast": 1},
        "pair_stack": {"all_reduce": 1, "broadcast": 1},
        "outer_product_mean": {"broadcast": 1},
        "total": 4,
    },
}
