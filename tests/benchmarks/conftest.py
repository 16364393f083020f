"""Smoke tests of the benchmarks on CPU (tiny sizes, gloo for the multi-rank ones): each imports
its script as a module of the ``benchmarks`` package, as ``python -m benchmarks.<suite>.<name>``
runs it, and checks what it writes. The packages' own tests do not depend on benchmarks/."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # the benchmarks package
# _dist.run_ranks (fold-parallel's test helper) starts the gloo ranks of the parallel smoke runs
sys.path.append(str(REPO / "packages" / "fold-parallel" / "tests"))

# One intra-op thread: tiny models on a shared CI machine.
torch.set_num_threads(1)
