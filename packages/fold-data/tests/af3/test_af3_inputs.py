"""AF3 input JSON, mmCIF complexes and FASTA -> Entry; bad input names the entity and field."""

from __future__ import annotations

import copy
import json

import pytest
from fold_data.af3 import make_features
from fold_data.af3.parse import parse_af3_json, parse_complex_mmcif, parse_fasta_entry
from fold_data.errors import InputError


def test_json_examples(jsons, full_ccd):
    tetr = parse_af3_json(jsons / "tetr_dimer_dna.json", ccd=full_ccd)
    assert [(c.chain_id, c.mol_type, c.entity_id, len(c.residues)) for c in tetr.chains] == [
        ("A", "protein", 1, 218), ("B", "protein", 1, 218), ("C", "dna", 2, 20),
        ("D", "dna", 3, 20)]
    assert tetr.chains[2].residues[:3] == ["DT", "DA", "DC"]
    kras = parse_af3_json(jsons / "kras_g12c_sotorasib.json", ccd=full_ccd)
    assert kras.chains[0].residues[11] == "CYS"  # G12C
    assert [(b.a, b.b) for b in kras.bonds] == [(("A", 11, "SG"), ("B", 0, "C25"))]
    dna = parse_af3_json(jsons / "methylated_dna.json", ccd=full_ccd)
    assert [i for i, c in enumerate(dna.chains[0].residues) if c == "5CM"] == [4, 8, 12, 16]
    glyco = parse_af3_json(jsons / "rnaseb_glycosylated.json", ccd=full_ccd)
    assert glyco.chains[1].residues == ["NAG", "NAG", "BMA", "MAN", "MAN"]
    assert len(glyco.bonds) == 5
    smiles = parse_af3_json(jsons / "streptavidin_biotin_smiles.json", ccd=full_ccd)
    assert smiles.chains[1].smiles.startswith("OC(=O)") and smiles.chains[1].residues == []


def _write(tmp_path, doc) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    return path


BASE = {"name": "t", "modelSeeds": [1], "dialect": "alphafold3", "version": 4,
        "sequences": [{"protein": {"id": "A", "sequence": "MKCLV"}},
                      {"dna": {"id": "B", "sequence": "ACGT"}},
                      {"ligand": {"id": "C", "ccdCodes": ["ATP"]}}]}


def _broken(edit):
    doc = copy.deepcopy(BASE)
    edit(doc)
    return doc


@pytest.mark.parametrize("edit, record, expected", [
    (lambda d: d.pop("sequences"), "job", "missing field 'sequences'"),
    (lambda d: d.update(dialect="alphafoldserver"), "job", "field 'dialect'"),
    (lambda d: d.update(extra=1), "job", "unknown fields ['extra']"),
    (lambda d: d.update(modelSeeds=[]), "job", "field 'modelSeeds'"),
    (lambda d: d["sequences"][0]["protein"].update(sequence=5), "sequences[0] protein A",
     "field 'sequence' is int"),
    (lambda d: d["sequences"][0]["protein"].update(sequence="MKZ"), "sequences[0] protein A",
     "field 'sequence' has letters ['Z']"),
    (lambda d: d["sequences"][1]["dna"].update(id="A"), "sequences[1] dna A",
     "chain ID 'A' is used twice"),
    (lambda d: d["sequences"][0]["protein"].update(colour="red"), "sequences[0] protein A",
     "unknown fields ['colour']"),
    (lambda d: d["sequences"][2]["ligand"].update(ccdCodes=["QQQQ"]), "sequences[2] ligand C",
     "field 'ccdCodes[0]': unknown CCD code 'QQQQ'"),
    (lambda d: d["sequences"][2]["ligand"].update(smiles="CC"), "sequences[2] ligand C",
     "exactly one of the fields 'ccdCodes' and 'smiles'"),
    # SEP (phosphoserine) on a cysteine: the modification does not fit the residue.
    (lambda d: d["sequences"][0]["protein"].update(
        modifications=[{"ptmType": "SEP", "ptmPosition": 3}]), "sequences[0] protein A",
     "field 'modifications[0]': SEP modifies SER but residue 3 is CYS"),
    (lambda d: d["sequences"][1]["dna"].update(
        modifications=[{"modificationType": "5CM", "basePosition": 1}]), "sequences[1] dna B",
     "5CM modifies DC but residue 1 is DA"),
    (lambda d: d["sequences"][1]["dna"].update(
        modifications=[{"modificationType": "SEP", "basePosition": 2}]), "sequences[1] dna B",
     "expected a dna residue"),
    (lambda d: d["sequences"][0]["protein"].update(
        modifications=[{"ptmType": "SEP", "ptmPosition": 9}]), "sequences[0] protein A",
     "'modifications[0].ptmPosition' is 9; expected 1..5"),
    (lambda d: d.update(bondedAtomPairs=[[["A", 3, "SG"], ["C", 1, "XX9"]]]),
     "bondedAtomPairs[0][1]", "atom 'XX9' is not in ATP"),
    (lambda d: d.update(bondedAtomPairs=[[["A", 3, "SG"], ["Z", 1, "C1"]]]),
     "bondedAtomPairs[0][1]", "chain 'Z' is not in 'sequences'"),
])
def test_bad_json_names_entity_and_field(tmp_path, full_ccd, edit, record, expected):
    path = _write(tmp_path, _broken(edit))
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=full_ccd)
    assert err.value.path == str(path) and err.value.record == record
    assert expected in err.value.reason


def test_good_modification_and_bad_smiles(tmp_path, full_ccd):
    doc = copy.deepcopy(BASE)
    doc["sequences"][0]["protein"]["modifications"] = [{"ptmType": "SEP", "ptmPosition": 5 - 4}]
    doc["sequences"][0]["protein"]["sequence"] = "SKCLV"
    entry = parse_af3_json(_write(tmp_path, doc), ccd=full_ccd)
    assert entry.chains[0].residues[0] == "SEP"
    doc["sequences"][2] = {"ligand": {"id": "C", "smiles": "C1CC(N"}}
    with pytest.raises(InputError, match="field 'smiles': RDKit cannot parse") as err:
        make_features(_write(tmp_path, doc), ccd=full_ccd)
    assert err.value.record == "ligand C"


def test_mmcif_complexes(structures, full_ccd):
    igy = parse_complex_mmcif(structures / "1igy.cif", ccd=full_ccd)
    kinds = [(c.chain_id, c.mol_type, len(c.residues)) for c in igy.chains]
    assert kinds == [("A", "protein", 213), ("B", "protein", 434), ("C", "protein", 213),
                     ("D", "protein", 434), ("E", "ligand", 9), ("F", "ligand", 9)]
    assert igy.chains[0].entity_id == igy.chains[2].entity_id
    n_links = [b for b in igy.bonds if {b.a[0], b.b[0]} in ({"B", "E"}, {"D", "F"})]
    assert {(b.a[2], b.b[2]) for b in n_links} == {("ND2", "C1")}  # N-linked glycans
    pyp = parse_complex_mmcif(structures / "4i39.cif", ccd=full_ccd)
    assert pyp.chains[1].residues == ["HC4"]
    assert {(b.a, b.b) for b in pyp.bonds} == {(("A", 68, "SG"), ("B", 0, "C1"))}
    rna = parse_complex_mmcif(structures / "4p5j.cif", ccd=full_ccd)
    assert rna.chains[0].mol_type == "rna" and rna.chains[0].residues[-1] == "A23"
    assert sorted({c.residues[0] for c in rna.chains[1:]}) == ["IRI", "MG", "SPM"]


def test_mmcif_protein_dna(openfold_data, full_ccd):
    entry = parse_complex_mmcif(openfold_data / "mmcifs" / "2q2k.cif", ccd=full_ccd)
    dna = entry.chains[0]
    assert (dna.chain_id, dna.author_id, dna.mol_type, len(dna.residues)) == ("A", "F", "dna", 20)
    # 5-iodo-dU's parent DU is no standard DNA letter: unknown (N) in the one-letter sequence.
    assert [i for i, c in enumerate(dna.residues) if c == "5IU"] == [6, 9]
    assert dna.sequence == "AGTATANACNAGTATATACT"
    assert [(c.author_id, len(c.residues)) for c in entry.chains[1:3]] == [("A", 70), ("B", 70)]


def test_fasta(full_ccd):
    from pathlib import Path

    fasta = Path(__file__).resolve().parents[4] / "data" / "demo" / "monomer" / "short.fasta"
    if not fasta.is_file():
        pytest.skip(f"{fasta} not found")
    entry = parse_fasta_entry(fasta)
    assert len(entry.chains) == 1 and len(entry.chains[0].residues) == 73
    feats = make_features(entry, ccd=full_ccd)
    assert feats["restype"].shape == (73,) and feats["is_protein"].all()
