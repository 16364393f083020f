"""What ``fold-train predict`` writes beside each structure: AlphaFold3's output layout and key
names (``docs/prediction_outputs.md`` documents every file and key).

For one input named ``NAME`` under ``--out-dir OUT``::

    OUT/NAME/
      seed-S_sample-K/            one folder per seed S and sample K
        model.cif                 the structure, pLDDT in the B-factor column
        summary_confidences.json  scalars: pTM, ipTM, ranking score, per chain, chain pairs
        confidences.json          arrays: per-atom pLDDT, PAE, contact probabilities, ...
      model.cif                   the top-ranked sample again (same three files)
      summary_confidences.json
      confidences.json
      ranking_scores.csv          seed,sample,ranking_score: every sample, best first

Every file is written atomically (temporary file, fsync, rename), so an interrupted run leaves
whole files or none.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fold_data.cache import atomic_write_bytes

__all__ = [
    "FULL_SCHEMA",
    "SUMMARY_SCHEMA",
    "SampleResult",
    "chain_keyed",
    "file_sha256",
    "json_number",
    "output_targets",
    "provenance",
    "rank",
    "rounded",
    "structure_scores",
    "structure_atoms",
    "write_prediction",
    "write_ranked",
]


# The files' keys (docs/prediction_outputs.md): AF3's names, and fold's additions after them.
# Kinds: "score" a number in [0, 1] or null, "number" (or "number_or_null"), "int", "str",
# "sha256", "chains" / "chain_pairs" ({chain: score-or-null} / {chain: {chain: value-or-null}}),
# "[A]" / "[N]" / "[N,N]" lists over atoms / tokens (or null where the model has no such head).
SUMMARY_SCHEMA = {
    "ptm": "score", "iptm": "score", "ranking_score": "number_or_null",
    "fraction_disordered": "number", "has_clash": "number",
    "chain_ptm": "chains", "chain_iptm": "chains", "chain_pair_iptm": "chain_pairs",
    "chain_pair_pae_min": "chain_pairs",
    "mean_plddt": "number", "seed": "int", "sample": "int", "model_family": "str",
    "ranking_formula": "str", "fold_version": "str", "weights_sha256": "sha256",
    "input_sha256": "files",
}
FULL_SCHEMA = {
    "atom_chain_ids": "[A] str", "atom_plddts": "[A] number", "contact_probs": "[N,N] number",
    "pae": "[N,N] number", "token_chain_ids": "[N] str", "token_res_ids": "[N] int",
    "token_plddts": "[N] number", "pde": "[N,N] number",
}
OPTIONAL_FULL = ("pde",)  # AF2 has no PDE head


def _is_num(v, nullable: bool = False) -> bool:
    return (v is None and nullable) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                        and math.isfinite(v))


def _summary_value_ok(kind: str, v, chains: list[str]) -> bool:
    """Whether ``v`` is of ``kind`` (:data:`SUMMARY_SCHEMA`)."""
    if kind == "score":
        return _is_num(v, True) and (v is None or -1e-6 <= v <= 1 + 1e-6)
    if kind == "number":
        return _is_num(v)
    if kind == "number_or_null":  # null: no score (no token with a frame)
        return _is_num(v, True)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str) and v != ""
    if kind == "sha256":
        return isinstance(v, str) and len(v) == 64
    if kind == "files":
        return isinstance(v, dict) and bool(v) and all(
            isinstance(h, str) and len(h) == 64 for h in v.values())
    if kind == "chains":
        return isinstance(v, dict) and list(v) == chains and all(
            _is_num(x, True) for x in v.values())
    return isinstance(v, dict) and list(v) == chains and all(  # chain_pairs
        isinstance(row, dict) and list(row) == chains
        and all(_is_num(x, True) for x in row.values()) for row in v.values())


def validate_sample(summary: dict, full: dict) -> None:
    """Raise ``ValueError`` naming the key when ``summary`` / ``full`` (the two JSON files of a
    sample) differ from :data:`SUMMARY_SCHEMA` / :data:`FULL_SCHEMA`: keys, kinds, the chains
    of the per-chain keys, and the atom and token counts of the lists."""
    if set(summary) != set(SUMMARY_SCHEMA):
        raise ValueError(f"summary: expected keys {sorted(SUMMARY_SCHEMA)}, got {sorted(summary)}")
    required = set(FULL_SCHEMA) - set(OPTIONAL_FULL)
    if not required <= set(full) <= set(FULL_SCHEMA):
        raise ValueError(f"confidences: expected keys {sorted(FULL_SCHEMA)}, got {sorted(full)}")
    chains = list(dict.fromkeys(full["token_chain_ids"]))
    for key, kind in SUMMARY_SCHEMA.items():
        if not _summary_value_ok(kind, summary[key], chains):
            raise ValueError(f"{key}: expected {kind} (chains {chains}), got "
                             f"{summary[key]!r:.200}")
    n_atom, n_tok = len(full["atom_plddts"]), len(full["token_chain_ids"])
    for key, kind in FULL_SCHEMA.items():
        v = full.get(key)
        if v is None and key in (*OPTIONAL_FULL, "pae", "contact_probs"):
            continue  # no such head (AF2 without the pTM head; AF2's PDE)
        n = n_atom if kind.startswith("[A]") else n_tok
        rows = v if kind.startswith("[N,N]") else [v]
        if not isinstance(v, list) or len(v) != n or any(
                not isinstance(r, list) or len(r) != n for r in rows):
            raise ValueError(f"{key}: expected {kind} with A={n_atom}, N={n_tok}")
        flat = [x for r in rows for x in r]
        element_ok = {"number": _is_num, "str": lambda x: isinstance(x, str),
                      "int": lambda x: isinstance(x, int)}[kind.split()[-1]]
        if not all(element_ok(x) for x in flat):
            raise ValueError(f"{key}: expected {kind.split()[-1]} elements")
    if not set(full["atom_chain_ids"]) <= set(chains):
        raise ValueError(f"atom_chain_ids: expected chains among {chains}")


@dataclass
class SampleResult:
    """One predicted sample: its structure (``gemmi.Structure``), ``summary`` (the keys of
    ``summary_confidences.json``), ``full`` (those of ``confidences.json``) and ``score``, the
    ranking score it is ranked by."""

    seed: int
    sample: int
    structure: Any
    summary: dict[str, Any]
    full: dict[str, Any] = field(repr=False)
    score: float = math.nan  # the exact ranking score (the summary's is rounded; NaN: null)

    @property
    def ranking_score(self) -> float:
        return float(self.score)

    @property
    def folder(self) -> str:
        return f"seed-{self.seed}_sample-{self.sample}"


def rank(results: list[SampleResult]) -> list[SampleResult]:
    """Best first by ranking score; a NaN score last; ties by (seed, sample), so the order is
    reproducible."""
    def key(r: SampleResult):
        s = r.ranking_score
        return (math.isnan(s), -s if not math.isnan(s) else 0.0, r.seed, r.sample)

    return sorted(results, key=key)


_SHA256_MEMO: dict[tuple, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (memoised per path, size and mtime: a checkpoint is hashed
    once per run, not once per input)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA256_MEMO:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _SHA256_MEMO[key] = h.hexdigest()
    return _SHA256_MEMO[key]


def provenance(checkpoint: str | os.PathLike, inputs: list[str | os.PathLike]) -> dict:
    """The summary's record of what made a prediction: fold's version, the checkpoint file's
    sha256, and each input file's (by its name as given)."""
    from fold_train import __version__

    return {"fold_version": __version__,
            "weights_sha256": file_sha256(checkpoint),
            "input_sha256": {os.fspath(p): file_sha256(p) for p in inputs}}


def structure_atoms(structure) -> dict[str, np.ndarray]:
    """The atoms of a written ``gemmi.Structure`` in file order: ``positions [A, 3]``,
    ``plddt [A]`` (B-factors), ``chain [A]`` (index), ``chain_ids``, ``residue [A]`` (index
    within its chain), ``res_names`` (chain index -> residue names), ``atom_names [A]``,
    ``polymer [A]`` (not HETATM), ``protein [A]``."""
    import gemmi

    cols: dict[str, list] = {k: [] for k in ("positions", "plddt", "chain", "residue",
                                             "atom_names", "polymer", "protein")}
    chain_ids, res_names = [], {}
    for c, chain in enumerate(structure[0]):
        chain_ids.append(chain.name)
        res_names[c] = []
        for r, res in enumerate(chain):
            res_names[c].append(res.name)
            polymer = res.het_flag != "H"
            info = gemmi.find_tabulated_residue(res.name)
            protein = polymer and info is not None and info.is_amino_acid()
            for atom in res:
                cols["positions"].append(atom.pos.tolist())
                cols["plddt"].append(atom.b_iso)
                cols["chain"].append(c)
                cols["residue"].append(r)
                cols["atom_names"].append(atom.name)
                cols["polymer"].append(polymer)
                cols["protein"].append(protein)
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["positions"] = out["positions"].reshape(-1, 3).astype(np.float64)
    out["chain_ids"] = chain_ids
    out["res_names"] = res_names
    return out


def structure_scores(atoms: dict, device=None) -> dict[str, float]:
    """``has_clash`` (0.0 / 1.0, as AF3 writes it) and ``fraction_disordered`` of the atoms of
    :func:`structure_atoms` (:mod:`fold_train.structure_checks`). ``device``: where the
    prediction ran; on a GPU the accessible areas are computed there (a crowded structure
    costs the CPU ``O(A^2)``), else with numpy and a cell list."""
    import torch

    from fold_train.structure_checks import fraction_disordered, has_clash

    if device is not None and torch.device(device).type != "cuda":
        device = None

    clash = has_clash(atoms["positions"], atoms["chain"], atoms["residue"], atoms["polymer"])
    disorder = fraction_disordered(atoms["positions"], atoms["chain"], atoms["residue"],
                                   atoms["protein"], atoms["atom_names"], atoms["res_names"],
                                   device=device)
    return {"has_clash": float(clash), "fraction_disordered": disorder}


def chain_keyed(values: np.ndarray, chain_ids: list[str]) -> dict:
    """``[C]`` -> ``{chain: value}``; ``[C, C]`` -> ``{chain: {chain: value}}``."""
    if values.ndim == 1:
        return {c: json_number(v) for c, v in zip(chain_ids, values, strict=True)}
    return {c: chain_keyed(row, chain_ids) for c, row in zip(chain_ids, values, strict=True)}


def json_number(v, digits: int = 4):
    """A float for JSON: rounded, NaN as null (AF3 writes null where a score is undefined)."""
    v = float(v)
    return None if math.isnan(v) else round(v, digits)


def rounded(a, digits: int) -> np.ndarray:
    """An array rounded to ``digits`` (AF3 rounds its arrays), float64; kept an array until
    ``confidences.json`` is written (:func:`_json_bytes`): a prediction that writes no
    ``--out-dir`` never turns its ``[N, N]`` matrices into Python lists (at 4608 residues,
    7 s per AF2 sample)."""
    return np.round(np.asarray(a, np.float64), digits)


def _jsonable(value):
    """json's hook for what it cannot write itself: numpy arrays as (nested) lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json_bytes(obj: dict, indent: int | None) -> bytes:
    return (json.dumps(obj, indent=indent, allow_nan=False, default=_jsonable) + "\n").encode()


def _write_sample_files(folder: Path, result: SampleResult) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "model.cif",
                       result.structure.make_mmcif_document().as_string().encode())
    atomic_write_bytes(folder / "summary_confidences.json", _json_bytes(result.summary, 1))
    atomic_write_bytes(folder / "confidences.json", _json_bytes(result.full, None))


def write_ranked(out_dir: str | os.PathLike, results: list[SampleResult]) -> list[SampleResult]:
    """Write every sample of one input under ``out_dir`` (module docstring's layout) and the
    top-ranked one again at its top; returns the samples best first."""
    if not results:
        raise ValueError("no sample to write")
    out = Path(out_dir)
    ranked = rank(results)
    for r in ranked:
        _write_sample_files(out / r.folder, r)
    _write_sample_files(out, ranked[0])
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    w.writerow(["seed", "sample", "ranking_score"])
    for r in ranked:
        w.writerow([r.seed, r.sample, "" if math.isnan(r.ranking_score)
                    else repr(r.ranking_score)])
    atomic_write_bytes(out / "ranking_scores.csv", text.getvalue().encode())
    return ranked


def output_targets(out, out_dir, name: str):
    """``(file, directory)`` a prediction goes to: ``out`` (or ``<name>.cif`` in the current
    directory when neither is given) and ``out_dir/<name>`` (refused when it exists: a
    previous run's samples are not mixed with these)."""
    from fold_data.errors import InputError

    from fold_train.outputs import output_path, safe_file_name

    path = output_path(out, name) if out is not None or out_dir is None else None
    target = None
    if out_dir is not None:
        target = Path(out_dir) / safe_file_name(name, "")
        if target.exists():
            raise InputError(target, "--out-dir", "already exists (a previous prediction of "
                             f"{name!r}); remove it or choose another --out-dir")
    return path, target


def write_prediction(ranked: list, path, target) -> list:
    """Write the ranked samples: all of them under ``target`` (built in a temporary sibling
    directory and renamed into place, so an interrupted run leaves no partial folder), the top
    one's structure to ``path``."""
    from fold_data.write import write_mmcif

    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the renamed folder
        try:
            write_ranked(tmp, ranked)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if path is not None:
        write_mmcif(ranked[0].structure, path)
    return ranked
