"""``fold-data msa``: search the chains of a FASTA / AF3 JSON / mmCIF against local databases.

    fold-data msa INPUT --out DIR (--config search.toml | --db uniref90=PATH ...)
                  [--preset af2|af3] [--seqres pdb_seqres.txt [--template-mmcif-dir DIR]
                  [--max-template-date YYYY-MM-DD]] [--cpus N] [--cache-dir DIR | --no-cache]
                  [--hash-databases] [--no-templates] [--no-progress]

Prints a JSON summary (files per chain, rows per database, cache hits); exit status 1 on bad
input (the message names the file, record and what was expected).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json

from .config import build_config
from .inputs import read_chains
from .pipeline import run_search

__all__ = ["add_msa_parser", "cmd_msa", "search_from_args"]


def _db(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _date(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date YYYY-MM-DD, got {text!r}") from None


def add_search_options(p: argparse.ArgumentParser) -> None:
    """The database and search options (shared with ``fold-train predict --search``)."""
    p.add_argument("--config", metavar="TOML", help="search config (databases, preset, "
                   "templates; see fold_data.search.config)")
    p.add_argument("--db", type=_db, action="append", default=[], metavar="NAME=PATH",
                   help="a FASTA database (optionally .gz) under a name the preset knows "
                        "(uniref90, mgnify, small_bfd, uniprot = pairing; af3 also rfam, "
                        "rnacentral, nt_rna); repeat for more")
    p.add_argument("--preset", choices=("af2", "af3"), help="search parameters (default af3)")
    p.add_argument("--seqres", metavar="FASTA", help="PDB SEQRES database: template search")
    p.add_argument("--template-mmcif-dir", metavar="DIR",
                   help="mmCIFs of the templates (release dates for --max-template-date)")
    p.add_argument("--max-template-date", type=_date, metavar="YYYY-MM-DD",
                   help="drop template hits released after this date")
    p.add_argument("--cpus", type=int, default=None,
                   help="searches run in parallel (default: min(8, CPUs))")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="result cache (default: OUT/cache; nothing is written outside OUT)")
    p.add_argument("--no-cache", action="store_true", help="search again, cache nothing")
    p.add_argument("--hash-databases", action="store_true",
                   help="key the cache on each database's SHA-256 (default: size and mtime)")


def search_from_args(args: argparse.Namespace, input_path, out_dir, *, progress: bool):
    config = build_config(args.config, preset=args.preset, databases=dict(args.db),
                          seqres=args.seqres, mmcif_dir=args.template_mmcif_dir,
                          max_template_date=args.max_template_date)
    name, chains = read_chains(input_path)
    cache = None if args.no_cache else (args.cache_dir or True)
    return run_search(chains, config, out_dir, name=name, cpus=args.cpus, cache_dir=cache,
                      hash_databases=args.hash_databases,
                      templates=not getattr(args, "no_templates", False), progress=progress)


def cmd_msa(args: argparse.Namespace) -> int:
    result = search_from_args(args, args.input, args.out, progress=args.progress)
    print(json.dumps(result.summary(), indent=2))
    return 0


def add_msa_parser(sub) -> None:
    p = sub.add_parser(
        "msa", help="MSA and template search against local databases (pyhmmer)",
        description="jackhmmer (protein) / nhmmer (RNA, DNA) for every chain of INPUT against "
                    "local FASTA databases with AF2's or AF3's parameters, species pairing "
                    "across chains, hmmsearch templates against a PDB SEQRES database. Writes "
                    "OUT/<name>_<chain>/<db>_hits.a3m, hmm_output.sto, OUT/paired/, "
                    "OUT/search.json; OUT reads as an alignments/ folder.")
    p.add_argument("input", metavar="INPUT", help="FASTA, AlphaFold3 input JSON or mmCIF")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_search_options(p)
    p.add_argument("--no-templates", action="store_true", help="no template search")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.set_defaults(func=cmd_msa)
