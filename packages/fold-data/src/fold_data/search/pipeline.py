"""Run the searches of a set of chains and write the files fold-data's loaders read.

Layout under ``out_dir`` (``<name>_<chain>`` folders, as ``alignments/<pdb>_<chain>/``, so
``fold-data cache`` reads ``out_dir`` like an ``alignments`` folder)::

    <name>_<chain>/<db>_hits.a3m          one per unpaired database (jackhmmer / nhmmer)
    <name>_<chain>/hmm_output.sto         template hits (hmmsearch), protein chains
    pairing/<name>_<chain>/<db>_hits.a3m  hits in the pairing database (UniProt)
    paired/<name>_<chain>.a3m             rows paired by species; row i of every chain's file
                                          comes from one species (two or more entities)
    search.json                           what was written, per chain

Identical sequences are searched once. Every (sequence, database) search is one task; tasks run
on ``cpus`` threads (pyhmmer releases the GIL while it searches). Results are cached (see
:mod:`fold_data.search.cache`): the cache defaults to ``out_dir/cache``, so nothing is written
outside ``out_dir`` unless another cache folder is named. All files are written atomically.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from fold_data.errors import InputError

from .cache import ResultCache, file_sha256
from .config import DatabaseConfig, SearchConfig
from .database import database_signature, load_database
from .files import write_atomic
from .hits import A3mRow, dedup_and_cap, to_a3m
from .inputs import SearchChain, check_chain
from .jackhmmer import jackhmmer_rows
from .nhmmer import nhmmer_rows
from .pairing import pair_by_species
from .templates import template_search

__all__ = ["ChainResult", "SearchResult", "run_search"]

TEMPLATE_FILE = "hmm_output.sto"


@dataclass
class ChainResult:
    chain_id: str
    molecule: str
    sequence: str
    folder: Path
    msa_paths: list[Path] = field(default_factory=list)
    paired_path: Path | None = None
    template_hits: Path | None = None
    rows: dict[str, int] = field(default_factory=dict)  # database -> rows written (no query)
    templates: int = 0


@dataclass
class SearchResult:
    chains: dict[str, ChainResult]
    cache_hits: int
    cache_misses: int
    seconds: float

    def summary(self) -> dict:
        return {"seconds": round(self.seconds, 3), "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
                "chains": {cid: {"molecule": r.molecule, "length": len(r.sequence),
                                 "msas": [str(p) for p in r.msa_paths],
                                 "paired": str(r.paired_path) if r.paired_path else None,
                                 "template_hits": (str(r.template_hits) if r.template_hits
                                                   else None),
                                 "rows": r.rows, "templates": r.templates}
                           for cid, r in self.chains.items()}}


def _rows_to_json(rows: list[A3mRow]) -> str:
    return json.dumps([[r.name, r.description, r.row, r.evalue] for r in rows])


def _rows_from_json(text: str) -> list[A3mRow]:
    return [A3mRow(name, desc, row, float(evalue)) for name, desc, row, evalue in json.loads(text)]


class _Runner:
    def __init__(self, config: SearchConfig, cache: ResultCache, hash_databases: bool):
        self.config = config
        self.cache = cache
        self.hash_databases = hash_databases
        self.signatures: dict[str, dict] = {}

    def signature(self, path: Path) -> dict:
        key = os.fspath(path)
        if key not in self.signatures:
            sig = database_signature(path)
            if self.hash_databases:
                sig = {"path": sig["path"], "sha256": file_sha256(path, sig)}
            self.signatures[key] = sig
        return self.signatures[key]

    def msa(self, chain: SearchChain, db: DatabaseConfig) -> list[A3mRow]:
        """Capped, deduplicated rows of one (sequence, database) search, through the cache."""
        preset = self.config.preset
        params = preset.jackhmmer if db.molecule == "protein" else preset.nhmmer
        if db.z_value is not None:
            params = replace(params, z_value=db.z_value)
        key = self.cache.key(kind="msa", molecule=chain.molecule, sequence=chain.sequence,
                             database=self.signature(db.path), params=params,
                             max_hits=db.max_hits)
        cached = self.cache.get(key, "json")
        if cached is not None:
            return _rows_from_json(cached)
        database = load_database(db.path, db.molecule)
        if chain.molecule == "protein":
            rows = jackhmmer_rows(chain.sequence, database, params)
        else:
            rows = nhmmer_rows(chain.sequence, chain.molecule, database, params)
        if db.pairing:  # AF3 keeps every pairing row (deduplicate=False): species matter
            rows = rows[:db.max_hits] if db.max_hits is not None else rows
        else:
            rows = dedup_and_cap(rows, db.max_hits, query=chain.sequence)
        self.cache.put(key, "json", _rows_to_json(rows))
        return rows

    def templates(self, chain: SearchChain, rows: list[A3mRow]) -> tuple[str, int]:
        t = self.config.templates
        params = self.config.preset.hmmsearch
        aligned = [r.aligned for r in rows]
        if self.config.preset.template_profile_max_rows is not None:
            aligned = aligned[:self.config.preset.template_profile_max_rows]
        key = self.cache.key(kind="templates", sequence=chain.sequence, rows=aligned,
                             database=self.signature(t.seqres), params=params,
                             max_template_date=t.max_template_date,
                             mmcif_dir=os.fspath(Path(t.mmcif_dir).resolve()) if t.mmcif_dir
                             else None)
        cached = self.cache.get(key, "json")
        if cached is not None:
            doc = json.loads(cached)
            return doc["sto"], doc["hits"]
        seqres = load_database(t.seqres, "protein")
        text, count = template_search(chain.sequence, aligned, seqres, params,
                                      max_template_date=t.max_template_date,
                                      mmcif_dir=t.mmcif_dir)
        self.cache.put(key, "json", json.dumps({"sto": text, "hits": count}))
        return text, count


def _check_databases(config: SearchConfig, chains: Sequence[SearchChain]) -> None:
    """Fail before any search when a database file (or the template mmCIF folder) is missing;
    a database that is not FASTA fails when it is first read, before anything is written."""
    molecules = {c.molecule for c in chains}
    for db in config.databases:
        if db.molecule in molecules or (db.molecule in ("rna", "dna")
                                        and molecules & {"rna", "dna"}):
            database_signature(db.path)
    if config.templates is not None and "protein" in molecules:
        database_signature(config.templates.seqres)
        if config.templates.mmcif_dir is not None and not Path(
                config.templates.mmcif_dir).is_dir():
            raise InputError(config.templates.mmcif_dir, None, "template mmCIF folder not found")


def run_search(
    chains: Sequence[SearchChain],
    config: SearchConfig,
    out_dir: str | os.PathLike,
    *,
    name: str = "query",
    cpus: int | None = None,
    cache_dir: str | os.PathLike | None | bool = True,
    hash_databases: bool = False,
    templates: bool = True,
    progress: bool | Callable[[str, str], None] = False,
) -> SearchResult:
    """Search every chain against the config's databases and write the files (module docstring).

    ``cache_dir``: True (default) -> ``out_dir/cache``; a path; None/False -> no cache.
    ``hash_databases``: key the cache on each database's SHA-256 instead of its size and mtime.
    ``progress``: True for a tqdm bar over (chain, database) tasks, or a callable called with
    (chain ID, database name) as each task finishes.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    chains = [check_chain(c, None) for c in chains]
    if len({c.chain_id for c in chains}) != len(chains):
        raise InputError(None, "chains", "duplicate chain IDs; expected one per chain")
    if not chains:
        raise InputError(None, "chains", "no chains to search")
    _check_databases(config, chains)
    if cache_dir is True:
        cache_dir = out / "cache"
    cache = ResultCache(cache_dir or None)
    runner = _Runner(config, cache, hash_databases)
    cpus = cpus or min(os.cpu_count() or 1, 8)

    unique: dict[tuple[str, str], SearchChain] = {}
    for c in chains:
        unique.setdefault((c.molecule, c.sequence), c)
    owners = {key: [c.chain_id for c in chains if (c.molecule, c.sequence) == key]
              for key in unique}
    tasks = [(key, db) for key, c in unique.items() for db in config.for_molecule(c.molecule)]
    if not tasks:
        raise InputError(config.source, "databases", "no database for the chains' molecule "
                         f"types ({', '.join(sorted({c.molecule for c in chains}))})")
    searching_templates = templates and config.templates is not None
    n_templates = sum(c.molecule == "protein" for c in unique.values()) if searching_templates \
        else 0
    bar = None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks) + n_templates, unit="search", desc="msa")

    def done(key, label: str) -> None:
        chain_ids = ",".join(owners[key])
        if bar is not None:
            bar.set_postfix_str(f"chain {chain_ids} · {label}")
            bar.update(1)
        elif callable(progress):
            progress(chain_ids, label)

    def run_task(task):
        key, db = task
        rows = runner.msa(unique[key], db)
        done(key, db.name)
        return task, rows

    results: dict[tuple, dict[str, list[A3mRow]]] = {key: {} for key in unique}
    try:
        with ThreadPoolExecutor(max_workers=cpus) as pool:
            for (key, db), rows in pool.map(run_task, tasks):
                results[key][db.name] = rows
            template_jobs = {}
            if searching_templates:
                for key, c in unique.items():
                    if c.molecule == "protein":
                        merged = _merged_unpaired(c, config, results[key])
                        template_jobs[key] = pool.submit(runner.templates, c, merged)
            template_out = {}
            for key, fut in template_jobs.items():
                template_out[key] = fut.result()
                done(key, "templates")
    finally:
        if bar is not None:
            bar.close()

    chain_results = _write(out, name, chains, config, results, template_out)
    paired = _pair(chains, config, results)
    for cid, rows in paired.items():
        r = chain_results[cid]
        r.paired_path = write_atomic(out / "paired" / f"{r.folder.name}.a3m",
                                     to_a3m("query", r.sequence, rows))
    result = SearchResult(chain_results, cache.hits, cache.misses, time.perf_counter() - start)
    write_atomic(out / "search.json", json.dumps(result.summary(), indent=2) + "\n")
    return result


def _merged_unpaired(chain: SearchChain, config: SearchConfig,
                     rows: dict[str, list[A3mRow]]) -> list[A3mRow]:
    """The unpaired rows in the preset's merge order, deduplicated across databases (AF3
    builds its template profile from this MSA)."""
    seen: set[str] = set()
    merged = []
    for db in config.for_molecule(chain.molecule):
        if not db.pairing:
            merged += dedup_and_cap(rows.get(db.name, []), None, query=chain.sequence, seen=seen)
    return merged


def _write(out: Path, name: str, chains, config: SearchConfig, results, template_out):
    chain_results = {}
    for c in chains:
        key = (c.molecule, c.sequence)
        folder = out / f"{name}_{c.chain_id}"
        r = ChainResult(c.chain_id, c.molecule, c.sequence, folder)
        for db in config.for_molecule(c.molecule):
            rows = results[key].get(db.name, [])
            target = (out / "pairing" / folder.name if db.pairing else folder)
            path = write_atomic(target / f"{db.name}_hits.a3m", to_a3m("query", c.sequence, rows))
            r.rows[db.name] = len(rows)
            if not db.pairing:
                r.msa_paths.append(path)
        if key in template_out:
            text, count = template_out[key]
            r.template_hits = write_atomic(folder / TEMPLATE_FILE, text)
            r.templates = count
        chain_results[c.chain_id] = r
    return chain_results


def _pair(chains, config: SearchConfig, results) -> dict[str, list[A3mRow]]:
    pairing_dbs = [d for d in config.databases if d.pairing]
    proteins = [c for c in chains if c.molecule == "protein"]
    if not pairing_dbs or len({c.sequence for c in proteins}) < 2:
        return {}
    rows = {c.chain_id: (c.sequence, [r for d in pairing_dbs
                                      for r in results[(c.molecule, c.sequence)].get(d.name, [])])
            for c in proteins}
    return pair_by_species(rows)
