"""``fold-train predict --search TOML``: MSA and template search before prediction.

The query (``--fasta``'s first record, ``--mmcif``'s ``--chain``, or the chains of ``--json``
that name no MSA of their own) is searched with :mod:`fold_data.search` against the databases of
the search config; the files land in ``--search-out`` (default: ``<output name>_search/`` beside
the output mmCIF) and feed the prediction as ``--msa`` / ``--templates`` would. Searching is
refused when MSAs are given (``--msa``), as AF3's pipeline searches only when no MSA is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["apply_search", "search_out_dir"]


def search_out_dir(args: argparse.Namespace) -> Path:
    if args.search_out:
        return Path(args.search_out)
    source = Path(args.fasta or args.mmcif or args.json)
    if args.out:
        stem = Path(args.out).with_suffix("")
    elif getattr(args, "out_dir", None):  # inside the directory the user named
        stem = Path(args.out_dir) / source.stem
    else:
        stem = Path(source.stem)
    return stem.parent / f"{stem.name}_search"


def _json_chains_with_msas(path: Path) -> set[str]:
    """IDs of the JSON's chains that bring their own unpaired MSA (not searched)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    have = set()
    for item in doc.get("sequences", []):
        for body in item.values():
            if isinstance(body, dict) and ({"unpairedMsa", "unpairedMsaPath"} & set(body)):
                ids = body.get("id")
                have.update([ids] if isinstance(ids, str) else ids or [])
    return have


def apply_search(args: argparse.Namespace) -> dict:
    """Run the search; set ``args.msa`` / ``args.templates`` / ``args.template_mmcif_dir``
    (AF2 inputs) or return the AF3 feature arguments (``--json``). Returns the search summary
    under ``"search"`` plus, for AF3, ``"features"``."""
    from fold_data.errors import InputError
    from fold_data.search import SearchChain, read_chains, run_search
    from fold_data.search.config import build_config

    from fold_train.config import ConfigError

    if args.msa:
        raise ConfigError("--search runs when no MSA is given: drop --msa or --search")
    config = build_config(args.search)
    out = search_out_dir(args)
    if args.json:
        name, chains = read_chains(args.json)
        own = _json_chains_with_msas(Path(args.json))
        chains = [c for c in chains if c.chain_id not in own]
    elif args.fasta:
        name, chains = read_chains(args.fasta)
        chains = chains[:1]
    else:
        from fold_data.mmcif import parse_mmcif

        if args.chain is None:
            raise InputError(args.mmcif, None, "expected a chain ID (--chain) for an mmCIF input")
        chain = parse_mmcif(args.mmcif).get_chain(args.chain)
        name = Path(args.mmcif).stem
        chains = [SearchChain(chain.author_chain_id, "protein", chain.sequence)]
    result = run_search(chains, config, out, name=name, progress=sys.stderr.isatty())
    mmcif_dir = args.template_mmcif_dir or (config.templates.mmcif_dir if config.templates
                                            else None)
    report = {"search": {"out": str(out), "cache_hits": result.cache_hits,
                         "seconds": round(result.seconds, 3)}}
    if args.json:
        report["features"] = {
            "msa_paths": {c: r.msa_paths for c, r in result.chains.items()},
            "paired_msa_paths": {c: r.paired_path for c, r in result.chains.items()
                                 if r.paired_path},
            "template_hits": ({c: r.template_hits for c, r in result.chains.items()
                               if r.template_hits} if mmcif_dir else {}),
            "template_mmcif_dir": mmcif_dir}
        return report
    (chain,) = result.chains.values()
    args.msa = [str(p) for p in chain.msa_paths]
    if chain.template_hits is not None and mmcif_dir is not None and not args.templates:
        args.templates, args.template_mmcif_dir = str(chain.template_hits), str(mmcif_dir)
    return report
