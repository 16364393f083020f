"""Writing predicted structures: a ``gemmi.Structure`` (built by :mod:`fold_data.af2.write` or
:mod:`fold_data.af3.write`) as an mmCIF file, atomically, so a reader never sees half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from fold_data.cache import atomic_write_bytes

__all__ = ["write_mmcif"]


def write_mmcif(structure, path: str | os.PathLike) -> Path:
    """Write ``structure`` as mmCIF atomically (temporary file + fsync + rename), creating the
    missing directories; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, structure.make_mmcif_document().as_string().encode())
    return path
