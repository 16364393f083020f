"""AF3 ahead-of-time cache (MegaFold III, IV-A): per-sample preparation from scratch vs from cache.

For every AF3 example in ``<repo>/../shared/data/af3-examples`` (8 mmCIF complexes, 5 AlphaFold3
input JSONs) and the protein-DNA entry 2Q2K of ``openfold-testdata`` (with its MSAs):

* ``scratch``: parse the input, build RDKit molecules and ETKDGv3 reference conformers (the
  per-process conformer memo cleared first, so nothing is reused between samples), MSA and
  template features (``fold_data.af3.make_features``), then one training sample
  (``make_sample(raw, "af3_initial")``: crop to 384 tokens, MSA rows, conformer rotations);
* ``cached``: ``FeatureCache.load(key)`` of the stored raw features (checksum verified) and the same
  ``make_sample``; the key is computed once, as a training loader keeps it in its index;
* the medians of ``--repeats`` runs, their ratio, and the cache file size per entry.

The CCD (biotite's BinaryCIF) is loaded once per process before timing and reported on its own:
a training worker pays it once, not per sample.

    python -m benchmarks.data.af3_cache [--repeats 3] [--out benchmarks/results/data]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fold_data.af3 import af3_cache, default_ccd, fetch_af3_features, make_features, make_sample
from fold_data.af3.conformers import clear_conformer_memo

from benchmarks.common.machine import host_info
from benchmarks.common.results import REPO, RESULTS, write_atomic

SHARED = REPO.parent / "shared" / "data"
PRESET = "af3_initial"


def inputs() -> list[tuple[str, Path, dict]]:
    af3 = SHARED / "af3-examples"
    out = [(p.name, p, {}) for p in sorted((af3 / "biotite-structures").glob("*.cif"))]
    out += [(p.name, p, {}) for p in sorted((af3 / "alphafold3-inputs").glob("*.json"))]
    of = SHARED / "openfold-testdata"
    if (of / "mmcifs" / "2q2k.cif").is_file():
        aln = of / "alignments"
        msas = {c: [aln / f"2q2k_{c}" / f for f in ("bfd_uniclust_hits.a3m", "uniref90_hits.sto",
                                                    "mgnify_hits.sto")] for c in ("A", "B")}
        out.append(("2q2k.cif (openfold, MSAs)", of / "mmcifs" / "2q2k.cif", {"msa_paths": msas}))
    return out


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "data")
    args = ap.parse_args(argv)
    entries = inputs()
    if not entries:
        print(f"no AF3 examples under {SHARED}", file=sys.stderr)
        return 1
    ccd = default_ccd()
    t0 = time.perf_counter()
    ccd.get("ALA")
    ccd_load = time.perf_counter() - t0

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = af3_cache(tmp)
        for name, path, kwargs in entries:
            def scratch(path=path, kwargs=kwargs):
                clear_conformer_memo()
                make_sample(make_features(path, ccd=ccd, **kwargs), PRESET, seed=0)

            result = fetch_af3_features(cache, path, ccd=ccd, **kwargs)  # fills the cache
            key = result.key

            def cached(key=key):
                make_sample(cache.load(key), PRESET, seed=0)

            def features_only(path=path, kwargs=kwargs):
                clear_conformer_memo()
                make_features(path, ccd=ccd, **kwargs)

            t_scratch = median_time(scratch, args.repeats)
            t_cached = median_time(cached, args.repeats)
            t_feat = median_time(features_only, args.repeats)
            t_load = median_time(lambda key=key: cache.load(key), args.repeats)
            f = result.features
            rows.append({
                "entry": name,
                "tokens": int(len(f["restype"])),
                "atoms": int(len(f["ref_pos"])),
                "msa_rows": int(f["msa"].shape[0]),
                "scratch_s": t_scratch,
                "cached_s": t_cached,
                "speedup": t_scratch / t_cached,
                "features_s": t_feat,
                "load_s": t_load,
                "load_speedup": t_feat / t_load,
                "cache_bytes": result.path.stat().st_size,
            })
            r = rows[-1]
            print(f"{name:32s} {r['tokens']:5d} tok {r['atoms']:6d} at  scratch "
                  f"{r['scratch_s'] * 1e3:8.1f} ms  cached {r['cached_s'] * 1e3:7.1f} ms  "
                  f"x{r['speedup']:5.1f}  (features x{r['load_speedup']:6.1f})  "
                  f"{r['cache_bytes'] / 1e6:6.2f} MB", flush=True)

    total_scratch = sum(r["scratch_s"] for r in rows)
    total_cached = sum(r["cached_s"] for r in rows)
    summary = {
        "entries": len(rows),
        "ccd_load_s": ccd_load,
        "scratch_total_s": total_scratch,
        "cached_total_s": total_cached,
        "speedup_total": total_scratch / total_cached,
        "speedup_median": statistics.median(r["speedup"] for r in rows),
        "speedup_min": min(r["speedup"] for r in rows),
        "cache_bytes_mean": statistics.mean(r["cache_bytes"] for r in rows),
        "cache_bytes_per_token_mean": statistics.mean(r["cache_bytes"] / r["tokens"] for r in rows),
    }
    doc = {"benchmark": "data_af3_cache", "preset": PRESET, "repeats": args.repeats,
           "machine": host_info(), "summary": summary, "rows": rows}
    write_atomic(args.out / "data_af3_cache.json", json.dumps(doc, indent=1))
    lines = [
        "# AF3 data stage: from scratch vs from the ahead-of-time cache",
        "",
        f"`python -m benchmarks.data.af3_cache --repeats {args.repeats}`; preset `{PRESET}`; "
        f"medians per sample. Machine: {host_info()}.",
        "",
        "scratch = parse + RDKit molecules + ETKDGv3 conformers + MSA/template features + "
        "make_sample; cached = cache load (checksum verified) + make_sample. "
        f"CCD load (once per process, not per sample): {ccd_load:.2f} s.",
        "",
        "| entry | tokens | atoms | MSA rows | scratch (ms) | cached (ms) | speedup | "
        "features vs load | cache size (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['entry']} | {r['tokens']} | {r['atoms']} | {r['msa_rows']} | "
                     f"{r['scratch_s'] * 1e3:.1f} | {r['cached_s'] * 1e3:.1f} | "
                     f"{r['speedup']:.1f}x | {r['load_speedup']:.0f}x | "
                     f"{r['cache_bytes'] / 1e6:.2f} |")
    lines += [
        "",
        f"Total over {len(rows)} entries: scratch {total_scratch:.2f} s, cached "
        f"{total_cached:.2f} s: **{summary['speedup_total']:.1f}x** (median per entry "
        f"{summary['speedup_median']:.1f}x, min {summary['speedup_min']:.1f}x; MegaFold reports "
        "3.34x for its data stage end to end). Mean cache size per entry "
        f"{summary['cache_bytes_mean'] / 1e6:.2f} MB "
        f"({summary['cache_bytes_per_token_mean'] / 1e3:.1f} kB per token).",
        "",
    ]
    write_atomic(args.out / "data_af3_cache.md", "\n".join(lines))
    print("\n".join(lines[-3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
