"""The one writer of benchmark results: files written atomically, so a reader (or a run killed
mid-write) sees the old complete file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"  # one folder per suite: results/<suite>/


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (parent folders made) through a temporary file in the same
    folder, flushed to disk, and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_result(path: Path, doc: dict, markdown: str, *, indent: int = 1) -> None:
    """A benchmark's result: ``doc`` as JSON at ``path`` and its ``markdown`` table beside it
    (``path`` with suffix ``.md``), each written atomically."""
    path = Path(path)
    write_atomic(path, json.dumps(doc, indent=indent) + "\n")
    write_atomic(path.with_suffix(".md"), markdown)


def rounds_cell(values, fmt: str = "") -> str:
    """A Markdown cell of a setting's rounds in order, ``1.23 / 1.21 / 1.25``."""
    return " / ".join(format(v, fmt) for v in values)


def publish(out: Path | None, meta: dict, rows: list[dict], markdown: str) -> None:
    """A tool's ending: its ``markdown`` printed and, with ``out``, ``{**meta, "rows": rows}``
    written there with the markdown beside it (:func:`write_result`)."""
    print(markdown)
    if out is not None:
        write_result(out, {**meta, "rows": rows}, markdown)


def merged_rows(paths: list) -> tuple[list[dict], set[str]]:
    """The ``rows`` of several JSON results of one benchmark (runs split over device calls) and
    the set of ``"<device>, torch <v>, triton <v>"`` they ran on."""
    rows: list[dict] = []
    devices: set[str] = set()
    for path in paths:
        data = json.loads(Path(path).read_text())
        devices.add(f"{data['device']}, torch {data['torch']}, triton {data['triton']}")
        rows += data["rows"]
    return rows, devices
