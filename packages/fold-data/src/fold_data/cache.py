"""Ahead-of-time feature cache (MegaFold section IV-A).

The deterministic features of a chain (mmCIF parsing, MSA and template featurization) are computed
once and stored; training then reads them back instead of re-parsing the inputs every step.

* One ``.npz`` file per entry, named by its key: ``<cache>/<key>.npz``. The key is a sha256 over
  the pipeline version, the build parameters (JSON, sorted keys) and the name, size and bytes of
  every input file, so a changed input or a version bump gives a new key: a stale entry is never
  found, let alone used.
* No pickle anywhere: only plain numeric, ``S`` (bytes) and ``U`` arrays are stored (object
  arrays are refused), so a cache shared between users cannot run code when read. The files are
  standard ``.npz`` (``np.load(allow_pickle=False)`` reads them); :func:`read_entry` reads a file
  with one system call and parses the zip directory and ``.npy`` headers itself, so the arrays are
  views of one buffer (a load costs well under a millisecond plus the checksum).
* Every file carries a ``__meta__`` array (UTF-8 JSON as uint8) with the version, the key, the
  entry name, the input file names and a sha256 of the array payload (names, dtypes, shapes,
  bytes). :meth:`FeatureCache.load` checks all of it: a truncated, bit-flipped or misplaced file is
  reported with a warning, deleted and rebuilt.
* Writes are atomic (temporary file in the same directory, fsync, ``os.replace``), so readers and
  concurrent writers of the same entry only ever see a complete file. Files get the usual
  permissions (``0666`` less the umask), so a cache can be shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import math
import os
import re
import struct
import tempfile
import time
import traceback
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

import fold_data
from fold_data.errors import InputError

__all__ = [
    "FEATURE_PIPELINE_VERSION",
    "CacheReport",
    "CacheResult",
    "CacheWarning",
    "ChainResult",
    "IndexCheck",
    "FeatureCache",
    "build_cache",
    "pipeline_version",
]

# Bump whenever make_features' output changes for the same inputs (new feature, dtype, bug fix).
FEATURE_PIPELINE_VERSION = "af2-raw-1"

META_NAME = "__meta__"
INDEX_NAME = "index.json"
INDEX_LOCK_NAME = ".index.lock"
# dtype kinds np.load reads without pickle: bool, ints, floats, complex, bytes, str.
_SAFE_KINDS = frozenset("biufcSU")
_HASH_BLOCK = 1 << 20


def pipeline_version() -> str:
    """The version every cache entry is keyed and checked against."""
    return f"fold-data-{fold_data.__version__}+{FEATURE_PIPELINE_VERSION}"


class CacheWarning(UserWarning):
    """A cache entry was corrupt or did not match its key (it was deleted: a build from its
    inputs makes it again), or the index and the entry files disagreed."""


def _payload_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every array, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{len(name)}:{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(memoryview(a.reshape(-1)).cast("B") if a.size else b"")
    return h.hexdigest()


def _check_storable(name: str, array: Any) -> np.ndarray:
    if not isinstance(array, np.ndarray | np.generic):
        raise TypeError(f"feature {name!r}: expected a numpy array, got {type(array).__name__}")
    array = np.asarray(array)
    if array.dtype.kind not in _SAFE_KINDS or array.dtype.fields is not None:
        raise TypeError(
            f"feature {name!r}: dtype {array.dtype} cannot be read without pickle; store bytes "
            "as fixed-width 'S' arrays (np.asarray(list_of_bytes, dtype=bytes)), not objects"
        )
    return array


def _write_npz(fileobj, arrays: Mapping[str, np.ndarray], compress: bool) -> None:
    """Serialize ``arrays`` into the open file (a seam so tests can simulate a crash mid-write)."""
    (np.savez_compressed if compress else np.savez)(fileobj, **arrays)


def _file_mode() -> int:
    """``0o666`` less the process umask (read without changing it, which is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform/filesystem; the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the complete new file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@dataclass
class CacheResult:
    """What :meth:`FeatureCache.fetch` did for one entry."""

    features: dict[str, np.ndarray]
    key: str
    path: Path
    status: str  # "reused", "built" or "rebuilt-corrupt"


class FeatureCache:
    """A directory of content-addressed feature files, one per entry.

    ``version`` defaults to :func:`pipeline_version`; entries written under another version are
    never returned. ``compress=True`` writes ``np.savez_compressed`` files (smaller, slower to
    read).
    """

    def __init__(
        self, root: str | os.PathLike, *, version: str | None = None, compress: bool = False
    ):
        self.root = Path(root)
        self.version = pipeline_version() if version is None else version
        self.compress = compress
        self.root.mkdir(parents=True, exist_ok=True)

    # -- keys -------------------------------------------------------------------------------
    def key(self, input_paths: Iterable[str | os.PathLike], params: Mapping[str, Any]) -> str:
        """sha256 hex over the version, ``params`` (sorted JSON) and each input file's name+bytes.

        File contents are hashed, not mtimes or absolute paths, so a cache is valid wherever the
        same data lives. Input order matters (it is the featurizer's argument order).
        """
        h = hashlib.sha256()
        h.update(json.dumps({"version": self.version, "params": params}, sort_keys=True).encode())
        for p in input_paths:
            p = Path(p)
            try:
                size = p.stat().st_size
                h.update(json.dumps([p.name, size]).encode())
                with open(p, "rb") as f:
                    while block := f.read(_HASH_BLOCK):
                        h.update(block)
            except OSError as e:
                raise InputError(p, None, f"cannot read input file to key the cache: {e}") from e
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    # -- read -------------------------------------------------------------------------------
    def read_meta(self, key: str) -> dict[str, Any]:
        """The metadata of an entry, unverified (for ``fold-data inspect``)."""
        return read_entry(self.path(key))[1]

    def load(self, key: str) -> dict[str, np.ndarray] | None:
        """The entry's arrays, or None if missing. A corrupt or mismatched entry is deleted
        (with a :class:`CacheWarning`) and None returned, so the caller rebuilds it."""
        features, _ = self._load(key)
        return features

    def _load(self, key: str) -> tuple[dict[str, np.ndarray] | None, str]:
        path = self.path(key)
        try:
            arrays, meta = read_entry(path)
            problem = verify_entry(arrays, meta, key=key, version=self.version)
        except FileNotFoundError:
            return None, "missing"
        except Exception as e:  # any failure to parse the file means it cannot be used
            problem = f"unreadable ({type(e).__name__}: {e})"
        if problem is None:
            return arrays, "ok"
        try:
            path.unlink(missing_ok=True)
            action = "deleted; the next build from its inputs makes it again"
        except OSError as e:  # e.g. a read-only shared cache: still never used
            action = f"could not delete it ({e}); ignoring it"
        warnings.warn(f"{path}: corrupt cache entry, {action}: {problem}", CacheWarning,
                      stacklevel=3)
        return None, "corrupt"

    # -- write ------------------------------------------------------------------------------
    def store(self, key: str, features: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Path:
        """Write an entry atomically; ``meta`` (JSON-serializable) is stored with the checksum."""
        arrays = {name: _check_storable(name, a) for name, a in features.items()}
        if META_NAME in arrays:
            raise ValueError(f"feature name {META_NAME!r} is reserved for the cache metadata")
        full_meta = {
            **meta,
            "version": self.version,
            "key": key,
            "payload_sha256": _payload_digest(arrays),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        meta_bytes = np.frombuffer(json.dumps(full_meta, sort_keys=True).encode(), dtype=np.uint8)
        path = self.path(key)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                _write_npz(f, {**arrays, META_NAME: meta_bytes}, self.compress)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _file_mode())  # mkstemp makes 0600 files
            os.replace(tmp, path)  # atomic: concurrent writers of one key each rename a whole file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.root)
        return path

    # -- both -------------------------------------------------------------------------------
    def fetch(
        self,
        name: str,
        input_paths: Iterable[str | os.PathLike],
        params: Mapping[str, Any],
        build_fn: Callable[[], Mapping[str, np.ndarray]],
        *,
        rebuild: bool = False,
    ) -> CacheResult:
        """Load the entry for these inputs, or build it with ``build_fn()`` and store it."""
        input_paths = [Path(p) for p in input_paths]
        key = self.key(input_paths, params)
        state = "missing"
        if not rebuild:
            features, state = self._load(key)
            if features is not None:
                return CacheResult(features, key, self.path(key), "reused")
        features = {n: _check_storable(n, a) for n, a in build_fn().items()}
        meta = {"name": name, "inputs": [p.name for p in input_paths], "params": dict(params)}
        path = self.store(key, features, meta)
        status = "rebuilt-corrupt" if state == "corrupt" else "built"
        return CacheResult(features, key, path, status)

    def get_or_build(
        self,
        name: str,
        input_paths: Iterable[str | os.PathLike],
        params: Mapping[str, Any],
        build_fn: Callable[[], Mapping[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """The features for these inputs, from the cache if a valid entry exists."""
        return self.fetch(name, input_paths, params, build_fn).features

    # -- index ------------------------------------------------------------------------------
    def read_index(self) -> dict[str, str]:
        """``{entry name: key}`` written by :func:`build_cache` (empty if there is none)."""
        path = self.root / INDEX_NAME
        try:
            index = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise InputError(path, None, f"expected the cache index as JSON: {e}") from e
        if index.get("version") != self.version:
            return {}
        return dict(index.get("entries", {}))

    @contextlib.contextmanager
    def _index_lock(self):
        """An exclusive ``flock`` on ``.index.lock``: concurrent builders merge into the index
        one at a time (read-merge-write without it lost entries)."""
        with open(self.root / INDEX_LOCK_NAME, "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def write_index(self, entries: Mapping[str, str]) -> None:
        """Merge ``{name: key}`` into the index and write it atomically, under the index lock."""
        with self._index_lock():
            self._write_index({**self.read_index(), **entries})

    def _write_index(self, entries: Mapping[str, str]) -> None:
        doc = {"version": self.version, "entries": dict(sorted(entries.items()))}
        atomic_write_bytes(self.root / INDEX_NAME, json.dumps(doc, indent=1).encode())

    def reconcile_index(self, *, add: bool = False) -> IndexCheck:
        """Compare the index with the entry files, under the index lock: files of this version
        whose name the index lacks (an interrupted or unlocked build, or an entry left out on
        purpose) and indexed entries without a file (nothing here can rebuild them). ``add``:
        write the unindexed entries into the index."""
        with self._index_lock():
            index = self.read_index()
            known = set(index.values())
            added: dict[str, str] = {}
            for path in sorted(self.root.glob("*.npz")):
                if path.stem in known:
                    continue
                try:
                    meta = read_entry(path)[1]
                except Exception:  # unreadable: load() reports it if it is ever used
                    continue
                name = meta.get("name")
                if meta.get("version") == self.version and name and name not in index:
                    added[name] = path.stem
            if added and add:
                index = {**index, **added}
                self._write_index(index)
        missing = sorted(n for n, k in index.items() if not self.path(k).is_file())
        return IndexCheck(entries=index, unindexed=added, missing=missing)


@dataclass
class IndexCheck:
    """What :meth:`FeatureCache.reconcile_index` found: the index after it (``{name: key}``),
    the entries of this version the index lacked (``{name: key}``; written into it only with
    ``add=True``), and the indexed names whose file is missing."""

    entries: dict[str, str]
    unindexed: dict[str, str]
    missing: list[str]


def read_entry(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read every array of a cache file (never unpickling) and its metadata, unverified.

    The file is read with one system call; arrays of uncompressed members are views of that
    buffer (no per-array copies, no per-member file seeks), which is what makes a cached load
    cheap. Compressed members go through :func:`numpy.lib.format.read_array`.
    """
    arrays = {}
    with open(path, "rb") as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        if f.readinto(buf) != len(buf):
            raise ValueError("file changed size while being read")
        with zipfile.ZipFile(f) as zf:  # reads only the central directory
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"unexpected member {info.filename!r}")
                arrays[info.filename[:-4]] = _read_member(zf, info, buf)
    if META_NAME not in arrays:
        raise ValueError(f"no {META_NAME} array")
    meta = json.loads(arrays.pop(META_NAME).tobytes().decode("utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{META_NAME} is not a JSON object")
    return arrays, meta


# The header np.save writes for a plain dtype; anything else takes numpy's own (slower) parser.
_NPY_HEADER = re.compile(
    rb"\{'descr': '([<>|=][a-zA-Z]\d*)', 'fortran_order': (True|False), "
    rb"'shape': \(([\d, ]*)\), \} *\n"
)


def _npy_header(npy: memoryview, member: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of one ``.npy`` image."""
    if bytes(npy[:6]) != b"\x93NUMPY":
        raise ValueError(f"member {member!r}: not a .npy array")
    major = npy[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", npy, 8), 10
    elif major in (2, 3):
        (hlen,), start = struct.unpack_from("<I", npy, 8), 12
    else:
        raise ValueError(f"member {member!r}: unsupported .npy version {major}")
    text = bytes(npy[start:start + hlen])
    m = _NPY_HEADER.fullmatch(text)
    if m is not None:
        shape = tuple(int(d) for d in m[3].split(b",") if d.strip())
        return shape, m[2] == b"True", np.dtype(m[1].decode()), start + hlen
    header = io.BytesIO(npy[:start + hlen])
    np.lib.format.read_magic(header)
    fmt = np.lib.format
    reader = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
    shape, fortran, dtype = reader(header)
    return shape, fortran, dtype, start + hlen


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, buf: bytearray) -> np.ndarray:
    """One ``.npy`` member: a view of ``buf`` if stored uncompressed, else decompressed."""
    if info.compress_type != zipfile.ZIP_STORED:
        with zf.open(info) as member:
            return np.lib.format.read_array(member, allow_pickle=False)
    # Local file header: 30 fixed bytes, then the name and an extra field of their own lengths.
    start = info.header_offset
    if buf[start:start + 4] != b"PK\x03\x04":
        raise ValueError(f"member {info.filename!r}: bad local header")
    name_len, extra_len = struct.unpack_from("<HH", buf, start + 26)
    data_start = start + 30 + name_len + extra_len
    data_end = data_start + info.file_size
    if data_end > len(buf):
        raise ValueError(f"member {info.filename!r} is truncated")
    npy = memoryview(buf)[data_start:data_end]
    shape, fortran, dtype, offset = _npy_header(npy, info.filename)
    if dtype.hasobject or dtype.kind not in _SAFE_KINDS:
        raise ValueError(f"member {info.filename!r}: dtype {dtype} needs pickle; refused")
    count = math.prod(shape)
    if offset + count * dtype.itemsize != len(npy):
        raise ValueError(f"member {info.filename!r}: size does not match shape {shape}")
    flat = np.frombuffer(npy, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def verify_entry(
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
    *,
    key: str | None,
    version: str | None,
) -> str | None:
    """None if the entry is intact (and matches ``key``/``version`` if given), else the problem."""
    if version is not None and meta.get("version") != version:
        return f"pipeline version {meta.get('version')!r}, expected {version!r}"
    if key is not None and meta.get("key") != key:
        return f"metadata key {meta.get('key')!r} does not match the file name"
    if _payload_digest(arrays) != meta.get("payload_sha256"):
        return "payload checksum mismatch"
    return None


# ------------------------------------------------------------------------------------------------
# Building a cache for a data directory
# ------------------------------------------------------------------------------------------------


@dataclass
class ChainResult:
    """The outcome for one chain of :func:`build_cache`."""

    name: str
    status: str  # "built", "reused", "rebuilt-corrupt" or "failed"
    seconds: float
    key: str | None = None
    path: str | None = None
    error: str | None = None  # the InputError message (or exception and traceback) if failed
    shapes: dict[str, list[int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # input warnings raised while featurizing


@dataclass
class CacheReport:
    """What :func:`build_cache` did, chain by chain."""

    cache_dir: str
    version: str
    results: list[ChainResult]
    seconds: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[ChainResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        counts = ", ".join(
            f"{self.count(s)} {s}" for s in ("built", "reused", "rebuilt-corrupt", "failed")
        )
        head = f"{len(self.results)} chains in {self.seconds:.1f} s: {counts} -> {self.cache_dir}"
        lines = [head]
        lines += [f"  FAILED {r.name}: {r.error}" for r in self.failed]
        return "\n".join(lines)


def _default_featurizer() -> Callable[..., Mapping[str, np.ndarray]]:
    from fold_data.af2 import make_features

    return make_features


def _build_one(
    entry: Any,
    cache_dir: str,
    version: str,
    compress: bool,
    rebuild: bool,
    featurize: Callable[..., Mapping[str, np.ndarray]] | None,
    key_params: dict[str, Any],
    kwargs: dict[str, Any],
    limits: Any = None,
) -> ChainResult:
    """Fetch or build one chain (runs in a worker process; never raises for bad input).
    ``limits``: the :class:`fold_data.limits.SizeLimits` in force while featurising."""
    from fold_data.limits import use_limits

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, use_limits(limits):
        # Input warnings (skipped template hits, ...) are reported per chain, not printed by
        # every worker; cache warnings (a corrupt entry) still reach the user.
        warnings.simplefilter("always")
        try:
            fn = featurize or _default_featurizer()
            cache = FeatureCache(cache_dir, version=version, compress=compress)
            result = cache.fetch(
                entry.name,
                entry.input_paths,
                {"chain_id": entry.chain_id, **key_params},
                lambda: fn(entry.mmcif_path, entry.chain_id, entry.msa_paths,
                           entry.template_hits, **kwargs),
                rebuild=rebuild,
            )
            error = None
        except InputError as e:
            error = str(e)
        except Exception as e:  # a featurizer bug must not cost the rest of the build
            error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    seconds = time.perf_counter() - t0
    notes = []
    for w in caught:
        if issubclass(w.category, CacheWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        else:
            notes.append(f"{w.category.__name__}: {w.message}")
    if error is not None:
        return ChainResult(entry.name, "failed", seconds, error=error, warnings=notes)
    shapes = {k: list(v.shape) for k, v in result.features.items()}
    return ChainResult(entry.name, result.status, seconds, result.key, str(result.path),
                       shapes=shapes, warnings=notes)


def _jsonable(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def build_cache(
    root: str | os.PathLike,
    cache_dir: str | os.PathLike,
    *,
    workers: int | None = None,
    chains: Iterable[str] | None = None,
    progress: bool = True,
    compress: bool = False,
    rebuild: bool = False,
    version: str | None = None,
    featurize: Callable[..., Mapping[str, np.ndarray]] | None = None,
    limits: Any = None,
    **make_features_kwargs: Any,
) -> CacheReport:
    """Featurize every chain of data directory ``root`` into ``cache_dir`` (reusing valid entries).

    ``workers`` processes (spawned; default: the CPU count, 0 or 1 runs in this process) call
    ``featurize(mmcif_path, chain_id, msa_paths, template_hits, **make_features_kwargs)``
    (default :func:`fold_data.af2.make_features`; ``template_mmcif_dir`` defaults to
    ``<root>/mmcifs``).
    A chain that fails is listed in the report with its error; the others still build. The
    ``{name: key}`` index of the cache is updated for the chains that succeeded.

    The key covers the chain's own files and ``make_features_kwargs`` except
    ``template_mmcif_dir``: template mmCIFs are archive files addressed by the PDB IDs in the
    (hashed) hit file and are taken as immutable; use ``rebuild=True`` after replacing them.

    ``limits`` (a :class:`fold_data.limits.SizeLimits`; default: the limits in force) are
    checked for each chain before it is featurised: a chain over them fails with the numbers.
    """
    from fold_data.dataset import discover_chains

    t0 = time.perf_counter()
    version = pipeline_version() if version is None else version
    cache = FeatureCache(cache_dir, version=version, compress=compress)  # creates the directory
    entries = discover_chains(root, chains)
    kwargs = dict(make_features_kwargs)
    kwargs.setdefault("template_mmcif_dir", Path(root) / "mmcifs")
    key_params = {k: _jsonable(v) for k, v in kwargs.items() if k != "template_mmcif_dir"}
    # Entries of different featurizers must never be confused, even in one directory.
    fn = featurize or _default_featurizer()
    key_params["featurizer"] = f"{fn.__module__}:{fn.__qualname__}"
    json.dumps(key_params)  # fail here, not in a worker, on parameters that cannot key the cache
    from fold_data.limits import current_limits

    args = (str(cache.root), version, compress, rebuild, featurize, key_params, kwargs,
            limits or current_limits())  # passed on: spawned workers do not inherit it

    workers = (os.cpu_count() or 1) if workers is None else workers
    workers = max(1, min(workers, len(entries)))
    from tqdm import tqdm

    bar = tqdm(total=len(entries), desc="fold-data cache", unit="chain", disable=not progress)
    results: dict[str, ChainResult] = {}
    try:
        if workers == 1:
            for entry in entries:
                results[entry.name] = _build_one(entry, *args)
                bar.update()
        else:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_build_one, e, *args): e for e in entries}
                for fut in as_completed(futures):
                    entry = futures[fut]
                    try:
                        results[entry.name] = fut.result()
                    except Exception as e:  # the worker process itself died
                        results[entry.name] = ChainResult(
                            entry.name, "failed", 0.0, error=f"worker died: {type(e).__name__}: {e}"
                        )
                    bar.set_postfix_str(entry.name)
                    bar.update()
    finally:
        bar.close()
    ordered = [results[e.name] for e in entries]
    cache.write_index({r.name: r.key for r in ordered if r.key is not None})
    return CacheReport(str(cache.root), version, ordered, time.perf_counter() - t0)
