"""The ahead-of-time cache for AF3 entries (MegaFold IV-A), over the generic FeatureCache.

Same guarantees as AF2 entries: one ``.npz`` per entry keyed by a sha256 over the pipeline
version, the build parameters and every input file's name and bytes; atomic writes; a payload
checksum verified on load (a corrupt entry is deleted and rebuilt); read without pickle.

AF3 entries never collide with AF2 ones: the version string is ``...+af3-raw-N`` (not AF2's) and
the parameters carry ``"pipeline": "af3"``. The CCD is part of the key through
:attr:`Ccd.identity` (user files by name, size and mtime; biotite's file by size), not its bytes:
hashing 63 MB per lookup would cost more than the lookup saves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import fold_data
from fold_data.cache import CacheResult, FeatureCache

if TYPE_CHECKING:  # the parsers (gemmi) load on a miss, not to read a built cache
    from .ccd import Ccd
    from .filters import ChainFilters
    from .parse import Entry

__all__ = ["AF3_PIPELINE_VERSION", "af3_cache", "af3_pipeline_version", "fetch_af3_features"]

# Bump whenever make_features' output changes for the same inputs.
AF3_PIPELINE_VERSION = "af3-raw-2"  # 2: token_pseudo_beta_atom


def af3_pipeline_version() -> str:
    return f"fold-data-{fold_data.__version__}+{AF3_PIPELINE_VERSION}"


def af3_cache(root: str | os.PathLike, *, compress: bool = False) -> FeatureCache:
    """A :class:`FeatureCache` under the AF3 pipeline version."""
    return FeatureCache(root, version=af3_pipeline_version(), compress=compress)


def _input_files(source: Path, msa_paths: Mapping[str, list], template_hits: Mapping[str, Any],
                 pairing: Mapping[str, Any]):
    files = [source]
    for cid in sorted(msa_paths):
        files += [Path(p) for p in msa_paths[cid]]
    files += [Path(pairing[cid]) for cid in sorted(pairing)]
    for cid in sorted(template_hits):
        if isinstance(template_hits[cid], str | os.PathLike):
            files.append(Path(template_hits[cid]))
    return files


def fetch_af3_features(
    cache: FeatureCache,
    source: str | os.PathLike,
    *,
    ccd: Ccd | None = None,
    msa_paths: Mapping[str, list] | None = None,
    template_hits: Mapping[str, str | os.PathLike] | None = None,
    pairing_msa_paths: Mapping[str, str | os.PathLike] | None = None,
    entry: Entry | None = None,
    chain_filters: ChainFilters | None = None,
    rebuild: bool = False,
    **kwargs: Any,
) -> CacheResult:
    """Raw AF3 features of the input file ``source`` from ``cache``, built on a miss.

    ``kwargs`` go to :func:`fold_data.af3.make_features` and into the key (JSON-serializable
    values; ``template_mmcif_dir`` is left out of the key like AF2's: archive files taken as
    immutable). User MSA / template files named inside an AF3 JSON are not hashed separately:
    change the JSON (or pass ``rebuild=True``) when they change. ``pairing_msa_paths``: per
    chain the pairing database hits (hashed; :func:`fold_data.af3.make_features`). ``entry``:
    ``source`` already parsed (the training directory reads it to find its alignments), so it
    is featurised without a second parse; the key is still over ``source``'s bytes.
    ``chain_filters``: AF3's training filters (:func:`fold_data.af3.filters.filter_chains`)
    applied to the entry before it is featurised, their settings part of the key (``entry``
    may already be filtered by them: filtering again removes nothing more).
    """
    from .ccd import default_ccd

    ccd = ccd or default_ccd()
    source = Path(source)
    msa_paths = dict(msa_paths or {})
    template_hits = dict(template_hits or {})
    pairing = {k: os.fspath(v) for k, v in (pairing_msa_paths or {}).items()}
    params = {
        "pipeline": "af3",
        "ccd": ccd.identity,
        "msa_chains": sorted(msa_paths),
        "template_chains": sorted(template_hits),
        **({"pairing_chains": sorted(pairing)} if pairing else {}),
        **({"chain_filters": chain_filters.params()} if chain_filters is not None else {}),
        **{k: (os.fspath(v) if isinstance(v, os.PathLike) else v)
           for k, v in kwargs.items() if k != "template_mmcif_dir"},
    }

    def build() -> dict[str, np.ndarray]:
        from .features import load_entry, make_features

        parsed = entry if entry is not None else load_entry(source, ccd=ccd)
        if chain_filters is not None:
            from .filters import filter_chains

            parsed = filter_chains(parsed, chain_filters, ccd).entry
        return make_features(parsed, ccd=ccd,
                             msa_paths=msa_paths, template_hits=template_hits,
                             pairing_msa_paths=pairing, **kwargs)

    return cache.fetch(source.stem, _input_files(source, msa_paths, template_hits, pairing),
                       params, build, rebuild=rebuild)
