"""Where predictions go, and what may be written there.

A name that comes from an input (the AF3 JSON ``name``, a FASTA header) is data, not a path: it
is reduced to one safe file name inside the output directory, so ``../../x`` or ``/etc/x``
cannot write anywhere else. A prediction with non-finite or absurd coordinates is refused
rather than written as a structure that looks valid.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from fold_data.errors import InputError

__all__ = ["MAX_COORDINATE", "check_prediction", "output_path", "safe_file_name"]

MAX_COORDINATE = 1e5  # Angstrom; mmCIF coordinate columns and any real complex are far below
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 200


def safe_file_name(name: str, suffix: str = ".cif") -> str:
    """``name`` as one file name: runs of characters outside ``[A-Za-z0-9._-]`` become ``_``,
    leading dots and underscores are dropped (no ``..``, no hidden file), the length is bounded."""
    stem = _UNSAFE.sub("_", name).lstrip("._")[:_MAX_NAME].rstrip("_") or "prediction"
    return stem + suffix


def output_path(out: str | os.PathLike | None, name: str, suffix: str = ".cif") -> Path:
    """The file a prediction is written to: ``out`` as the user gave it, else ``name`` made safe
    in the current directory. A directory in place of the file, or a file in place of one of
    its directories, is an :class:`InputError` naming the path."""
    path = Path(out) if out is not None else Path.cwd() / safe_file_name(name, suffix)
    if path.is_dir():
        raise InputError(path, "--out", "is a directory; expected the path of an output file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(path, "--out", f"{parent} is a file, not a directory")
            break
    return path


def check_prediction(positions: np.ndarray, plddt: np.ndarray, checkpoint: str | os.PathLike,
                     mask: np.ndarray | None = None) -> None:
    """Refuse a prediction with non-finite or absurd coordinates or pLDDT (a diverged
    checkpoint): the error names the checkpoint and what was found."""
    pos = positions if mask is None else positions[mask.astype(bool)]
    finite = np.isfinite(pos).all() and np.isfinite(plddt).all()
    worst = float(np.abs(pos).max()) if finite and pos.size else 0.0
    if not finite or worst > MAX_COORDINATE:
        what = ("non-finite coordinates or pLDDT" if not finite
                else f"coordinates up to {worst:.3g} A (limit {MAX_COORDINATE:.0e} A)")
        raise InputError(checkpoint, "prediction", f"the model produced {what}; the checkpoint "
                         "has probably diverged: predict with an earlier checkpoint")
