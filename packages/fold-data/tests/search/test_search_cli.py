"""``fold-data msa`` end to end."""

from __future__ import annotations

import json

from _search_helpers import MMCIFS, NUCLEIC, SEQRES, UNIPROT, UNIREF
from fold_data.cli import main
from fold_data.msa import parse_a3m


def test_msa_command_on_a_two_chain_fasta(tmp_path, capsys, nrbf2, par3):
    fasta = tmp_path / "complex.fasta"
    fasta.write_text(f">nrbf2\n{nrbf2}\n>par3\n{par3}\n")
    out = tmp_path / "out"
    argv = ["msa", str(fasta), "--out", str(out), "--db", f"uniref90={UNIREF}",
            "--db", f"uniprot={UNIPROT}", "--seqres", str(SEQRES), "--cpus", "2",
            "--no-progress"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["chains"]) == {"A", "B"}
    assert summary["cache_misses"] == 6  # 2 chains x 2 databases + 2 template searches
    a = parse_a3m(out / "paired" / "complex_A.a3m")
    b = parse_a3m(out / "paired" / "complex_B.a3m")
    assert len(a) == len(b) > 1
    assert (out / "complex_B" / "hmm_output.sto").is_file()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["cache_hits"] == 6


def test_msa_command_on_an_mmcif(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["msa", str(MMCIFS / "4i6p.cif"), "--out", str(out), "--db",
                 f"uniref90={UNIREF}", "--no-progress", "--no-cache"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # a homodimer: both chains get the alignment of their one sequence, nothing is paired
    assert set(summary["chains"]) == {"A", "B"}
    assert summary["chains"]["A"]["rows"] == summary["chains"]["B"]["rows"]
    assert summary["chains"]["A"]["rows"]["uniref90"] >= 1
    assert not (out / "paired").exists()
    assert not (out / "cache").exists()


def test_msa_command_reports_a_missing_database(tmp_path, capsys, nrbf2):
    fasta = tmp_path / "q.fasta"
    fasta.write_text(f">q\n{nrbf2}\n")
    missing = tmp_path / "uniref90.fasta.gz"
    assert main(["msa", str(fasta), "--out", str(tmp_path / "out"),
                 "--db", f"uniref90={missing}", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "sequence database not found" in err


def test_msa_command_reports_an_empty_query(tmp_path, capsys):
    fasta = tmp_path / "q.fasta"
    fasta.write_text(">q\n\n")
    assert main(["msa", str(fasta), "--out", str(tmp_path / "out"),
                 "--db", f"uniref90={UNIREF}", "--no-progress"]) == 1
    assert "empty query sequence" in capsys.readouterr().err


def test_msa_command_on_an_af3_json(tmp_path, capsys, nrbf2):
    doc = {"name": "nrbf2 with RNA", "modelSeeds": [1], "dialect": "alphafold3", "version": 2,
           "sequences": [{"protein": {"id": ["A", "B"], "sequence": nrbf2}},
                         {"rna": {"id": "R", "sequence": "UUAGCUCGCCAGUUAGCGAGGUCUGUCUCG"}},
                         {"ligand": {"id": "L", "ccdCodes": ["ATP"]}}]}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["msa", str(path), "--out", str(out), "--db", f"uniref90={UNIREF}",
                 "--db", f"rfam={NUCLEIC}", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["chains"]) == {"A", "B", "R"}
    assert summary["chains"]["R"]["molecule"] == "rna"
    assert (out / "nrbf2withRNA_R" / "rfam_hits.a3m").is_file()
    assert summary["cache_misses"] == 2  # the two copies of the protein are searched once
