"""What every benchmark writes with its results: the machine and software versions, and files
written atomically (a reader sees the old or the new file, never half of one)."""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path

import torch


def versions(device: torch.device) -> dict:
    """Device name, torch and triton versions and the date (minutes) of this run."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton_version,
            "date": datetime.datetime.now().isoformat(timespec="minutes")}


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
