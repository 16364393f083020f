"""The cached-launch A/B (benchmarks/tools/launch_ab.py) times real launches: without a CUDA
device it stops with a message. Its GPU run is benchmarks/results/tools/launch_ab_h200.md."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the A/B runs here")
def test_launch_ab_refuses_without_a_device():
    from benchmarks.tools import launch_ab

    with pytest.raises(SystemExit, match="no CUDA device"):
        launch_ab.main([])
