"""PyTorch's CUDA caching allocator for prediction: expandable segments, unless the user chose.

A long prediction allocates pair-sized tensors of several sizes in turn (the extra MSA stack's,
then the Evoformer's, each chunked differently). With fixed-size segments the cache fragments:
an AF2 prediction of 4096 residues on an 80 GiB H100 failed to allocate the triangle
multiplication's 16 GiB ``[4c, N, N]`` projections with 26 GiB reserved but unallocated in
smaller pieces. Expandable segments map memory into one growing virtual range per stream, so
freed blocks coalesce. PyTorch reads the setting when CUDA's allocator starts, so it is set
before the first CUDA call of ``fold-train predict`` and never over the user's own setting.
"""

from __future__ import annotations

import os

import torch

__all__ = ["ENV_VARS", "EXPANDABLE", "prefer_expandable_segments"]

ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # 2.11 and 2.13 read both
EXPANDABLE = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` when neither allocator variable
    is set and CUDA has not started yet; returns whether it did."""
    if any(os.environ.get(v) for v in ENV_VARS) or torch.cuda.is_initialized():
        return False
    os.environ[ENV_VARS[0]] = EXPANDABLE
    return True
