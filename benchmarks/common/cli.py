"""Command-line checks that several benchmarks share: the device asked for, a list of row names
against the rows a script knows, and an A/B switch ``NAME=OFF,ON``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

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
