"""Checkpoints: written atomically, checksummed, and loaded without unpickling arbitrary objects.

File layout (one file, so the checksum and the payload are replaced together)::

    b"FOLDCKPT1\\n"  <64 hex chars: sha256 of the payload>  b"\\n"  <payload>

The payload is ``torch.save`` of a nested structure of tensors, ``int``/``float``/``bool``/``str``/
``None``, lists, tuples and ``str``-keyed dicts only (checked before writing); it is read back
with ``torch.load(weights_only=True)``, whose unpickler refuses anything else. The write goes to
a temporary file in the same directory, is fsynced and then ``os.replace``d over the target, so a
crash leaves either the old or the new checkpoint, never half of one. A file whose magic,
checksum or payload is wrong raises :class:`CheckpointError` naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "MAGIC",
    "checkpoint_path",
    "clean_stale_tmp",
    "find_latest",
    "load_checkpoint",
    "load_latest_valid",
    "prune_checkpoints",
    "save_checkpoint",
    "write_atomic",
]

MAGIC = b"FOLDCKPT1\n"
_DIGEST_LEN = 64
_NAME = re.compile(r"^step_(\d{8,})\.ckpt$")
_TMP = re.compile(r"^\.step_\d{8,}\.ckpt\..*\.tmp$")  # write_atomic's temporary names


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (unreadable, corrupt) and an older one used instead."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: names the file and what was wrong."""

    def __init__(self, path: str | os.PathLike, message: str) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {message}")


def _check_plain(obj: Any, where: str) -> None:
    """Refuse anything ``torch.load(weights_only=True)`` could not read back (or that we do not
    want in a checkpoint): only tensors, scalars, strings, None and containers of them."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"checkpoint {where}: dict keys must be str, got {type(k)}")
            _check_plain(v, f"{where}.{k}")
        return
    raise TypeError(
        f"checkpoint {where}: {type(obj).__name__} is not storable (tensors, int, float, bool, "
        "str, None, lists, tuples and str-keyed dicts only)"
    )


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # platforms without directory fds
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, *chunks: bytes) -> Path:
    """Write ``chunks`` to ``path`` atomically: a temporary file in the same directory, fsync,
    ``os.replace``, fsync of the directory. Readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically with its sha256; returns the path."""
    _check_plain(state, "state")
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return write_atomic(path, MAGIC + digest + b"\n", payload)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`, verifying its checksum, with
    ``torch.load(weights_only=True)``. Raises :class:`CheckpointError` on any problem."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(path, f"cannot read checkpoint: {e}") from e
    header = len(MAGIC) + _DIGEST_LEN + 1
    if not data.startswith(MAGIC) or len(data) < header or data[header - 1:header] != b"\n":
        raise CheckpointError(path, "not a fold-train checkpoint (expected the FOLDCKPT1 header)")
    stored = data[len(MAGIC):header - 1].decode("ascii", errors="replace")
    payload = data[header:]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != stored:
        raise CheckpointError(
            path, f"corrupt checkpoint: sha256 of the payload is {actual}, the header says "
                  f"{stored} (truncated or modified file)")
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as e:  # a payload the safe unpickler refuses
        raise CheckpointError(path, f"checkpoint payload cannot be loaded safely: {e}") from e
    if not isinstance(state, dict):
        raise CheckpointError(path, f"expected a dict of state, got {type(state).__name__}")
    return state


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """``<directory>/step_<step, 8 digits>.ckpt``."""
    return Path(directory) / f"step_{step:08d}.ckpt"


def _listed(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_latest(directory: str | os.PathLike) -> Path | None:
    """The checkpoint of the highest step in ``directory`` (None if there is none)."""
    found = _listed(Path(directory))
    return found[-1][1] if found else None


def load_latest_valid(directory: str | os.PathLike,
                      check: Callable[[Path, dict], None] | None = None,
                      ) -> tuple[Path, dict, list[CheckpointError]]:
    """``(path, state, rejected)``: the newest checkpoint of ``directory`` that loads (and passes
    ``check``, which raises :class:`CheckpointError`), with the errors of the newer ones it
    skipped. No loadable checkpoint is a :class:`CheckpointError` listing every reason."""
    rejected: list[CheckpointError] = []
    for _, path in reversed(_listed(Path(directory))):
        try:
            state = load_checkpoint(path)
            if check is not None:
                check(path, state)
            return path, state, rejected
        except CheckpointError as e:
            rejected.append(e)
    why = "; ".join(str(e) for e in rejected)
    raise CheckpointError(directory, "no valid checkpoint to resume from" + (f" ({why})"
                                                                            if why else ""))


def clean_stale_tmp(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of interrupted :func:`write_atomic` calls in ``directory``
    (one writer per run directory, so any left when this is called are stale)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if _TMP.match(p.name)]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def prune_checkpoints(directory: str | os.PathLike, keep: int,
                      own: Iterable[str | os.PathLike] | None = None) -> list[Path]:
    """Delete all but the ``keep`` most recent checkpoints; returns the deleted paths.

    ``own``: the checkpoints this run wrote (or resumed from), oldest first. Only those are
    candidates, so another run's files are never deleted and the newest of this run always
    stays. Stale temporary files of interrupted writes are deleted too."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if own is None:
        old = [p for _, p in _listed(Path(directory))[:-keep]]
    else:
        old = [Path(p) for p in own][:-keep]
    for p in old:
        p.unlink(missing_ok=True)
    clean_stale_tmp(directory)
    return old
