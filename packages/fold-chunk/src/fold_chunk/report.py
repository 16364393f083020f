"""What AutoChunk chose, in a form a person can read (``str(report)``) or a program can use."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RegionReport", "ChunkReport"]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


@dataclass
class RegionReport:
    """One chunk loop: its node range, the peak node it targets, chunk dims and sizes."""

    name: str
    first_node: str
    last_node: str
    peak_node: str
    extent: int
    chunk_size: int
    n_chunks: int
    n_chunked_nodes: int
    n_hoisted_nodes: int
    output_dims: dict[str, int]
    input_dims: dict[str, int | None]


@dataclass
class ChunkReport:
    """Budget, estimated peaks (analytic before/after, and the fake run of the generated code)
    and the regions chosen."""

    memory_budget: int
    estimated_peak_before: int
    estimated_peak_after: int
    simulated_peak_after: int
    peak_node_before: str
    regions: list[RegionReport] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"AutoChunk: budget {_mib(self.memory_budget)}, estimated peak "
            f"{_mib(self.estimated_peak_before)} (at {self.peak_node_before}) -> "
            f"{_mib(self.estimated_peak_after)} (fake run of the generated code: "
            f"{_mib(self.simulated_peak_after)}), {len(self.regions)} chunk region(s)",
        ]
        for r in self.regions:
            outs = ", ".join(f"{k}[dim {v}]" for k, v in r.output_dims.items())
            lines.append(
                f"  {r.name}: {r.first_node} .. {r.last_node} (peak node {r.peak_node}), "
                f"extent {r.extent} in {r.n_chunks} chunks of {r.chunk_size}, "
                f"{r.n_chunked_nodes} chunked / {r.n_hoisted_nodes} hoisted nodes; outputs {outs}"
            )
        return "\n".join(lines)
