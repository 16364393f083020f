"""AF3 training data: a directory of mmCIF complexes and their alignments -> fold-data's AF3
cache -> a weighted sample stream.

The training directory (``--data``; the layout of :mod:`fold_data.af3.alignments`)::

    <data>/mmcifs/<entry>.cif                   one training entry per complex (ground truth)
    <data>/alignments/<entry>_<chain>/          per protein / RNA chain (author chain ID) ...
    <data>/alignments/<sha256 of sequence>/     ... or per sequence:
        *.a3m, *.sto (unpaired MSAs), uniprot_hits.sto (paired across chains by species),
        hmm_output.sto or *.hhr (template hits)
    <data>/template_mmcifs/                     template structures (then <data>/mmcifs/)

(the directory itself may hold the ``*.cif`` files instead of ``mmcifs/``). Each complex's raw
AF3 features (tokens, atoms, CCD reference conformers, bonds, MSA rows, templates) are built
once with ``fold_data.af3.fetch_af3_features`` into the AF3 cache (content-hashed over the mmCIF
and every alignment file, written atomically, checksummed) under ``<cache_dir>/af3`` (its own
index, so an AF2 cache in the same directory is untouched). Templates are those released before
the entry (the day before its release date, so the entry is never its own template).

Before featurisation each complex goes through AF3's per-chain training filters (supplement
2.5.4, :mod:`fold_data.af3.filters`: polymer chains with fewer than 4 resolved residues, with
only unknown residues or with consecutive CA atoms more than 10 A apart, clashing chains,
crystallization aids of crystallographic entries, ligands bonded to a removed chain); their
settings are part of the cache key. The cache report (printed, and
``<cache_dir>/af3/cache_report.json``): per entry its status, MSA depth, paired rows and
templates, and per filter the chains it removed (and the resolved atoms the tokenizer drops:
outside the CCD's atom names, leaving atoms), with one line per filter over all entries; a
protein or RNA chain without alignments keeps its query row and is named there with a warning,
never a silent hole. ``<cache_dir>/af3/sampling_index.json``
keeps what AF3's weighted sampling and filters need of each entry (chains, sequences,
interfaces, resolution, release date; :mod:`fold_data.af3.sampling`), so ``--cache`` alone can
train with them.

The sample stream: with the data preset's ``sampling="weighted"`` (the ``af3`` preset) the
entries are filtered (``max_resolution``, ``max_release_date``, ``max_polymer_chains``) and each
step draws a chain or an interface with AF3's weights (supplement 2.5) and crops around it;
``"uniform"`` (``af3_tiny``) takes the entries in seeded epochs. The per-step transforms (crop,
MSA row sampling, conformer rotation) run in the loader workers through
:class:`fold_train.data.SampleStream` with ``family="af3"``.

AF3 input JSONs have no ground truth, so they are prediction inputs (``fold-train predict
--json``), not training entries; a data directory holding only JSONs is an error that says so.

The CCD: ``ccd_files`` (CCD mmCIF files or directories of them) are searched first, then
biotite's shipped CCD when it is installed (:class:`fold_data.af3.Ccd`).
"""

from __future__ import annotations

import datetime
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fold_data.af3 import AF3DataPreset
from fold_data.af3 import get_preset as get_af3_preset
from fold_data.errors import InputError, InputWarning
from fold_data.limits import use_limits
from fold_data.readers import MMCIF_SUFFIXES, file_suffix

if TYPE_CHECKING:  # the parsers (gemmi, RDKit) load only to build the cache
    from fold_data.af3 import Ccd

__all__ = ["AF3_TINY_DATA", "af3_cache_dir", "af3_data_preset", "discover_complexes", "make_ccd",
           "open_af3_cache", "read_sampling_index", "training_units"]

# The CPU preset of the AF3 tests: crops of 72 tokens / 192 atoms, so a ligand of up to ~60
# heavy atoms fits whole with ~16 residues around it; 16 MSA rows, 2 templates.
AF3_TINY_DATA = AF3DataPreset("af3_tiny", n_token=72, n_atom=192, n_msa=16, n_templ=2)


def af3_data_preset(name: str) -> AF3DataPreset:
    """fold-data's AF3 data preset ``name`` (``af3_initial`` ...) or ``af3_tiny``."""
    if name == AF3_TINY_DATA.name:
        return AF3_TINY_DATA
    return get_af3_preset(name)


def make_ccd(files: Sequence[str | os.PathLike] = ()) -> Ccd:
    """A CCD over ``files`` (searched first) and biotite's; the process default without files."""
    from fold_data.af3 import Ccd, default_ccd

    return Ccd(files) if files else default_ccd()


def af3_cache_dir(cache_dir: str | os.PathLike) -> Path:
    """Where AF3 entries of the cache ``cache_dir`` live."""
    return Path(cache_dir) / "af3"


def discover_complexes(data_dir: str | os.PathLike,
                       names: Sequence[str] | None = None) -> list[Path]:
    """The mmCIF complexes of ``data_dir`` (the directory itself, or its ``mmcifs/``), sorted;
    ``names``: only these entry names (file stems, e.g. ``3o5r``)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise InputError(root, None, "expected a data directory of mmCIF complexes")
    folder = root / "mmcifs" if (root / "mmcifs").is_dir() else root
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and file_suffix(p) in MMCIF_SUFFIXES)
    if names is not None:
        wanted = set(names)
        files = [p for p in files if _entry_name(p) in wanted]
        missing = sorted(wanted - {_entry_name(p) for p in files})
        if missing:
            raise InputError(root, ", ".join(missing), "entries not found among the mmCIF files")
    if not files:
        jsons = sorted(p.name for p in folder.glob("*.json"))
        hint = (f" (found AF3 input JSONs {jsons[:3]}: they have no ground truth; predict them "
                "with 'fold-train predict --json')" if jsons else "")
        raise InputError(folder, None, f"expected mmCIF complexes (*.cif){hint}")
    return files


def _entry_name(path: Path) -> str:
    suffix = file_suffix(path)
    return path.name[: -len(suffix)] if suffix in MMCIF_SUFFIXES else path.stem


REPORT_NAME = "cache_report.json"
SAMPLING_INDEX = "sampling_index.json"


def _day_before(date: str | None) -> str | None:
    if date is None:
        return None
    return (datetime.date.fromisoformat(date) - datetime.timedelta(days=1)).isoformat()


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _build_entry(cache, path: Path, name: str, data_dir: Path, ccd: Ccd,
                 prev: dict | None, chain_filters) -> dict:
    """Featurise (or find) one complex with its alignments; its report record and the
    sampling index record. ``prev``: the entry's sampling record of an earlier build; while the
    mmCIF (size, mtime) and the filter settings are unchanged its chains and filter record come
    from there, so a cache hit parses nothing (as before alignments: a training set of 10^5
    files is not parsed again at every start). ``chain_filters``: AF3's training filters
    (:class:`fold_data.af3.ChainFilters`) or None."""
    from fold_data.af3 import fetch_af3_features, filter_chains, load_entry
    from fold_data.af3.alignments import entry_alignments, template_mmcif_dirs
    from fold_data.af3.parse import Chain, Entry
    from fold_data.af3.sampling import EntryInfo, entry_info, find_interfaces

    stat = _stat(path)
    settings = chain_filters.params() if chain_filters is not None else None
    entry = None
    if (prev is not None and prev.get("source_stat") == stat and "alignment_chains" in prev
            and prev.get("chain_filters") == settings):
        # the chains' sequences from the index: enough to find their alignments without
        # parsing the mmCIF again
        for_alignments = Entry(name, [Chain(cid, 0, kind, [], sequence=seq, author_id=author)
                                   for cid, author, kind, seq in prev["alignment_chains"]],
                            release_date=prev["release_date"])
        filtered = prev.get("filtered")
    else:
        entry = load_entry(path, ccd=ccd)
        filtered = None
        if chain_filters is not None:  # AF3 2.5.4: removed chains are never featurised
            result = filter_chains(entry, chain_filters, ccd)
            entry, filtered = result.entry, result.report()
        for_alignments = entry
    align_root = data_dir / "alignments"
    found = entry_alignments(for_alignments, align_root if align_root.is_dir() else None, name=name)
    kwargs = {}
    if found.template_hits:
        kwargs = {"template_mmcif_dir": [os.fspath(d) for d in template_mmcif_dirs(data_dir)],
                  "max_template_date": _day_before(for_alignments.release_date)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        result = fetch_af3_features(cache, path, ccd=ccd, entry=entry,
                                    chain_filters=chain_filters,
                                    msa_paths=found.msa_paths,
                                    pairing_msa_paths=found.pairing_paths,
                                    template_hits=found.template_hits, **kwargs)
    for w in caught:  # other warnings still reach the user
        if not issubclass(w.category, InputWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    raw = result.features
    record = {"name": name, "status": result.status, "key": result.key,
              "msa_rows": int(raw["msa"].shape[0]),
              "templates": int(raw["template_restype"].shape[0]),
              "chains_with_alignments": sorted(found.chains),
              "chains_paired": sorted(found.pairing_paths),
              "filters": filtered,
              "warnings": list(found.notes),
              "input_warnings": list(dict.fromkeys(  # homomer copies warn alike
                  str(w.message).splitlines()[0] for w in caught
                  if issubclass(w.category, InputWarning)))}
    if entry is None:  # the mmCIF is unchanged: its chains are; interfaces from the features
        old = EntryInfo.from_dict(prev)
        info = EntryInfo(name, old.resolution, old.release_date, old.chains,
                         tuple(find_interfaces(raw))).to_dict()
    else:
        info = entry_info(name, entry, raw).to_dict()
    info["source_stat"] = stat
    info["chain_filters"] = settings
    info["filtered"] = filtered
    info["alignment_chains"] = [[c.chain_id, c.author_id, c.mol_type, c.sequence]
                                for c in for_alignments.chains if c.is_polymer]
    return {"report": record, "info": info}


def open_af3_cache(
    data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike, *,
    names: Sequence[str] | None = None, ccd: Ccd | None = None, progress: bool = False,
    verify: bool = True, limits=None, chain_filters="af3",
) -> list[tuple[str, str]]:
    """``[(entry name, cache key)]``, sorted by name, of the usable complexes.

    With ``data_dir`` every complex is filtered (``chain_filters``: ``"af3"`` AF3's filters,
    a :class:`fold_data.af3.ChainFilters`, or None: none) and featurised (or found) in the AF3
    cache with its alignments and templates (module docstring); a complex that fails, loses
    every chain to the filters, or exceeds the size ``limits`` (``fold_data.limits.SizeLimits``),
    is reported and skipped; the cache report and the sampling index are written. Without it
    the cache's index is read and, with ``verify``, every entry to be used checked
    (:func:`fold_train.data.checked_index`). Raises :class:`InputError` when no entry is
    left.
    """
    from fold_data.af3 import af3_cache
    from fold_data.cache import atomic_write_bytes

    cache = af3_cache(af3_cache_dir(cache_dir))
    if data_dir is None:
        from fold_train.data import checked_index

        entries = checked_index(cache, "complexes", family="af3", names=names, verify=verify)
    else:
        from fold_data.af3 import ChainFilters

        ccd = ccd or make_ccd()
        if isinstance(chain_filters, str):
            if chain_filters != "af3":
                raise ValueError(f"chain_filters {chain_filters!r}: expected 'af3', a "
                                 "ChainFilters or None")
            chain_filters = ChainFilters()
        entries = {}
        records, infos = [], {}
        previous = read_sampling_index(cache_dir)
        files = discover_complexes(data_dir, names)
        for i, path in enumerate(files):
            name = _entry_name(path)
            try:
                with use_limits(limits):
                    built = _build_entry(cache, path, name, Path(data_dir), ccd,
                                         previous.get(name), chain_filters)
            except InputError as e:
                print(f"fold-train: skipping complex {name}: {str(e).splitlines()[0]}")
                records.append({"name": name, "status": "failed", "error": str(e)})
                continue
            entries[name] = built["report"]["key"]
            records.append(built["report"])
            infos[name] = built["info"]
            for note in built["report"]["warnings"]:
                print(f"fold-train: warning: {note}")
            if progress:
                r = built["report"]
                print(f"fold-train: AF3 features {i + 1}/{len(files)} {name} ({r['status']}; "
                      f"{r['msa_rows']} MSA rows, {r['templates']} templates)")
        if entries:
            cache.write_index(entries)
            _write_sampling_index(cache.root, infos)
        summary = _filter_summary(records) if chain_filters is not None else None
        for line in summary or []:
            print(f"fold-train: AF3 training filter {line}")
        atomic_write_bytes(cache.root / REPORT_NAME,
                           json.dumps({"data_dir": os.fspath(data_dir),
                                       "chain_filters": (chain_filters.params()
                                                         if chain_filters is not None else None),
                                       "filters": summary, "entries": records},
                                      indent=1).encode())
    out = sorted(entries.items())
    if not out:
        where = data_dir if data_dir is not None else af3_cache_dir(cache_dir)
        raise InputError(where, None, "expected at least one usable AF3 complex (none was "
                                      "featurised)")
    return out


def _filter_summary(records: list[dict]) -> list[str]:
    """One line per AF3 training filter (:data:`fold_data.af3.filters.CHAIN_FILTERS`, then the
    atom counts of the tokenizer's :data:`~fold_data.af3.filters.ATOM_FILTERS`) over the
    entries of the report: what it removed and where."""
    from fold_data.af3.filters import ATOM_FILTERS, CHAIN_FILTERS

    done = [r for r in records if r.get("filters")]
    lines = []
    for f in CHAIN_FILTERS:
        hits = [f"{r['name']}/{c['chain_id']}" for r in done for c in r["filters"].get(f, [])]
        shown = ", ".join(hits[:8]) + (f", ... ({len(hits) - 8} more)" if len(hits) > 8 else "")
        lines.append(f"{f}: {len(hits)} chain{'s' * (len(hits) != 1)} removed"
                     + (f" ({shown})" if hits else ""))
    for f in ATOM_FILTERS:
        n = sum(int(r["filters"].get(f, 0)) for r in done)
        lines.append(f"{f}: {n} resolved atom{'s' * (n != 1)} not featurised")
    return lines


def _write_sampling_index(root: Path, infos: dict[str, dict]) -> None:
    """Add ``infos`` to the sampling index (entries built by earlier runs stay) and cluster
    every indexed chain again (AF3 2.5.3: the clusters are the whole set's), so that training
    needs neither the clusterer nor its dependencies."""
    from fold_data.af3.clustering import mmseqs_binary
    from fold_data.af3.sampling import EntryInfo, chain_clusters
    from fold_data.cache import atomic_write_bytes

    entries, stored = _read_index(root / SAMPLING_INDEX)
    before = {n: EntryInfo.from_dict(d).chains for n, d in entries.items()}
    entries.update(infos)
    now = {n: EntryInfo.from_dict(d).chains for n, d in entries.items()}
    if now == before and stored:  # the same chains: the same clusters
        clusters = {(n, int(a)): label for key, label in stored.items()
                    for n, a in [key.rsplit("/", 1)]}
    else:
        clusters = chain_clusters([EntryInfo.from_dict(d) for d in entries.values()])
    doc = {"version": 1, "clustering": "mmseqs" if mmseqs_binary() else "greedy",
           "entries": entries,
           "clusters": {f"{name}/{asym}": label for (name, asym), label in clusters.items()}}
    atomic_write_bytes(root / SAMPLING_INDEX, json.dumps(doc, indent=1).encode())


def _read_index(path: Path) -> tuple[dict[str, dict], dict[str, str]]:
    if not path.is_file():
        return {}, {}
    try:
        doc = json.loads(path.read_text())
        return dict(doc["entries"]), dict(doc.get("clusters", {}))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(path, None, f"expected the AF3 sampling index JSON ({e}); rebuild "
                                     "the cache with --data") from None


def read_sampling_index(cache_dir: str | os.PathLike) -> dict[str, dict]:
    """``{entry name: EntryInfo dict}`` of the AF3 cache (empty when it has none)."""
    return _read_index(af3_cache_dir(cache_dir) / SAMPLING_INDEX)[0]


def training_units(cache_dir: str | os.PathLike, entries: list[tuple[str, str]], preset
                   ) -> tuple[list[tuple[str, str]], object | None]:
    """The training entries left by the preset's filters, and (``sampling="weighted"``) the
    :class:`fold_train.data.WeightedUnits` of their chains and interfaces; None: uniform.
    Filtered entries are printed with the reason; none left is an :class:`InputError`."""
    from fold_data.af3.sampling import (
        EntryFilter,
        EntryInfo,
        WeightedSampler,
        chain_clusters,
        sampling_units,
    )

    filters = EntryFilter(preset.max_resolution, preset.max_release_date,
                          preset.max_polymer_chains)
    active = any(v is not None for v in (filters.max_resolution, filters.max_release_date,
                                         filters.max_polymer_chains))
    if not active and preset.sampling == "uniform":
        return entries, None
    index, stored = _read_index(af3_cache_dir(cache_dir) / SAMPLING_INDEX)
    missing = [n for n, _ in entries if n not in index]
    if missing:
        raise InputError(af3_cache_dir(cache_dir) / SAMPLING_INDEX, ", ".join(missing[:5]),
                         "no sampling record for these entries (a cache built before weighted "
                         "sampling?); rebuild the cache with --data, or set "
                         "data.sampling=uniform and the data.max_* filters to none")
    infos = {n: EntryInfo.from_dict(index[n]) for n, _ in entries}
    kept = []
    for name, key in entries:
        why = filters.reason(infos[name])
        if why is None:
            kept.append((name, key))
        else:
            print(f"fold-train: complex {name} filtered out: {why}")
    if not kept:
        raise InputError(af3_cache_dir(cache_dir), None, "expected at least one complex left "
                         f"by the filters {filters} (AF3 supplement 2.5.4); relax data.max_*")
    if preset.sampling == "uniform":
        return kept, None
    from fold_train.data import WeightedUnits

    chosen = [infos[n] for n, _ in kept]
    clusters = {(i.name, c.asym): stored.get(f"{i.name}/{c.asym}") for i in chosen
                for c in i.chains}
    if None in clusters.values():  # an index without clusters: cluster the training set here
        clusters = chain_clusters(chosen)
    units = sampling_units(chosen, clusters)
    return kept, WeightedUnits(dict(kept), WeightedSampler(units))
