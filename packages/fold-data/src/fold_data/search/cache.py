"""Result cache: one file per (query sequence, database content, parameters).

The key is the SHA-256 of a JSON document holding the molecule type, the sequence, the
database's resolved path, size and modification time (or, with ``hash_databases``, the SHA-256 of
its bytes), the search parameters and the pyhmmer version. A changed database file or parameter
is a new key; entries are written atomically, so a run killed mid-write leaves no partial entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, is_dataclass
from pathlib import Path

from .files import write_atomic

__all__ = ["ResultCache", "file_sha256"]

_FORMAT = 1
_HASHES: dict[tuple, str] = {}
_LOCK = threading.Lock()


def file_sha256(path: str | os.PathLike, signature: dict) -> str:
    """SHA-256 of a file's bytes (memoised per path, size and mtime for the process)."""
    key = (signature["path"], signature["size"], signature["mtime_ns"])
    with _LOCK:
        if key in _HASHES:
            return _HASHES[key]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    with _LOCK:
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def _plain(value):
    return asdict(value) if is_dataclass(value) else value


class ResultCache:
    """Search results under ``root/<key[:2]>/<key>.<suffix>``; ``root=None`` caches nothing."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = None if root is None else Path(root)
        self.hits = 0
        self.misses = 0
        self._count = threading.Lock()  # searches run on several threads

    @staticmethod
    def key(**parts) -> str:
        from pyhmmer import __version__ as pyhmmer_version

        doc = {"format": _FORMAT, "pyhmmer": pyhmmer_version,
               **{k: _plain(v) for k, v in parts.items()}}
        text = json.dumps(doc, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}.{suffix}"

    def get(self, key: str, suffix: str) -> str | None:
        if self.root is None:
            return None
        path = self._path(key, suffix)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            with self._count:
                self.misses += 1
            return None
        with self._count:
            self.hits += 1
        return text

    def put(self, key: str, suffix: str, text: str) -> None:
        if self.root is not None:
            write_atomic(self._path(key, suffix), text)
