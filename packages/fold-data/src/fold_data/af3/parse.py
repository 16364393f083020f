"""AF3 inputs -> one :class:`Entry`: chains of CCD residues (or a SMILES), bonds, MSAs, templates.

Three readers produce the same structure:

* :func:`parse_af3_json`: the AlphaFold3 input JSON (``dialect: alphafold3``, versions 1-4):
  proteins / RNA / DNA with modifications, user MSAs and templates, ligands by CCD codes or
  SMILES, ``bondedAtomPairs``, ``userCCD``. The schema is checked field by field; a violation
  raises :class:`InputError` naming the entity (``sequences[i] protein A``) and the field.
* :func:`parse_complex_mmcif`: an mmCIF of a complex (first model; proteins, DNA, RNA, ligands,
  ions, branched glycans; waters and hydrogens dropped; per residue the alternate location with
  the highest mean occupancy; MSE read as MET with SE -> SD as AF3 does; covalent links from
  ``_struct_conn``), with ground-truth coordinates.
* :func:`parse_fasta_entry`: protein sequences of a FASTA file, one chain per record.

Polymer residues are CCD codes (protein ``ALA``..., unknown ``UNK``; RNA ``A C G U``, unknown
``N``; DNA ``DA DC DG DT``, unknown ``DN``); modifications replace the code at their position.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gemmi
import numpy as np

from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.limits import check_mmcif
from fold_data.mmcif_truncation import warn_if_truncated
from fold_data.msa import parse_fasta

from .ccd import Ccd, default_ccd

__all__ = [
    "Bond",
    "Chain",
    "Entry",
    "TemplateSpec",
    "parse_af3_json",
    "parse_complex_mmcif",
    "parse_fasta_entry",
    "polymer_codes",
    "POLYMER_TYPES",
]

POLYMER_TYPES = ("protein", "rna", "dna")
_RNA = {"A": "A", "C": "C", "G": "G", "U": "U"}
_DNA = {"A": "DA", "C": "DC", "G": "DG", "T": "DT"}
# CCD chem_comp.type words that make a component fit a polymer type (for modifications).
_TYPE_WORDS = {"protein": "PEPTIDE", "rna": "RNA", "dna": "DNA"}


@dataclass(frozen=True)
class TemplateSpec:
    """A user template of a protein chain (AF3 JSON ``templates``): mmCIF file and mapping."""

    mmcif_path: str
    query_indices: tuple[int, ...]  # 0-based query residues
    template_indices: tuple[int, ...]  # 0-based residues of the template's first chain


@dataclass
class Chain:
    """One chain of an entry.

    ``residues``: CCD codes in order (polymers: one per sequence position, modifications
    applied; ligands: one per component, e.g. a glycan's sugars; empty for a SMILES ligand).
    ``positions``: per residue ``{atom name: xyz}`` ground truth (mmCIF input), None when not
    modelled or when the input has no structure.
    """

    chain_id: str
    entity_id: int
    mol_type: str  # 'protein' | 'rna' | 'dna' | 'ligand'
    residues: list[str]
    sequence: str = ""  # polymers: one letter per residue (parents of modified residues)
    smiles: str | None = None
    author_id: str = ""
    positions: list[dict[str, np.ndarray] | None] | None = None
    msa_paths: tuple[str, ...] = ()
    unpaired_msa: str | None = None  # A3M text (AF3 JSON unpairedMsa)
    templates: tuple[TemplateSpec, ...] = ()

    @property
    def is_polymer(self) -> bool:
        return self.mol_type in POLYMER_TYPES


@dataclass(frozen=True)
class Bond:
    """A covalent bond between two atoms: (chain ID, 0-based residue index, atom name) each."""

    a: tuple[str, int, str]
    b: tuple[str, int, str]


@dataclass
class Entry:
    """What the featurizer needs: chains, inter-residue bonds, a CCD, optional facts."""

    name: str
    chains: list[Chain]
    bonds: list[Bond] = field(default_factory=list)
    source: str = ""
    user_ccd: str | None = None  # mmCIF text of extra CCD components
    resolution: float = 0.0
    release_date: str | None = None
    seeds: tuple[int, ...] = (0,)
    methods: tuple[str, ...] = ()  # mmCIF _exptl.method, upper case ('X-RAY DIFFRACTION')

    def chain(self, chain_id: str) -> Chain:
        for c in self.chains:
            if c.chain_id == chain_id:
                return c
        raise KeyError(chain_id)


def polymer_codes(sequence: str, mol_type: str) -> list[str]:
    """CCD codes of a one-letter polymer sequence (unknown letters -> UNK / N / DN)."""
    if mol_type == "protein":
        return [rc.restype_1to3.get(c, "UNK") for c in sequence]
    table, unknown = (_RNA, "N") if mol_type == "rna" else (_DNA, "DN")
    return [table.get(c, unknown) for c in sequence]


# ------------------------------------------------------------------------------------------------
# AlphaFold3 input JSON
# ------------------------------------------------------------------------------------------------

_TOP_KEYS = {"name", "sequences", "modelSeeds", "dialect", "version", "bondedAtomPairs",
             "userCCD", "userCCDPath"}
_ENTITY_KEYS = {
    "protein": {"id", "sequence", "modifications", "unpairedMsa", "unpairedMsaPath", "pairedMsa",
                "pairedMsaPath", "templates", "description"},
    "rna": {"id", "sequence", "modifications", "unpairedMsa", "unpairedMsaPath", "description"},
    "dna": {"id", "sequence", "modifications", "description"},
    "ligand": {"id", "ccdCodes", "smiles", "description"},
}
_MOD_KEYS = {"protein": ("ptmType", "ptmPosition"), "rna": ("modificationType", "basePosition"),
             "dna": ("modificationType", "basePosition")}
_LETTERS = {"protein": set("ACDEFGHIKLMNPQRSTVWYX"), "rna": set("ACGUN"), "dna": set("ACGTN")}


class _Json:
    """Field checks that raise :class:`InputError` naming the file, the record and the field.

    ``base`` is the JSON's directory: the files it names (MSAs, userCCDPath, templates) are read
    relative to it and, unless ``allow_outside_paths``, must resolve inside it (symlinks
    followed), so a JSON from elsewhere cannot make fold read any file it likes."""

    def __init__(self, path: str | None, base: Path | None = None,
                 allow_outside_paths: bool = False):
        self.path = path
        self.base = base or Path.cwd()
        self.allow_outside_paths = allow_outside_paths

    def fail(self, record: str | None, message: str) -> InputError:
        return InputError(self.path, record, message)

    def get(self, obj: dict, key: str, types: type | tuple, record: str, *, required=True) -> Any:
        if key not in obj:
            if required:
                raise self.fail(record, f"missing field {key!r}")
            return None
        value = obj[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
            names = "/".join(t.__name__ for t in _tuple(types))
            raise self.fail(record, f"field {key!r} is {type(value).__name__}; expected {names}")
        return value

    def file(self, name: str, record: str, fld: str) -> Path:
        """The file a path field names, resolved under the JSON's directory."""
        if not name or "\0" in name:
            raise self.fail(record, f"field {fld!r}: expected a file path, got {name!r}")
        p = Path(name)
        p = (p if p.is_absolute() else self.base / p).resolve()
        base = self.base.resolve()
        if not self.allow_outside_paths and not p.is_relative_to(base):
            raise self.fail(record, f"field {fld!r}: {name!r} resolves to {p}, outside the "
                            f"JSON's directory {base}; move the file there or allow paths "
                            "outside it (fold-train predict --allow-outside-paths)")
        return p

    def text_or_file(self, obj: dict, key: str, record: str) -> str | None:
        """The text of field ``key`` or of the file its ``keyPath`` twin names (the JSON's
        directory rules, :meth:`file`); the two are exclusive, both absent is None."""
        text = self.get(obj, key, str, record, required=False)
        path = self.get(obj, f"{key}Path", str, record, required=False)
        if path is None:
            return text
        if text is not None:
            raise self.fail(record, f"fields {key!r} and '{key}Path' are exclusive; give one")
        return self.read_text(path, record, f"{key}Path")

    def read_text(self, name: str, record: str, fld: str) -> str:
        p = self.file(name, record, fld)
        try:
            return p.read_text()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else "not text"
            raise self.fail(record, f"field {fld!r}: cannot read {p}: {reason}") from None


def _tuple(types: type | tuple) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def parse_af3_json(path: str | os.PathLike, *, ccd: Ccd | None = None,
                   allow_outside_paths: bool = False) -> Entry:
    """Read an AlphaFold3 input JSON into an :class:`Entry` (schema checked, CCD codes resolved).

    Every problem raises :class:`InputError` naming the file, the entity and the field: a
    missing or mistyped field, an unknown field, a duplicate chain ID, a letter outside the
    polymer's alphabet, an unknown CCD code, a modification outside the sequence or on a residue
    its CCD parent does not match, a bond naming an unknown chain / residue / atom. SMILES are
    checked later, when the molecule is built (:func:`fold_data.af3.molecules.mol_from_smiles`).
    Files the JSON names (``unpairedMsaPath``, ``pairedMsaPath``, ``userCCDPath``, template
    ``mmcifPath``) are read relative to its directory and must resolve inside it unless
    ``allow_outside_paths``.
    """
    path = Path(path)
    src = os.fspath(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(src, None, f"not a readable JSON file: {err}") from None
    except RecursionError:
        raise InputError(src, None, "JSON nested too deeply; expected an AlphaFold3 input "
                         "(a few levels of objects and lists)") from None
    return entry_from_af3_dict(doc, source=src, base=path.parent, ccd=ccd,
                               allow_outside_paths=allow_outside_paths)


def entry_from_af3_dict(
    doc: Any, *, source: str | None = None, base: Path | None = None, ccd: Ccd | None = None,
    allow_outside_paths: bool = False,
) -> Entry:
    """:func:`parse_af3_json` on an already-loaded JSON object."""
    j = _Json(source, base, allow_outside_paths)
    if not isinstance(doc, dict):
        raise j.fail(None, f"top level is {type(doc).__name__}; expected an object (one job)")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise j.fail("job", f"unknown fields {unknown}; expected some of {sorted(_TOP_KEYS)}")
    name = j.get(doc, "name", str, "job")
    if j.get(doc, "dialect", str, "job") != "alphafold3":
        raise j.fail("job", f"field 'dialect' is {doc['dialect']!r}; expected 'alphafold3'")
    version = j.get(doc, "version", int, "job")
    if not 1 <= version <= 4:
        raise j.fail("job", f"field 'version' is {version}; expected 1-4")
    seeds = j.get(doc, "modelSeeds", list, "job")
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32
                            for s in seeds):
        raise j.fail("job", "field 'modelSeeds' must be a non-empty list of integers in "
                     f"0..{2**32 - 1}, got {seeds!r}"[:200])
    user_ccd = j.text_or_file(doc, "userCCD", "job")
    ccd = (ccd or default_ccd()).with_text(user_ccd)

    sequences = j.get(doc, "sequences", list, "job")
    if not sequences:
        raise j.fail("job", "field 'sequences' is empty; expected at least one entity")
    chains: list[Chain] = []
    entity_keys: dict[str, int] = {}
    seen_ids: set[str] = set()
    for i, item in enumerate(sequences):
        rec = f"sequences[{i}]"
        if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in _ENTITY_KEYS:
            raise j.fail(rec, f"expected an object with one key of {sorted(_ENTITY_KEYS)}, "
                         f"got {sorted(item) if isinstance(item, dict) else type(item).__name__}")
        kind, body = next(iter(item.items()))
        if not isinstance(body, dict):
            raise j.fail(f"{rec} {kind}", f"expected an object, got {type(body).__name__}")
        ids = body.get("id")
        ids = [ids] if isinstance(ids, str) else ids
        if not ids or not isinstance(ids, list) or not all(
            isinstance(x, str) and x.isascii() and x.isalpha() and x.isupper() for x in ids
        ):
            raise j.fail(f"{rec} {kind}", "field 'id': expected an upper-case ASCII letter "
                         f"ID (A-Z) or a non-empty list of them, got {body.get('id')!r}")
        rec = f"{rec} {kind} {ids[0]}"
        unknown = sorted(set(body) - _ENTITY_KEYS[kind])
        if unknown:
            raise j.fail(rec, f"unknown fields {unknown}; expected some of "
                         f"{sorted(_ENTITY_KEYS[kind])}")
        for cid in ids:
            if cid in seen_ids:
                raise j.fail(rec, f"field 'id': chain ID {cid!r} is used twice")
            seen_ids.add(cid)
        template = _json_entity(j, kind, body, rec, ccd)
        key = json.dumps([kind, template.residues, template.smiles])
        entity_id = entity_keys.setdefault(key, len(entity_keys) + 1)
        for cid in ids:
            chains.append(Chain(
                chain_id=cid, entity_id=entity_id, mol_type=kind,
                residues=list(template.residues), sequence=template.sequence,
                smiles=template.smiles, author_id=cid, unpaired_msa=template.unpaired_msa,
                templates=template.templates,
            ))
    bonds = _json_bonds(j, doc, chains, ccd)
    return Entry(name=name, chains=chains, bonds=bonds, source=source or "", user_ccd=user_ccd,
                 seeds=tuple(seeds))


def _json_entity(j: _Json, kind: str, body: dict, rec: str, ccd: Ccd) -> Chain:
    if kind == "ligand":
        codes = j.get(body, "ccdCodes", list, rec, required=False)
        smiles = j.get(body, "smiles", str, rec, required=False)
        if (codes is None) == (smiles is None):
            raise j.fail(rec, "expected exactly one of the fields 'ccdCodes' and 'smiles'")
        if codes is not None:
            if not codes or not all(isinstance(c, str) and c for c in codes):
                raise j.fail(rec, "field 'ccdCodes': expected a non-empty list of CCD codes")
            for k, code in enumerate(codes):
                ccd.require(code, j.path, rec, f"ccdCodes[{k}]")
            return Chain("", 0, kind, [c.upper() for c in codes])
        return Chain("", 0, kind, [], smiles=smiles)

    sequence = j.get(body, "sequence", str, rec)
    if not sequence:
        raise j.fail(rec, "field 'sequence' is empty")
    bad = sorted(set(sequence) - _LETTERS[kind])
    if bad:
        raise j.fail(rec, f"field 'sequence' has letters {bad}; expected {kind} letters "
                     f"{''.join(sorted(_LETTERS[kind]))}")
    residues = polymer_codes(sequence, kind)
    type_key, pos_key = _MOD_KEYS[kind]
    for k, mod in enumerate(j.get(body, "modifications", list, rec, required=False) or []):
        fld = f"modifications[{k}]"
        if not isinstance(mod, dict) or set(mod) != {type_key, pos_key}:
            raise j.fail(rec, f"field {fld!r}: expected an object with {type_key!r} and "
                         f"{pos_key!r}, got {mod!r}")
        code, pos = mod[type_key], mod[pos_key]
        if not isinstance(code, str) or not isinstance(pos, int) or isinstance(pos, bool):
            raise j.fail(rec, f"field '{fld}': {type_key} must be a CCD code and {pos_key} an "
                         f"integer, got {code!r}, {pos!r}")
        if not 1 <= pos <= len(sequence):
            raise j.fail(rec, f"field '{fld}.{pos_key}' is {pos}; expected 1..{len(sequence)} "
                         "(1-based position in the sequence)")
        comp = ccd.require(code, j.path, rec, f"{fld}.{type_key}")
        standard = residues[pos - 1]
        if _TYPE_WORDS[kind] not in comp.type:
            raise j.fail(rec, f"field '{fld}.{type_key}': {comp.code} is a {comp.type!r} "
                         f"component; expected a {kind} residue")
        if comp.parent is not None and comp.parent != standard:
            raise j.fail(rec, f"field '{fld}': {comp.code} modifies {comp.parent} but residue "
                         f"{pos} is {standard} ({sequence[pos - 1]})")
        residues[pos - 1] = comp.code
    unpaired = None
    if kind in ("protein", "rna"):
        unpaired = j.text_or_file(body, "unpairedMsa", rec)
        if kind == "protein":
            # Paired MSAs are concatenated to the unpaired rows (AF3 pairs them itself when
            # absent; here every chain's rows are stacked, see fold_data.af3.msa).
            paired = j.text_or_file(body, "pairedMsa", rec)
            if paired is not None and paired.strip():
                unpaired = paired if unpaired is None else unpaired + "\n" + paired
    templates = ()
    if kind == "protein":
        templates = tuple(_json_templates(j, body, rec))
    return Chain("", 0, kind, residues, sequence=sequence, unpaired_msa=unpaired,
                 templates=templates)


def _json_templates(j: _Json, body: dict, rec: str) -> list[TemplateSpec]:
    out = []
    for k, t in enumerate(j.get(body, "templates", list, rec, required=False) or []):
        fld = f"templates[{k}]"
        if not isinstance(t, dict):
            raise j.fail(rec, f"field {fld!r}: expected an object")
        if "mmcifPath" in t:
            if not isinstance(t["mmcifPath"], str):
                raise j.fail(rec, f"field '{fld}.mmcifPath': expected a file path")
            p = j.file(t["mmcifPath"], rec, f"{fld}.mmcifPath")
        elif "mmcif" in t:
            raise j.fail(rec, f"field '{fld}.mmcif': inline template mmCIF text is not read; "
                         "give 'mmcifPath' (templates are parsed from files)")
        else:
            raise j.fail(rec, f"field {fld!r}: expected 'mmcifPath'")
        q, tt = t.get("queryIndices"), t.get("templateIndices")
        if not (isinstance(q, list) and isinstance(tt, list) and len(q) == len(tt)
                and all(isinstance(x, int) and x >= 0 for x in q + tt)):
            raise j.fail(rec, f"field '{fld}.queryIndices/templateIndices': expected two lists "
                         "of non-negative integers of equal length")
        out.append(TemplateSpec(os.fspath(p), tuple(q), tuple(tt)))
    return out


def _json_bonds(j: _Json, doc: dict, chains: list[Chain], ccd: Ccd) -> list[Bond]:
    by_id = {c.chain_id: c for c in chains}
    bonds = []
    for k, pair in enumerate(j.get(doc, "bondedAtomPairs", list, "job", required=False) or []):
        rec = f"bondedAtomPairs[{k}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise j.fail(rec, "expected a pair [[chain, residue, atom], [chain, residue, atom]]")
        ends = []
        for e, atom in enumerate(pair):
            fld = f"{rec}[{e}]"
            if not (isinstance(atom, list) and len(atom) == 3 and isinstance(atom[0], str)
                    and isinstance(atom[1], int) and isinstance(atom[2], str)):
                raise j.fail(fld, f"expected [chain ID, 1-based residue, atom name], got {atom!r}")
            cid, res, name = atom
            chain = by_id.get(cid)
            if chain is None:
                raise j.fail(fld, f"chain {cid!r} is not in 'sequences'")
            n_res = len(chain.residues) if chain.smiles is None else 1
            if not 1 <= res <= n_res:
                raise j.fail(fld, f"residue {res} of chain {cid}; expected 1..{n_res}")
            if chain.smiles is None:
                comp = ccd.get(chain.residues[res - 1])
                if comp is not None and comp.atom_index(name) is None:
                    raise j.fail(fld, f"atom {name!r} is not in {comp.code} (chain {cid} residue "
                                 f"{res}); expected one of {', '.join(comp.atom_names)}")
            ends.append((cid, res - 1, name))
        if ends[0] == ends[1]:
            raise j.fail(rec, f"bonds atom {ends[0][2]!r} of chain {ends[0][0]} residue "
                         f"{ends[0][1] + 1} to itself; expected two different atoms")
        bonds.append(Bond(ends[0], ends[1]))
    return bonds


# ------------------------------------------------------------------------------------------------
# mmCIF of a complex
# ------------------------------------------------------------------------------------------------

_GEMMI_POLYMER = {
    gemmi.PolymerType.PeptideL: "protein",
    gemmi.PolymerType.PeptideD: "protein",
    gemmi.PolymerType.Dna: "dna",
    gemmi.PolymerType.Rna: "rna",
    gemmi.PolymerType.DnaRnaHybrid: "dna",
}


def _residue_atoms(res: gemmi.Residue) -> dict[str, np.ndarray]:
    """Heavy atoms of one residue: the altloc with the highest mean occupancy (ties: first)."""
    occ: dict[str, list[float]] = {}
    for a in res:
        if a.altloc != "\0":
            occ.setdefault(a.altloc, []).append(a.occ)
    best = max(occ, key=lambda k: sum(occ[k]) / len(occ[k]), default="\0")
    out: dict[str, np.ndarray] = {}
    for a in res:
        if a.is_hydrogen() or (a.altloc != "\0" and a.altloc != best):
            continue
        name = "SD" if res.name == "MSE" and a.name == "SE" else a.name
        out.setdefault(name, np.array([a.pos.x, a.pos.y, a.pos.z], dtype=np.float32))
    return out


def _code(name: str) -> str:
    return "MET" if name == "MSE" else name


def parse_complex_mmcif(path: str | os.PathLike, *, ccd: Ccd | None = None) -> Entry:
    """Read an mmCIF complex into an :class:`Entry` with ground-truth coordinates.

    Chains are keyed by ``label_asym_id`` (``Chain.author_id`` keeps the author ID). Polymer
    residues are the full ``_entity_poly_seq`` (first monomer of microheterogeneity), modelled
    ones matched by ``label_seq_id``; ligands, ions and branched entities are one chain per
    label ID with their modelled residues. ``_struct_conn`` covalent links become bonds.
    Raises :class:`InputError` for an unreadable file or a residue code not in the CCD.
    """
    path = Path(path)
    src = os.fspath(path)
    ccd = ccd or default_ccd()
    if not path.is_file():
        raise InputError(src, None, "mmCIF file not found")
    check_mmcif(path)  # size limits (fold_data.limits) before gemmi reads it: InputTooLarge
    try:
        doc = gemmi.cif.read(src)
        if len(doc) == 0:  # sole_block() of an empty file is an IndexError from C++
            raise InputError(src, None, "empty file: expected an mmCIF data block")
        block = doc.sole_block()
        st = gemmi.make_structure_from_block(block)
    except (RuntimeError, ValueError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(src, None, f"not a readable mmCIF file: {err}") from None
    if len(st) == 0:
        raise InputError(src, "_atom_site", "no models (expected at least one)")
    warn_if_truncated(path, block)  # a file cut inside _atom_site: TruncatedMmcifWarning
    st.remove_hydrogens()
    model = st[0]
    dates = sorted(gemmi.cif.as_string(d) for d in
                   block.find_values("_pdbx_audit_revision_history.revision_date"))
    entity_of = {sub: ent for ent in st.entities for sub in ent.subchains}
    entity_number: dict[str, int] = {}
    chains: list[Chain] = []
    where: dict[tuple[str, int, str, str], tuple[str, int]] = {}  # auth address -> (label, index)
    # Group residues by label chain; gemmi splits an author chain into several objects.
    by_label: dict[str, list[gemmi.Residue]] = {}
    author_of: dict[str, str] = {}
    for gchain in model:
        for res in gchain:
            by_label.setdefault(res.subchain, []).append(res)
            author_of.setdefault(res.subchain, gchain.name)
    for label, residues in by_label.items():
        ent = entity_of.get(label)
        if ent is None or ent.entity_type == gemmi.EntityType.Water:
            continue
        author = author_of[label]
        kind = "ligand"
        if ent.entity_type == gemmi.EntityType.Polymer:
            kind = _GEMMI_POLYMER.get(ent.polymer_type, "")
            if not kind:
                raise InputError(src, f"entity {ent.name}", f"polymer type {ent.polymer_type} "
                                 "is not supported; expected protein, DNA or RNA")
        eid = entity_number.setdefault(ent.name, len(entity_number) + 1)
        if kind == "ligand":
            codes = [_code(r.name) for r in residues]
            positions: list[dict[str, np.ndarray] | None] = [_residue_atoms(r) for r in residues]
            for k, r in enumerate(residues):
                where[(author, r.seqid.num, r.seqid.icode, r.name)] = (label, k)
            sequence = ""
        else:
            codes = [_code(gemmi.Entity.first_mon(m)) for m in ent.full_sequence]
            positions = [None] * len(codes)
            for r in residues:
                idx = (r.label_seq or 0) - 1
                if not 0 <= idx < len(codes):
                    raise InputError(src, f"chain {label} residue {r.name} {r.seqid}",
                                     f"label_seq_id {r.label_seq} outside 1..{len(codes)}")
                if positions[idx] is None or _code(r.name) == codes[idx]:
                    positions[idx] = _residue_atoms(r)
                where[(author, r.seqid.num, r.seqid.icode, r.name)] = (label, idx)
            sequence = "".join(_one_letter(c, kind, ccd) for c in codes)
        for k, code in enumerate(codes):
            ccd.require(code, src, f"chain {label} residue {k + 1}", "comp_id")
        chains.append(Chain(label, eid, kind, codes, sequence=sequence, author_id=author,
                            positions=positions))
    if not chains:
        raise InputError(src, None, "no polymer or ligand chains in the first model")
    bonds = []
    for conn in st.connections:
        if conn.type != gemmi.ConnectionType.Covale:
            continue
        ends = []
        for p in (conn.partner1, conn.partner2):
            key = (p.chain_name, p.res_id.seqid.num, p.res_id.seqid.icode, p.res_id.name)
            if key not in where:
                break
            label, idx = where[key]
            name = "SD" if p.res_id.name == "MSE" and p.atom_name == "SE" else p.atom_name
            ends.append((label, idx, name))
        if len(ends) == 2 and ends[0] != ends[1]:
            bonds.append(Bond(ends[0], ends[1]))
    entry_id = gemmi.cif.as_string(block.find_value("_entry.id") or block.name).lower()
    methods = tuple(dict.fromkeys(gemmi.cif.as_string(m).strip().upper()
                                  for m in block.find_values("_exptl.method")))
    return Entry(name=entry_id, chains=chains, bonds=bonds, source=src,
                 resolution=float(st.resolution or 0.0), release_date=dates[0] if dates else None,
                 methods=methods)


def _one_letter(code: str, kind: str, ccd: Ccd) -> str:
    """One-letter code of a polymer residue: itself if standard, else its CCD parent's."""
    for name in (code, (ccd.get(code).parent or "") if ccd.get(code) else ""):
        if kind == "protein" and name in rc.restype_3to1:
            return rc.restype_3to1[name]
        if kind == "rna" and name in _RNA:
            return name
        if kind == "dna" and name in _DNA.values():
            return name[1]
    return "X" if kind == "protein" else "N"


# ------------------------------------------------------------------------------------------------
# FASTA
# ------------------------------------------------------------------------------------------------


def parse_fasta_entry(path: str | os.PathLike, *, name: str | None = None) -> Entry:
    """Protein chains from a FASTA file, one per record (IDs A, B, ...; identical sequences
    share an entity). Raises :class:`InputError` for letters outside the protein alphabet."""
    records = parse_fasta(path)
    if not records:
        raise InputError(path, None, "no FASTA records (expected at least one sequence)")
    chains, entities = [], {}
    for i, (desc, seq) in enumerate(records):
        seq = seq.replace("-", "").replace(".", "").upper()
        bad = sorted(set(seq) - _LETTERS["protein"])
        if not seq or bad:
            raise InputError(path, f"record {i + 1} {desc.split()[0] if desc else ''}".strip(),
                             f"sequence has letters {bad or 'none'}; expected protein letters")
        cid = _chain_letter(i)
        eid = entities.setdefault(seq, len(entities) + 1)
        chains.append(Chain(cid, eid, "protein", polymer_codes(seq, "protein"), sequence=seq,
                            author_id=cid))
    return Entry(name=name or Path(path).stem, chains=chains, source=os.fspath(path))


def _chain_letter(i: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = letters[r] + out
    return out
