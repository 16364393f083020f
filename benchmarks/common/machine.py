"""What a benchmark records about the machine it ran on: the device, the software versions and
the date; for the CPU-bound data benchmarks, the host's CPU and core counts. Each script chooses
the keys it writes (unchanged from when every script collected them itself); the values come
from here."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import torch


def device_name(device: torch.device | str | None = None) -> str:
    """The CUDA device's name, or ``"cpu"``. ``None``: the current CUDA device."""
    if device is None:
        return torch.cuda.get_device_name()
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def triton_version() -> str | None:
    """Triton's version, or None where Triton is not installed."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def versions(device: torch.device) -> dict:
    """Device name, torch and triton versions and the date (minutes) of this run."""
    return {"device": device_name(device), "torch": torch.__version__,
            "triton": triton_version(),
            "date": datetime.datetime.now().isoformat(timespec="minutes")}


def parse_cpus(spec: str) -> list[int]:
    """CPU numbers from ``"2"``, ``"2,3"`` or ``"0-3,8"`` (taskset's list form)."""
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ValueError(f"CPU list {spec!r}: {part!r} is not a number or a range") from None
        if first < 0 or last < first:
            raise ValueError(f"CPU list {spec!r}: bad range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def pin_cpus(spec: str | None) -> list[int] | None:
    """Pin this thread, and the threads it starts afterwards (the CUDA driver's, the autograd
    engine's device thread that runs the backward), to the CPUs of ``spec``; call it before
    CUDA is initialised. Returns the CPUs now allowed (None, pinning nothing, for a None
    ``spec``: ``--pin-cpu`` not given). An eager step bound by host time moves by 1.5x or more
    between runs with its threads free to migrate (results/model/model_peers_h200_pinning.md);
    contenders of one process share the pinning."""
    if spec is None:
        return None
    cpus = parse_cpus(spec)
    allowed = os.sched_getaffinity(0)
    if not set(cpus) <= allowed:
        raise ValueError(f"CPU list {spec!r}: this process may run on {sorted(allowed)} only")
    os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))


def add_pin_argument(ap) -> None:
    """``--pin-cpu CPUS`` on an argparse parser (see :func:`pin_cpus`)."""
    ap.add_argument("--pin-cpu", default=None, metavar="CPUS",
                    help="pin the process's threads to these CPUs (taskset's list form, e.g. "
                         "'2' or '0-3') before CUDA starts: eager steps bound by host time vary "
                         "far less (results/model/model_peers_h200_pinning.md)")


def pin_note(pinned: list[int] | None) -> str:
    """How a result's CPUs were pinned, for its Markdown (:func:`pin_cpus`' return value)."""
    return f"CPUs pinned to {pinned}." if pinned else "CPUs not pinned."


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


def host_info() -> dict:
    """CPU model, core counts, OS, software versions and today's date (the data benchmarks)."""
    import numpy as np

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("fold_data", "torch", "gemmi"):
        try:
            found[mod] = __import__(mod).__version__
        except ImportError:
            found[mod] = None
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "os": platform.platform(),
        "versions": found,
        "date": datetime.date.today().isoformat(),
    }
