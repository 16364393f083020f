"""MSA and template search from local databases with pyhmmer (HMMER in-process).

    from fold_data.search import load_config, read_chains, run_search
    name, chains = read_chains("complex.json")
    result = run_search(chains, load_config("search.toml"), "msas/", name=name, cpus=8)

jackhmmer for protein chains and nhmmer for RNA/DNA chains against local FASTA databases
(optionally gzipped), with AF2's or AF3's parameters (:mod:`~fold_data.search.presets`);
hmmsearch for templates against a PDB SEQRES database; species pairing across chains; a result
cache. The output folders are what fold-data's loaders read (:mod:`~fold_data.search.pipeline`).
"""

from .config import DatabaseConfig, SearchConfig, TemplateConfig, load_config, make_database
from .inputs import SearchChain, read_chains
from .pipeline import ChainResult, SearchResult, run_search
from .presets import PRESETS

__all__ = ["PRESETS", "ChainResult", "DatabaseConfig", "SearchChain", "SearchConfig",
           "SearchResult", "TemplateConfig", "load_config", "make_database", "read_chains",
           "run_search"]
