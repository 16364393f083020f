"""Every entry of a feature cache checked before training from ``--cache`` alone.

Without ``--data`` nothing can rebuild an entry, so a truncated, bit-flipped or misplaced entry
file would otherwise surface at its first sampling, as a loader traceback in the middle of the
run. :func:`check_entries` reads each indexed entry once (zip directory, ``.npy`` headers,
metadata, payload sha256; never unpickling), in a few threads (hashing releases the GIL), and
refuses the cache up front, naming the bad entries and how to rebuild them. It deletes nothing:
the user decides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from fold_data.cache import FeatureCache, read_entry, verify_entry
from fold_data.errors import InputError

__all__ = ["check_entries", "entry_problem", "rebuild_hint"]

_SHOWN = 10  # bad entries named in the message; the count covers the rest


def entry_problem(cache: FeatureCache, key: str) -> str | None:
    """None if the entry file of ``key`` is intact and of this cache's version, else why not."""
    try:
        arrays, meta = read_entry(cache.path(key))
    except FileNotFoundError:
        return "no entry file"
    except Exception as e:  # any failure to parse the file means it cannot be used
        return f"unreadable ({type(e).__name__}: {e})"
    return verify_entry(arrays, meta, key=key, version=cache.version)


def rebuild_hint(cache: FeatureCache, family: str) -> str:
    """How to rebuild the entries of ``cache`` from their inputs (AF2: ``fold-data cache``; AF3:
    a training run with ``--data``, which builds the AF3 cache)."""
    if family == "af3":
        return (f"rebuild them from the complexes: fold-train train --preset PRESET --data "
                f"COMPLEX_DIR --cache {cache.root.parent}")
    return f"rebuild them from the inputs: fold-data cache DATA_DIR --out {cache.root}"


def check_entries(cache: FeatureCache, entries: Mapping[str, str], *, family: str = "af2",
                  workers: int | None = None) -> None:
    """Raise :class:`InputError` naming every entry of ``entries`` (``{name: key}``) whose file
    is missing, unreadable, of another pipeline version or fails its checksum."""
    workers = workers or min(8, os.cpu_count() or 1)
    names = sorted(entries)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        problems = list(pool.map(lambda n: entry_problem(cache, entries[n]), names))
    bad = [(n, p) for n, p in zip(names, problems) if p is not None]
    if not bad:
        return
    listed = "; ".join(f"{n} ({cache.path(entries[n]).name}: {p})" for n, p in bad[:_SHOWN])
    more = f"; and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    raise InputError(cache.root, ", ".join(n for n, _ in bad[:_SHOWN]) + (" ..." if more else ""),
                     f"{len(bad)} of {len(names)} cache entries cannot be used: {listed}{more}. "
                     f"Training from --cache alone cannot rebuild them; "
                     f"{rebuild_hint(cache, family)}")
