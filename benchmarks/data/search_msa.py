"""MSA search with pyhmmer (fold_data.search): time per query vs database size, threads, and the
same search with the jackhmmer binary (Debian's ``hmmer``) when it is installed: same hits?

The database is every distinct sequence of the OpenFold test alignments in
``<repo>/../shared/data/openfold-testdata/alignments`` (UniRef90, UniProt, MGnify hits as
Stockholm rows, BFD/Uniclust rows of the a3m files; residues only), real proteins (about 7900);
the first N records (shuffled with a fixed seed) make the smaller databases, and larger ones are
padded with shuffled copies of real sequences (decoys with real composition and lengths, as
HMMER's own benchmarks use; a homologue search should not find them). Queries: the chains 4ZEY A,
3U8V A and 2CRB A (first row of their alignments). Parameters: AF3's jackhmmer preset
(one iteration, E 1e-4, F1/F2/F3 5e-4/5e-5/5e-7).

* ``pyhmmer 1 thread``: ``jackhmmer_rows`` per query (median of ``--repeats``), database in memory;
* ``search, cpus=C``: ``run_search`` of the three queries with C threads (no cache), wall time;
* ``jackhmmer binary``: ``jackhmmer -N 1 ... --cpu 1`` per query (median), reading the FASTA file
  each time as the binary does; hits compared with pyhmmer's (target names and domain ranges).

    python -m benchmarks.data.search_msa [--sizes 1000,4000,0,32000,64000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fold_data.msa import parse_fasta, read_stockholm_alignment
from fold_data.search import PRESETS, SearchChain, make_database, run_search
from fold_data.search.config import SearchConfig
from fold_data.search.database import load_database
from fold_data.search.jackhmmer import jackhmmer_rows

from benchmarks.common.machine import host_info
from benchmarks.common.results import REPO, RESULTS, write_result

ALIGNMENTS = REPO.parent / "shared" / "data" / "openfold-testdata" / "alignments"
QUERIES = ("4zey_A", "3u8v_A", "2crb_A")


def collect_sequences() -> dict[str, str]:
    """Distinct sequences -> a header, from every alignment file."""
    seqs: dict[str, str] = {}
    for folder in sorted(p for p in ALIGNMENTS.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir()):
            if path.name == "hmm_output.sto":
                continue
            if path.suffix == ".sto":
                ali = read_stockholm_alignment(path)
                rows = [(n, r) for n, r in list(ali.rows.items())[1:]]
            elif path.suffix == ".a3m":
                rows = parse_fasta(path)[1:]
            else:
                continue
            for name, row in rows:
                residues = "".join(c for c in row if c.isalpha()).upper()
                if len(residues) >= 20 and residues not in seqs:
                    seqs[residues] = f"{folder.name}_{path.stem}_{len(seqs)} {name.split()[0]}"
    return seqs


def query_sequence(chain: str) -> str:
    ali = read_stockholm_alignment(ALIGNMENTS / chain / "uniref90_hits.sto")
    return "".join(c for c in next(iter(ali.rows.values())) if c.isalpha()).upper()


def write_db(records: list[tuple[str, str]], path: Path) -> None:
    path.write_text("".join(f">{h}\n{s}\n" for s, h in records))


def binary_hits(query: str, db: Path, tmp: Path) -> tuple[set, float]:
    q = tmp / "q.fasta"
    q.write_text(f">query\n{query}\n")
    p = PRESETS["af3"].jackhmmer
    dom = tmp / "dom.tbl"
    cmd = ["jackhmmer", "-N", "1", "-E", str(p.e_value), "--incE", str(p.inc_e),
           "--F1", str(p.f1), "--F2", str(p.f2), "--F3", str(p.f3), "--cpu", "1", "--noali",
           "-o", "/dev/null", "--domtblout", str(dom), str(q), str(db)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    elapsed = time.perf_counter() - t0
    hits = set()
    for line in dom.read_text().splitlines():
        if line.startswith("#"):
            continue
        f = line.split()
        # target, hmm from/to, ali from/to; the domain is included when its i-Evalue <= incE
        if float(f[12]) <= p.inc_e:
            hits.add((f[0], int(f[17]), int(f[18])))
    return hits, elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,4000,0,32000,64000",
                    help="database sizes; 0 = every real sequence; more: padded with decoys")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "data"))
    args = ap.parse_args()
    if not ALIGNMENTS.is_dir():
        print(f"shared alignments not found at {ALIGNMENTS}; nothing to benchmark")
        return 0
    everything = list(collect_sequences().items())
    random.Random(0).shuffle(everything)
    queries = {c: query_sequence(c) for c in QUERIES}
    has_binary = shutil.which("jackhmmer") is not None
    version = None
    if has_binary:
        version = subprocess.run(["jackhmmer", "-h"], capture_output=True, text=True
                                 ).stdout.splitlines()[1].strip("# ").strip()
    import io
    import os

    import pyhmmer
    from pyhmmer import easel, plan7

    alphabet = easel.Alphabet.amino()
    probe = easel.TextSequence(name=b"q", sequence="MKVL").digitize(alphabet)
    hmm, _, _ = plan7.Builder(alphabet).build(probe, plan7.Background(alphabet))
    header = io.BytesIO()
    hmm.write(header)
    hmmer_inside = header.getvalue().decode().splitlines()[0].split("[", 1)[1].strip(" ]")
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for size in [int(s) for s in args.sizes.split(",")]:
            records = everything[:size] if size else everything
            rng = random.Random(size)
            while len(records) < size:  # shuffled decoys
                seq, _ = everything[rng.randrange(len(everything))]
                letters = list(seq)
                rng.shuffle(letters)
                records.append(("".join(letters), f"decoy_{len(records)}"))
            db = tmp / f"db_{len(records)}.fasta"
            write_db(records, db)
            residues = sum(len(s) for s, _ in records)
            t0 = time.perf_counter()
            database = load_database(db, "protein")
            load_s = time.perf_counter() - t0
            row = {"sequences": len(records), "residues": residues, "load_s": load_s,
                   "decoys": max(0, len(records) - len(everything)), "queries": {}}
            for chain, seq in queries.items():
                times, found = [], None
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    found = jackhmmer_rows(seq, database, PRESETS["af3"].jackhmmer)
                    times.append(time.perf_counter() - t0)
                ours = {(r.name.rsplit("/", 1)[0], *map(int, r.name.rsplit("/", 1)[1].split("-")))
                        for r in found}
                q = {"length": len(seq), "pyhmmer_s": statistics.median(times),
                     "domains": len(found)}
                if has_binary:
                    btimes, theirs = [], None
                    for _ in range(args.repeats):
                        theirs, elapsed = binary_hits(seq, db, tmp)
                        btimes.append(elapsed)
                    q.update(binary_s=statistics.median(btimes), binary_domains=len(theirs),
                             same_domains=len(ours & theirs),
                             same_targets=len({h[0] for h in ours} & {h[0] for h in theirs}),
                             targets=len({h[0] for h in ours}),
                             binary_targets=len({h[0] for h in theirs}))
                row["queries"][chain] = q
            config = SearchConfig(PRESETS["af3"], (make_database("uniref90", db, PRESETS["af3"]),))
            chains = [SearchChain(c[:4] + c[5:], "protein", s) for c, s in queries.items()]
            for cpus in (1, 2):
                t0, c0 = time.perf_counter(), time.process_time()
                run_search(chains, config, tmp / f"out_{cpus}", cpus=cpus, cache_dir=None)
                row[f"search_cpus{cpus}_s"] = time.perf_counter() - t0
                # CPU seconds of this process (all threads) per wall second: ~C when the C
                # threads really run at once (pyhmmer releases the GIL), whatever the wall time
                row[f"search_cpus{cpus}_busy"] = (time.process_time() - c0) / (
                    time.perf_counter() - t0)
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {"machine": host_info(), "pyhmmer": pyhmmer.__version__,
           "pyhmmer_hmmer": hmmer_inside, "jackhmmer": version, "preset": "af3 jackhmmer",
           "load_average": [load_before, os.getloadavg()[0]], "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "data_search_msa.json", doc, markdown(doc), indent=2)
    return 0


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = ["# MSA search: pyhmmer (fold_data.search) vs database size and the jackhmmer binary",
             "",
             f"Machine: {m['cpu']}, {m['usable_cpus']} usable of {m['logical_cpus']} logical "
             f"CPUs, shared with other jobs (1-minute load average {doc['load_average'][0]:.1f} "
             f"before, {doc['load_average'][1]:.1f} after). pyhmmer {doc['pyhmmer']} (HMMER "
             f"{doc['pyhmmer_hmmer']}); binary: "
             f"{doc['jackhmmer'] or 'not installed'}. Preset: AF3 jackhmmer (1 iteration, "
             "E 1e-4). Database: distinct real sequences of the OpenFold test alignments "
             "(UniRef90/UniProt/MGnify/BFD hits), first N after a fixed shuffle; larger sets "
             "padded with shuffled decoys. Times are "
             "medians; pyhmmer searches a database already in memory, the binary reads the "
             "FASTA each run.", "",
             "| sequences | residues (M) | load (s) | query | L | pyhmmer 1 thread (s) | "
             "binary --cpu 1 (s) | domains pyhmmer / binary / same | targets same |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        label = f"{r['sequences']}" + (f" ({r['decoys']} decoys)" if r.get("decoys") else "")
        for chain, q in r["queries"].items():
            binary = (f"{q['binary_s']:.3f}", f"{q['domains']} / {q['binary_domains']} / "
                      f"{q['same_domains']}", f"{q['same_targets']} of {q['targets']} / "
                      f"{q['binary_targets']}") if "binary_s" in q else ("-", "-", "-")
            lines.append(f"| {label} | {r['residues'] / 1e6:.2f} | {r['load_s']:.2f} "
                         f"| {chain} | {q['length']} | {q['pyhmmer_s']:.3f} | {binary[0]} | "
                         f"{binary[1]} | {binary[2]} |")
    qs = [q for r in doc["rows"] for q in r["queries"].values() if "binary_s" in q]
    if qs:
        superset = all(q["same_domains"] == q["binary_domains"] for q in qs)
        extra = sum(q["domains"] - q["same_domains"] for q in qs)
        total = sum(q["binary_domains"] for q in qs)
        ratio = statistics.median(q["pyhmmer_s"] / q["binary_s"] for q in qs)
        lines += ["", f"Same hits? Every domain the binary includes is found by pyhmmer with the "
                  f"same target and range: {'yes' if superset else 'no'} "
                  f"({sum(q['same_domains'] for q in qs)} of {total}); pyhmmer includes {extra} "
                  "more in all (different HMMER versions). Time pyhmmer / binary, median over "
                  f"rows: {ratio:.2f}."]
    lines += ["", "Three queries through `run_search` (no cache), wall time:", "",
              "| sequences | cpus=1 (s) | cpus=2 (s) | speed-up | CPU s per wall s, cpus=1 / 2 |",
              "|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['sequences']} | {r['search_cpus1_s']:.2f} | "
                     f"{r['search_cpus2_s']:.2f} | "
                     f"{r['search_cpus1_s'] / r['search_cpus2_s']:.2f}x | "
                     f"{r['search_cpus1_busy']:.2f} / {r['search_cpus2_busy']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
