"""The search config: which local databases to search, with which preset.

A small TOML file (paths relative to the file's directory)::

    preset = "af3"                     # af2 | af3 (fold_data.search.presets)

    [databases.uniref90]               # a name the preset knows: its max_hits and role apply
    path = "uniref90.fasta.gz"         # FASTA, optionally gzipped
    [databases.uniprot]                # the preset's pairing database (species pairing)
    path = "uniprot.fasta"
    [databases.my_set]                 # any other name: say what it holds and how many rows
    path = "extra.fasta"
    molecule = "protein"               # protein (jackhmmer) | rna | dna (nhmmer)
    max_hits = 1000                    # rows kept; 0 or absent for a known name: the preset's
    z_value = 138515945                # optional: -Z (sequences; megabases for nhmmer)

    [templates]                        # optional: hmmsearch against PDB SEQRES
    seqres = "pdb_seqres.txt"
    mmcif_dir = "mmcifs"               # for the max-template-date filter (release dates)
    max_template_date = "2021-09-30"

Unknown keys are refused, so a typo does not silently change a search.
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from fold_data.errors import InputError

from .presets import PRESETS, DatabasePreset, Preset

__all__ = ["DatabaseConfig", "SearchConfig", "TemplateConfig", "build_config", "load_config",
           "make_database"]

_MOLECULES = ("protein", "rna", "dna")


@dataclass(frozen=True)
class DatabaseConfig:
    name: str
    path: Path
    molecule: str
    max_hits: int | None
    pairing: bool = False
    z_value: float | None = None


@dataclass(frozen=True)
class TemplateConfig:
    seqres: Path
    mmcif_dir: Path | None = None
    max_template_date: str | None = None


@dataclass(frozen=True)
class SearchConfig:
    preset: Preset
    databases: tuple[DatabaseConfig, ...]
    templates: TemplateConfig | None = None
    source: str | None = None

    def for_molecule(self, molecule: str) -> list[DatabaseConfig]:
        """Databases searched for a chain of this type, in the preset's merge order."""
        order = {name: i for i, name in enumerate(self.preset.order)}
        dbs = [d for d in self.databases if d.molecule == molecule
               or (molecule in ("rna", "dna") and d.molecule in ("rna", "dna"))]
        return sorted(dbs, key=lambda d: order.get(d.name, len(order)))


def _fail(path, record, message) -> InputError:
    return InputError(path, record, message)


def _check_keys(src, record, table: dict, allowed: set[str]) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise _fail(src, record, f"unknown key {extra[0]!r}; expected one of "
                    f"{', '.join(sorted(allowed))}")


def make_database(name: str, path: str | os.PathLike, preset: Preset, *,
                  molecule: str | None = None, max_hits: int | None = None,
                  pairing: bool | None = None, z_value: float | None = None,
                  source: str | None = None) -> DatabaseConfig:
    """One database: the preset's settings for a known name, overridden by what is given."""
    record = f"databases.{name}"
    known: DatabasePreset | None = preset.databases.get(name)
    if known is None and (molecule is None or max_hits is None):
        raise _fail(source, record, f"{name!r} is not a database of preset {preset.name!r} "
                    f"({', '.join(preset.databases)}); give 'molecule' and 'max_hits'")
    molecule = molecule or known.molecule
    if molecule not in _MOLECULES:
        raise _fail(source, record, f"molecule {molecule!r}; expected one of "
                    f"{', '.join(_MOLECULES)}")
    if max_hits is not None and (not isinstance(max_hits, int) or max_hits < 0):
        raise _fail(source, record, f"max_hits {max_hits!r}; expected an integer >= 0 (0: all)")
    hits = known.max_hits if max_hits is None else (max_hits or None)
    pair = bool(known.pairing if pairing is None and known else pairing)
    if pair and molecule != "protein":
        raise _fail(source, record, "pairing = true; expected only for protein databases")
    return DatabaseConfig(name, Path(path), molecule, hits, pair,
                          None if z_value is None else float(z_value))


def _date(src, record, text) -> str:
    try:
        return dt.date.fromisoformat(str(text)).isoformat()
    except ValueError:
        raise _fail(src, record, f"max_template_date {text!r}; expected YYYY-MM-DD") from None


def load_config(path: str | os.PathLike) -> SearchConfig:
    """Read and check a search config (see the module docstring)."""
    path = Path(path)
    src = os.fspath(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(src, None, "config file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise _fail(src, None, f"not a readable TOML file: {err}") from None
    _check_keys(src, None, doc, {"preset", "databases", "templates"})
    name = doc.get("preset", "af3")
    if name not in PRESETS:
        raise _fail(src, "preset", f"{name!r}; expected one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    base = path.parent
    tables = doc.get("databases")
    if not isinstance(tables, dict) or not tables:
        raise _fail(src, "databases", "expected at least one [databases.<name>] table")
    dbs = []
    for db_name, table in tables.items():
        record = f"databases.{db_name}"
        if not isinstance(table, dict) or "path" not in table:
            raise _fail(src, record, "expected a table with a 'path' key")
        _check_keys(src, record, table, {"path", "molecule", "max_hits", "pairing", "z_value"})
        dbs.append(make_database(db_name, base / table["path"], preset,
                                 molecule=table.get("molecule"), max_hits=table.get("max_hits"),
                                 pairing=table.get("pairing"), z_value=table.get("z_value"),
                                 source=src))
    templates = None
    if "templates" in doc:
        t = doc["templates"]
        if not isinstance(t, dict) or "seqres" not in t:
            raise _fail(src, "templates", "expected a table with a 'seqres' key")
        _check_keys(src, "templates", t, {"seqres", "mmcif_dir", "max_template_date"})
        date = t.get("max_template_date")
        templates = TemplateConfig(
            base / t["seqres"], base / t["mmcif_dir"] if "mmcif_dir" in t else None,
            _date(src, "templates", date) if date is not None else None)
    return SearchConfig(preset, tuple(dbs), templates, src)


def build_config(config_path: str | os.PathLike | None = None, *, preset: str | None = None,
                 databases: dict[str, str] | None = None, seqres: str | None = None,
                 mmcif_dir: str | None = None, max_template_date: str | None = None
                 ) -> SearchConfig:
    """A config from a file and/or options: ``databases`` (name -> path, names the preset
    knows) are added to the file's (replacing one of the same name); template options override
    the file's ``[templates]``."""
    if config_path is not None:
        config = load_config(config_path)
        if preset is not None and preset != config.preset.name:
            raise InputError(config_path, "preset", f"{config.preset.name!r} in the file but "
                             f"{preset!r} given; expected one preset")
    else:
        name = preset or "af3"
        if name not in PRESETS:
            raise InputError(None, "preset", f"{name!r}; expected one of {', '.join(PRESETS)}")
        config = SearchConfig(PRESETS[name], ())
    dbs = {d.name: d for d in config.databases}
    for db_name, path in (databases or {}).items():
        dbs[db_name] = make_database(db_name, path, config.preset)
    if not dbs:
        raise InputError(config_path, "databases", "no database: give --config or --db NAME=PATH")
    templates = config.templates
    if seqres is not None or mmcif_dir is not None or max_template_date is not None:
        base = templates or TemplateConfig(Path(seqres) if seqres else None)
        templates = TemplateConfig(
            Path(seqres) if seqres else base.seqres,
            Path(mmcif_dir) if mmcif_dir else base.mmcif_dir,
            max_template_date or base.max_template_date)
        if templates.seqres is None:
            raise InputError(config_path, "templates", "--template-mmcif-dir / "
                             "--max-template-date need a SEQRES database (--seqres)")
    return SearchConfig(config.preset, tuple(dbs.values()), templates, config.source)
