"""The ``fold-data`` command: build the feature cache, inspect it, run the data-pipeline demo.

    fold-data cache DATA_DIR --out CACHE_DIR [--workers N] [--chains 4zey_A,...]
                    [--max-tokens N] [--max-atoms N] [--max-msa-memory BYTES]
    fold-data inspect CACHE_FILE_OR_DIR
    fold-data demo DATA_DIR [--cache CACHE_DIR] [--samples N] [--preset tiny]
    fold-data msa INPUT --out DIR (--config TOML | --db NAME=PATH ...)   (fold_data.search.cli)

A chain over the size limits (``fold_data.limits``; raised with the ``--max-*`` options) fails
with the numbers, before it is featurised. Exit status: 0 on success, 1 if any chain failed or
any cache file is invalid, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fold_data.cache import (
    INDEX_NAME,
    CacheReport,
    FeatureCache,
    build_cache,
    pipeline_version,
    read_entry,
    verify_entry,
)
from fold_data.errors import InputError
from fold_data.limits import add_limit_options, limits_from_args
from fold_data.loader import LoaderError, NonBlockingLoader

__all__ = ["main"]


def _date(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date YYYY-MM-DD, got {text!r}") from None


def _featurizer(text: str) -> Callable:
    module, _, func = text.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"cannot import {text!r}: {e}") from None


def _chain_list(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _add_build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="featurizer processes (default: min(8, CPUs); 1 = in this process)")
    p.add_argument("--chains", type=_chain_list, default=None, metavar="4zey_A,...",
                   help="only these chains (a chain without an alignments/ folder is featurized "
                        "from its sequence alone); default: every alignments/<pdb>_<chain>/")
    p.add_argument("--max-template-date", type=_date, default=None, metavar="YYYY-MM-DD",
                   help="ignore template structures released after this date")
    p.add_argument("--compress", action="store_true",
                   help="write compressed .npz files (smaller, slower to load)")
    p.add_argument("--rebuild", action="store_true",
                   help="rebuild every entry even if a valid one exists")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list the input warnings of each chain (e.g. skipped template hits)")
    add_limit_options(p)  # --max-tokens / --max-atoms / --max-msa-memory (fold_data.limits)
    p.add_argument("--featurizer", type=_featurizer, default=None, metavar="MODULE:FUNCTION",
                   help="featurize with MODULE:FUNCTION(mmcif_path, chain_id, msa_paths, "
                        "template_hits, **kw) (default: fold_data.af2:make_features)")


def _build_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {}
    if args.max_template_date is not None:
        kwargs["max_template_date"] = args.max_template_date
    return kwargs


def _print_report(report: CacheReport, verbose: bool = False) -> None:
    print(report.summary())
    for r in report.results:
        if r.status != "failed":
            notes = f"  ({len(r.warnings)} input warnings)" if r.warnings else ""
            print(f"  {r.name:10s} {r.status:16s} {r.seconds:7.2f} s  {Path(r.path).name}{notes}")
        if verbose:
            for note in r.warnings:
                print(f"    {note}")


def cmd_cache(args: argparse.Namespace) -> int:
    report = build_cache(
        args.data_dir, args.out, workers=args.workers, chains=args.chains,
        progress=args.progress, compress=args.compress, rebuild=args.rebuild,
        featurize=args.featurizer, limits=limits_from_args(args), **_build_kwargs(args),
    )
    _print_report(report, args.verbose)
    return 0 if report.ok else 1


def _describe(path: Path) -> bool:
    """Print one cache file's metadata and arrays; return whether it is intact."""
    try:
        arrays, meta = read_entry(path)
    except Exception as e:
        print(f"{path}: INVALID (unreadable: {type(e).__name__}: {e})")
        return False
    problem = verify_entry(arrays, meta, key=path.stem, version=None)
    if problem is None and meta.get("version") != pipeline_version():
        status = f"valid, but built by {meta.get('version')} (this is {pipeline_version()}): stale"
    else:
        status = "valid" if problem is None else f"INVALID ({problem})"
    size = path.stat().st_size / 1e6
    name, created = meta.get("name", "?"), meta.get("created")
    print(f"{path}: {name}  {status}  {size:.2f} MB  created {created}")
    print(f"  inputs: {', '.join(meta.get('inputs', []))}  params: {meta.get('params', {})}")
    for name in sorted(arrays):
        a = arrays[name]
        print(f"  {name:32s} {a.dtype.str:6s} {tuple(a.shape)}")
    return problem is None


def cmd_inspect(args: argparse.Namespace) -> int:
    target = Path(args.path)
    index = None
    if target.is_dir():
        files = sorted(target.glob("*.npz"))
        if not files:
            print(f"{target}: no cache files (*.npz)", file=sys.stderr)
            return 1
        index = _raw_index(target)
        if index is not None:
            print(f"{target}: {len(files)} files, index lists {len(index)} chains")
            unindexed = sorted({f.stem for f in files} - set(index.values()))
            no_file = sorted(n for n, k in index.items() if not (target / f"{k}.npz").is_file())
            if unindexed:  # an interrupted or concurrent build; training reconciles them
                print(f"{target}: {len(unindexed)} files are not in {INDEX_NAME}: "
                      f"{', '.join(unindexed[:5])}{' ...' if len(unindexed) > 5 else ''}")
            if no_file:
                print(f"{target}: {len(no_file)} indexed chains have no file: "
                      f"{', '.join(no_file[:5])}{' ...' if len(no_file) > 5 else ''}")
    elif target.is_file():
        files = [target]
    else:
        print(f"{target}: no such file or directory", file=sys.stderr)
        return 2
    ok = [_describe(f) for f in files]
    print(f"{sum(ok)}/{len(ok)} valid")
    consistent = index is None or (not unindexed and not no_file)
    return 0 if all(ok) and consistent else 1


def _raw_index(target: Path) -> dict[str, str] | None:
    """``{name: key}`` of the directory's index whatever its pipeline version (None: none)."""
    try:
        return dict(json.loads((target / INDEX_NAME).read_text()).get("entries", {}))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(target / INDEX_NAME, None,
                         f"expected the cache index as JSON: {e}") from None


def demo_sample(item: tuple[str, str, str, str], seed: int) -> tuple[dict[str, np.ndarray], float]:
    """Loader worker: read one chain's cached features and make a training sample from them."""
    from fold_data.af2 import make_sample

    cache_dir, key, _name, preset = item
    t0 = time.perf_counter()
    raw = FeatureCache(cache_dir).load(key)
    if raw is None:
        raise InputError(Path(cache_dir) / f"{key}.npz", _name, "expected a valid cache entry")
    return make_sample(raw, preset, seed=seed), time.perf_counter() - t0


def cmd_demo(args: argparse.Namespace) -> int:
    cache_dir = Path(args.cache)
    print(f"fold-data demo: {args.data_dir} -> cache {cache_dir} ({pipeline_version()})")
    report = build_cache(
        args.data_dir, cache_dir, workers=args.workers, chains=args.chains,
        progress=args.progress, compress=args.compress, rebuild=args.rebuild,
        featurize=args.featurizer, limits=limits_from_args(args), **_build_kwargs(args),
    )
    _print_report(report, args.verbose)
    good = [r for r in report.results if r.status != "failed"]
    if not good:
        print("no chain could be featurized", file=sys.stderr)
        return 1
    for r in good:
        dims = {k: r.shapes[k] for k in ("aatype", "msa", "template_aatype") if k in r.shapes}
        print(f"  {r.name}: {dims}")

    items = [(str(cache_dir), good[i % len(good)].key, good[i % len(good)].name, args.preset)
             for i in range(args.samples)]
    names = [f"{it[2]}#{i}" for i, it in enumerate(items)]
    print(f"\n{args.samples} '{args.preset}' training samples through the non-blocking loader "
          f"({args.loader_workers} workers):")
    t0 = time.perf_counter()
    try:
        with NonBlockingLoader(items, demo_sample, workers=args.loader_workers, pass_seed=True,
                               names=names, shuffle=True, seed=args.seed,
                               prefetch=2 * args.loader_workers) as loader:
            first, first_s = None, 0.0
            for i, (sample, prep_s) in enumerate(loader):
                if first is None:  # includes starting the worker processes
                    first, first_s = sample, time.perf_counter() - t0
                    waited_before = loader.stats.wait_s
                print(f"  sample {i}: msa_feat {sample['msa_feat'].shape}, prepared in "
                      f"{prep_s * 1e3:.0f} ms")
            stats = loader.stats
    except LoaderError as e:
        print(f"loader failed: {e}", file=sys.stderr)
        return 1
    total = time.perf_counter() - t0
    print(f"loader: {stats.samples} samples in {total:.2f} s; first after {first_s:.2f} s "
          f"(worker start-up), then the consumer waited {stats.wait_s - waited_before:.2f} s; "
          f"{stats.out_of_order} yielded ahead of a slower one")
    print("sample features:")
    for name in sorted(first):
        print(f"  {name:36s} {first[name].dtype.str:6s} {tuple(first[name].shape)}")
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fold-data",
        description="fold-data: AlphaFold-style features with an ahead-of-time cache and a "
                    "non-blocking loader. DATA_DIR has OpenFold's layout: mmcifs/<pdb>.cif and "
                    "alignments/<pdb>_<chain>/{*.a3m,*.sto,hmm_output.sto|*.hhr}.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("cache", help="featurize every chain once into a cache directory",
                       description="Build (or reuse) one checksummed .npz per chain, keyed by a "
                                   "hash of its input files and the pipeline version. Corrupt "
                                   "entries are rebuilt. Exit status 1 if any chain failed.")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--out", required=True, metavar="CACHE_DIR", help="cache directory")
    _add_build_options(p)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("inspect", help="list the arrays of cache files and check them",
                       description="Print names, dtypes and shapes of a cache file (or of every "
                                   "file in a cache directory) and verify its checksum. Exit "
                                   "status 1 if any file is invalid.")
    p.add_argument("path", metavar="CACHE_FILE_OR_DIR")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("demo", help="cache the bundled data and make training samples from it",
                       description="Build/reuse the cache for DATA_DIR, then prepare training "
                                   "samples (fold_data.af2.make_sample) in worker processes "
                                   "through the non-blocking loader, and report shapes and "
                                   "timings.")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--cache", default=".fold_cache", metavar="CACHE_DIR",
                   help="cache directory (default: .fold_cache)")
    p.add_argument("--samples", type=int, default=6, help="training samples to make (default 6)")
    p.add_argument("--preset", default="tiny", help="AF2 data preset (default: tiny)")
    p.add_argument("--loader-workers", type=int, default=2, help="loader processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and sampling seed")
    _add_build_options(p)
    p.set_defaults(func=cmd_demo)

    from fold_data.search.cli import add_msa_parser  # MSA / template search (pyhmmer)

    add_msa_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"fold-data {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
