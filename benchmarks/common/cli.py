"""Command-line checks that several benchmarks share: the device asked for, a list of row names
against the rows a script knows, an A/B switch ``NAME=OFF,ON`` and the A/B tools' options."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch


def device_arg(name: str, script: str) -> torch.device:
    """``torch.device(name)``, refused with ``SystemExit`` when it is CUDA and none is here."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{script}: --device cuda requested but CUDA is not available")
    return device


def rows_arg(text: str, known: Iterable[str], script: str, option: str = "--rows") -> list[str]:
    """The comma-separated row names of ``text`` (blanks dropped), refused with ``SystemExit``
    naming those not in ``known``."""
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(known))
    if unknown:
        raise SystemExit(f"{script}: unknown rows in {option} {unknown}")
    return rows


def add_ab_options(ap, reps: int, calls: int | None = None, smoke: bool = False) -> None:
    """The options of an A/B tool: ``--rounds`` (alternating), ``--reps`` (calls a round's
    median takes), ``--calls`` (back-to-back calls a replay holds, when ``calls`` is given),
    ``--device`` (with ``smoke``: cpu runs under TRITON_INTERPRET=1) and ``--out``."""
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=reps)
    if calls is not None:
        ap.add_argument("--calls", type=int, default=calls)
    if smoke:
        ap.add_argument("--device", default="cuda",
                        help="cpu: a smoke run under TRITON_INTERPRET=1 (wall-clock, no graphs)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside it)")


def parse_switch(text: str) -> tuple[str, tuple[str, str]]:
    """``NAME=OFF,ON`` -> ``(NAME, (OFF, ON))``."""
    name, sep, values = text.partition("=")
    parts = values.split(",")
    if not sep or not name or len(parts) != 2 or not all(parts):
        raise SystemExit(f"the switch must read NAME=OFF,ON, got {text!r}")
    return name, (parts[0], parts[1])


@contextlib.contextmanager
def switch_restored(name: str) -> Iterator[None]:
    """An A/B tool sets the switch ``name`` while it measures; on leaving, the variable is back to
    what it was (unset if it was unset)."""
    previous = os.environ.get(name)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
