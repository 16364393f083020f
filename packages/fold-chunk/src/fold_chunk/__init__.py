"""fold-chunk: AutoChunk, automatic chunking of traceable PyTorch modules within a memory budget
(FastFold, section 5.3 and Algorithm 1)."""

from fold_chunk.api import (
    AutoChunked,
    ChunkPlanner,
    MemoryBudgetError,
    autochunk,
    estimate_peak_memory,
    smallest_reachable_peak,
)
from fold_chunk.fake import FakeRun, fake_memory
from fold_chunk.memory_tracker import AllocationTracker, measure_peak_memory
from fold_chunk.report import ChunkReport, RegionReport

__version__ = "0.1.0"

__all__ = [
    "autochunk",
    "estimate_peak_memory",
    "smallest_reachable_peak",
    "measure_peak_memory",
    "fake_memory",
    "FakeRun",
    "AutoChunked",
    "ChunkPlanner",
    "MemoryBudgetError",
    "AllocationTracker",
    "ChunkReport",
    "RegionReport",
]
