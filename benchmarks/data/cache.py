"""Ahead-of-time cache (MegaFold IV-A): load a cached chain vs parse + featurize it from scratch.

For every chain of the bundled ``data/demo`` and, when present, the shared OpenFold test data
(``<repo>/../shared/data/openfold-testdata``):

* ``featurize``: ``fold_data.af2.make_features`` from the mmCIF, MSAs and template hits (the
  median of ``--repeats`` runs in this process, after one warm-up call for imports);
* ``load``: ``FeatureCache.load(key)``, the training path (the key comes from the cache index, so
  the raw inputs are not touched): one read, checksum verified, arrays as views (median of
  ``--loads`` runs; the file is in the page cache, as it is for a cache read every epoch);
* ``hit with key``: ``FeatureCache.fetch`` on a hit, i.e. also hashing every input file (the path
  ``fold-data cache`` takes to decide that an entry is still valid);
* the file size, uncompressed (the default) and compressed.

    python -m benchmarks.data.cache [--repeats 3] [--loads 20] [--out benchmarks/results/data]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from fold_data.af2 import make_features
from fold_data.cache import FeatureCache, pipeline_version
from fold_data.dataset import discover_chains
from fold_data.errors import InputError

from benchmarks.common.machine import host_info
from benchmarks.common.results import REPO, RESULTS, write_result

DATASETS = {
    "demo": REPO / "data" / "demo",
    "openfold-testdata": REPO.parent / "shared" / "data" / "openfold-testdata",
}


def median_time(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_chain(entry, root: Path, cache: FeatureCache, zcache: FeatureCache, args) -> dict:
    mmcif_dir = root / "mmcifs"

    def featurize():
        return make_features(entry.mmcif_path, entry.chain_id, entry.msa_paths,
                             entry.template_hits, template_mmcif_dir=mmcif_dir)

    features = featurize()  # warm-up (lazy imports, residue tables)
    t_feat = median_time(featurize, args.repeats)
    params = {"chain_id": entry.chain_id}
    key = cache.key(entry.input_paths, params)
    path = cache.store(key, features, {"name": entry.name})
    zpath = zcache.store(key, features, {"name": entry.name})
    loaded = cache.load(key)
    assert loaded is not None and sorted(loaded) == sorted(features)
    t_load = median_time(lambda: cache.load(key), args.loads)
    t_hit = median_time(lambda: cache.fetch(entry.name, entry.input_paths, params, featurize),
                        max(3, args.loads // 4))
    t_zload = median_time(lambda: zcache.load(key), max(3, args.loads // 4))
    return {
        "chain": entry.name,
        "n_res": int(features["aatype"].shape[0]),
        "n_msa": int(features["msa"].shape[0]),
        "n_templ": int(features["template_aatype"].shape[0]),
        "input_mb": sum(p.stat().st_size for p in entry.input_paths) / 1e6,
        "featurize_ms": 1e3 * t_feat,
        "load_ms": 1e3 * t_load,
        "hit_with_key_ms": 1e3 * t_hit,
        "compressed_load_ms": 1e3 * t_zload,
        "speedup": t_feat / t_load,
        "speedup_with_key": t_feat / t_hit,
        "file_mb": path.stat().st_size / 1e6,
        "compressed_file_mb": zpath.stat().st_size / 1e6,
    }


def run(args) -> dict:
    datasets = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = FeatureCache(Path(tmp) / "plain")
        zcache = FeatureCache(Path(tmp) / "compressed", compress=True)
        for name, root in DATASETS.items():
            if not root.is_dir():
                print(f"{name}: {root} absent, skipped")
                continue
            rows, failed = [], {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # skipped template hits etc.
                entries = discover_chains(root)
                for entry in entries:
                    try:
                        row = bench_chain(entry, root, cache, zcache, args)
                    except InputError as e:
                        failed[entry.name] = str(e)
                        print(f"{name} {entry.name}: failed: {e}")
                        continue
                    rows.append(row)
                    print(f"{name:18s} {row['chain']:7s} featurize {row['featurize_ms']:8.1f} ms"
                          f"  load {row['load_ms']:6.2f} ms  x{row['speedup']:6.1f}", flush=True)
            total_feat = sum(r["featurize_ms"] for r in rows)
            total_load = sum(r["load_ms"] for r in rows)
            total_hit = sum(r["hit_with_key_ms"] for r in rows)
            datasets[name] = {
                "root": str(root.relative_to(REPO.parent)) if root.is_relative_to(REPO.parent)
                else str(root),
                "chains": rows,
                "failed": failed,
                "overall_speedup": total_feat / total_load if total_load else None,
                "overall_speedup_with_key": total_feat / total_hit if total_hit else None,
                "min_speedup": min((r["speedup"] for r in rows), default=None),
                "median_speedup": statistics.median(r["speedup"] for r in rows) if rows else None,
            }
    return {
        "benchmark": "data_cache",
        "machine": host_info(),
        "pipeline_version": pipeline_version(),
        "config": {"repeats": args.repeats, "loads": args.loads},
        "goal": "load >= 20x faster than featurizing from scratch",
        "datasets": datasets,
    }


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        "# Ahead-of-time feature cache: cached load vs featurizing from scratch",
        "",
        f"Date {m['date']}. Machine: {m['cpu']}, {m['usable_cpus']} usable of "
        f"{m['logical_cpus']} logical CPUs ({m['os']}); shared with other jobs, one process. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in m['versions'].items() if v)}; "
        f"pipeline {doc['pipeline_version']}.",
        "",
        "featurize = `make_features` (mmCIF + MSAs + template hits; median of "
        f"{doc['config']['repeats']}); load = `FeatureCache.load(key)` (median of "
        f"{doc['config']['loads']}, page cache warm, checksum verified); hit with key = "
        "`fetch` on a hit, which also hashes every input file. Goal: >= 20x.",
    ]
    for name, d in doc["datasets"].items():
        lines += [
            "",
            f"## {name} (`{d['root']}`)",
            "",
            "| chain | N_res | N_msa | N_templ | inputs (MB) | featurize (ms) | load (ms) "
            "| speedup | hit with key (ms) | speedup | file (MB) | compressed (MB) "
            "| compressed load (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in d["chains"]:
            lines.append(
                f"| {r['chain']} | {r['n_res']} | {r['n_msa']} | {r['n_templ']} | "
                f"{r['input_mb']:.2f} | {r['featurize_ms']:.1f} | {r['load_ms']:.2f} | "
                f"{r['speedup']:.1f}x | {r['hit_with_key_ms']:.2f} | "
                f"{r['speedup_with_key']:.1f}x | "
                f"{r['file_mb']:.2f} | {r['compressed_file_mb']:.2f} | "
                f"{r['compressed_load_ms']:.2f} |"
            )
        if d["overall_speedup"] is not None:
            lines += [
                "",
                f"Overall (sum of featurize / sum of load): **{d['overall_speedup']:.1f}x**; "
                f"with input hashing {d['overall_speedup_with_key']:.1f}x. Per chain: median "
                f"{d['median_speedup']:.1f}x, min {d['min_speedup']:.1f}x.",
            ]
        below = [r for r in d["chains"] if r["speedup"] < 20]
        if below:
            lines.append(
                "\nBelow 20x: " + ", ".join(
                    f"{r['chain']} (featurize {r['featurize_ms']:.1f} ms, N_msa {r['n_msa']})"
                    for r in below)
                + ". A load has a fixed cost of about "
                f"{min(r['load_ms'] for r in d['chains']):.1f} ms (zip directory, one .npy header "
                "per feature, sha256 of the payload), so chains that featurize in a few "
                "milliseconds (tiny MSAs) gain less; deep-MSA chains gain the most."
            )
        for chain, err in d["failed"].items():
            lines.append(f"\nFailed: {chain}: {err}")
    lines += ["", "Reproduce: `python -m benchmarks.data.cache`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="featurize runs per chain")
    p.add_argument("--loads", type=int, default=20, help="cache loads per chain")
    p.add_argument("--out", type=Path, default=RESULTS / "data")
    args = p.parse_args(argv)
    doc = run(args)
    md = markdown(doc)
    write_result(args.out / "data_cache.json", doc, md, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
