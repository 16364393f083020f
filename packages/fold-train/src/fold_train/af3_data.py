"""AF3 training data: a directory of mmCIF complexes -> fold-data's AF3 cache -> sample stream.

Each ``*.cif`` / ``*.mmcif`` / ``*.cif.gz`` file of the data directory is one training entry (a
complex with its ground-truth coordinates: proteins, nucleic acids, ligands, ions, glycans). Its
raw AF3 features (tokens, atoms, CCD reference conformers, bonds) are built once with
``fold_data.af3.fetch_af3_features`` into the AF3 cache (content-hashed, written atomically,
checksummed) under ``<cache_dir>/af3`` (its own index, so an AF2 cache in the same directory is
untouched). The per-step transforms (crop, MSA row sampling, conformer rotation) run in the
loader workers through :class:`fold_train.data.SampleStream` with ``family="af3"``.

AF3 input JSONs have no ground truth, so they are prediction inputs (``fold-train predict
--json``), not training entries; a data directory holding only JSONs is an error that says so.

The CCD: ``ccd_files`` (CCD mmCIF files or directories of them) are searched first, then
biotite's shipped CCD when it is installed (:class:`fold_data.af3.Ccd`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fold_data.af3 import AF3DataPreset, Ccd, default_ccd
from fold_data.af3 import get_preset as get_af3_preset
from fold_data.errors import InputError
from fold_data.limits import use_limits
from fold_data.readers import MMCIF_SUFFIXES, file_suffix

__all__ = ["AF3_TINY_DATA", "af3_cache_dir", "af3_data_preset", "discover_complexes", "make_ccd",
           "open_af3_cache"]

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


def open_af3_cache(
    data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike, *,
    names: Sequence[str] | None = None, ccd: Ccd | None = None, progress: bool = False,
    verify: bool = True, limits=None,
) -> list[tuple[str, str]]:
    """``[(entry name, cache key)]``, sorted by name, of the usable complexes.

    With ``data_dir`` every complex is featurised (or found) in the AF3 cache; a complex that
    fails, or exceeds the size ``limits`` (``fold_data.limits.SizeLimits``), is reported and
    skipped. Without it the cache's index is read and, with ``verify``,
    every entry to be used checked (:func:`fold_train.data.checked_index`). Raises
    :class:`InputError` when no entry is left.
    """
    from fold_data.af3 import af3_cache, fetch_af3_features

    cache = af3_cache(af3_cache_dir(cache_dir))
    if data_dir is None:
        from fold_train.data import checked_index

        entries = checked_index(cache, "complexes", family="af3", names=names, verify=verify)
    else:
        ccd = ccd or default_ccd()
        entries = {}
        files = discover_complexes(data_dir, names)
        for i, path in enumerate(files):
            name = _entry_name(path)
            try:
                with use_limits(limits):
                    result = fetch_af3_features(cache, path, ccd=ccd)
            except InputError as e:
                print(f"fold-train: skipping complex {name}: {str(e).splitlines()[0]}")
                continue
            entries[name] = result.key
            if progress:
                print(f"fold-train: AF3 features {i + 1}/{len(files)} {name} ({result.status})")
        if entries:
            cache.write_index(entries)
    out = sorted(entries.items())
    if not out:
        where = data_dir if data_dir is not None else af3_cache_dir(cache_dir)
        raise InputError(where, None, "expected at least one usable AF3 complex (none was "
                                      "featurised)")
    return out
