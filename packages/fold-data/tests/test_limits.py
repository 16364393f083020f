"""Size limits (fold_data.limits): inputs are sized before any work, the estimates match what
the parsers make, and an input over a limit is refused with the file, the numbers and the option
that raises the limit: a 1M-residue mmCIF before gemmi reads it, an AF3 JSON of 2000 chains
before tokenization, a chain over the limits in a cache build (the others still build)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fold_data.af3 import Ccd, make_features
from fold_data.af3.parse import parse_af3_json
from fold_data.cache import build_cache
from fold_data.cli import main as fold_data_main
from fold_data.limits import (
    InputTooLarge,
    SizeLimits,
    entry_size,
    mmcif_size,
    msa_rows,
    sequence_size,
    use_limits,
)
from fold_data.mmcif import parse_mmcif
from fold_data.msa import parse_a3m, read_stockholm_alignment

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
CCD = DEMO / "af3" / "ccd.cif"
needs_demo = pytest.mark.skipif(not DEMO.is_dir(), reason="bundled demo data not found")


def _mmcif(path: Path, n_res: int, copies: int = 1) -> Path:
    """A well-formed mmCIF of one protein entity of ``n_res`` residues in ``copies`` chains, one
    atom modelled per chain."""
    asym = "".join(f"{chr(65 + c)} 1\n" for c in range(copies))
    atoms = "".join(f"ATOM {c + 1} C CA . ALA {chr(65 + c)} 1 1 ? 0.0 0.0 0.0 1.0 0.0 1 "
                    f"{chr(65 + c)} 1\n" for c in range(copies))
    path.write_text(
        "data_big\n_entry.id BIG\n#\n_entity.id 1\n_entity.type polymer\n#\n"
        "_entity_poly.entity_id 1\n_entity_poly.type 'polypeptide(L)'\n#\n"
        "loop_\n_entity_poly_seq.entity_id\n_entity_poly_seq.num\n_entity_poly_seq.mon_id\n"
        "_entity_poly_seq.hetero\n" + "".join(f"1 {i + 1} ALA n\n" for i in range(n_res))
        + "#\nloop_\n_struct_asym.id\n_struct_asym.entity_id\n" + asym + "#\n"
        "loop_\n_atom_site.group_PDB\n_atom_site.id\n_atom_site.type_symbol\n"
        "_atom_site.label_atom_id\n_atom_site.label_alt_id\n_atom_site.label_comp_id\n"
        "_atom_site.label_asym_id\n_atom_site.label_entity_id\n_atom_site.label_seq_id\n"
        "_atom_site.pdbx_PDB_ins_code\n_atom_site.Cartn_x\n_atom_site.Cartn_y\n"
        "_atom_site.Cartn_z\n_atom_site.occupancy\n_atom_site.B_iso_or_equiv\n"
        "_atom_site.auth_seq_id\n_atom_site.auth_asym_id\n_atom_site.pdbx_PDB_model_num\n"
        + atoms + "#\n")
    return path


def test_a_million_residue_mmcif_is_refused_before_parsing(tmp_path):
    path = _mmcif(tmp_path / "big.cif", 1_000_000)
    with pytest.raises(InputTooLarge) as err:
        parse_mmcif(path)
    e = err.value
    assert e.path == str(path) and e.record == "whole file"
    assert e.reason.startswith("input too large to featurise: 1000000 tokens/residues > the "
                               "limit of 400000 (--max-tokens) (1 chains, 1000000 tokens, 1 "
                               "atoms, 1 MSA rows; largest: entity 1: 1000000 residues x 1 "
                               "chains). Options: crop the input")


def test_the_limit_is_raised_for_a_block(tmp_path):
    path = _mmcif(tmp_path / "two.cif", 600, copies=2)
    assert mmcif_size(path).n_tokens == 1200
    with use_limits(SizeLimits(max_tokens=1000)), pytest.raises(InputTooLarge,
                                                                 match="1200 tokens/residues "
                                                                       "> the limit of 1000"):
        parse_mmcif(path)
    with use_limits(SizeLimits(max_tokens=2000)):
        assert parse_mmcif(path).chains["A"].num_res == 600


@needs_demo
@pytest.mark.parametrize("name, chains, residues", [
    ("2q2k", 3, 160), ("3u8v", 2, 186), ("4zey", 1, 84), ("1psm", 1, 38)])
def test_mmcif_size_counts_every_polymer_residue(name, chains, residues):
    size = mmcif_size(DEMO / "mmcifs" / f"{name}.cif")
    structure = parse_mmcif(DEMO / "mmcifs" / f"{name}.cif")
    assert (size.n_chains, size.n_tokens) == (chains, residues)
    assert residues == sum(c.num_res for c in structure.chains.values())


@needs_demo
def test_msa_rows_match_the_parsers():
    monomer = DEMO / "monomer"
    assert msa_rows(monomer / "bfd_uniclust_hits.a3m") == len(parse_a3m(monomer /
                                                                        "bfd_uniclust_hits.a3m"))
    for sto in ("uniref90_hits.sto", "mgnify_hits.sto"):
        assert msa_rows(monomer / sto) == len(read_stockholm_alignment(monomer / sto).rows)
    size = sequence_size("q.fasta", "MKV" * 10, [monomer / "bfd_uniclust_hits.a3m",
                                                 monomer / "uniref90_hits.sto"])
    assert size.n_msa_rows == 1 + 1023 + msa_rows(monomer / "uniref90_hits.sto") - 1
    assert size.msa_bytes == size.n_msa_rows * 30 * 8


@needs_demo
@pytest.mark.parametrize("name", ["fkbp51_fk506.json", "streptavidin_biotin_smiles.json"])
def test_entry_size_matches_the_tokenizer(name):
    ccd = Ccd([CCD], use_biotite=False)
    entry = parse_af3_json(DEMO / "af3" / "inputs" / name, ccd=ccd)
    size = entry_size(entry, ccd)
    raw = make_features(entry, ccd=ccd)
    assert size.n_tokens == len(raw["restype"])
    assert size.n_atoms == len(raw["atom_to_token"])


def _json(tmp_path: Path, n_chains: int, sequence: str, msa: str | None = None) -> Path:
    ids = []
    for i in range(n_chains):  # A..Z, AA..ZZ, ...
        s, i = "", i + 1
        while i:
            i, r = divmod(i - 1, 26)
            s = chr(65 + r) + s
        ids.append(s)
    protein = {"id": ids, "sequence": sequence}
    if msa is not None:
        protein["unpairedMsa"] = msa
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"name": "many", "dialect": "alphafold3", "version": 4,
                                "modelSeeds": [1], "sequences": [{"protein": protein}]}))
    return path


@needs_demo
def test_2000_chains_are_refused_before_tokenization(tmp_path):
    path = _json(tmp_path, 2000, "GAPATVTEQG" * 25)  # 250 residues each: 500 000 tokens
    with pytest.raises(InputTooLarge) as err:
        make_features(path, ccd=Ccd([CCD], use_biotite=False))
    e = err.value
    assert e.path == str(path) and e.record == "many"
    assert "500000 tokens/residues > the limit of 400000 (--max-tokens)" in e.reason
    assert "(2000 chains, 500000 tokens, " in e.reason
    assert "largest: chain A: 250 tokens" in e.reason


@needs_demo
def test_msa_memory_is_refused_with_the_numbers(tmp_path):
    query = "GAPATVTEQG" * 5
    msa = "".join(f">hit{i}\n{query}\n" for i in range(1000))  # with the query: 1001 rows
    path = _json(tmp_path, 100, query, f">query\n{query}\n{msa}")
    with use_limits(SizeLimits(max_msa_bytes=10 * 2**20)), pytest.raises(InputTooLarge) as err:
        make_features(path, ccd=Ccd([CCD], use_biotite=False))
    assert ("MSA features of 1001 rows x 5000 tokens = 38.2 MiB > the limit of 10.0 MiB "
            "(--max-msa-memory)") in err.value.reason


@needs_demo
def test_cache_build_fails_the_chain_over_the_limit_and_builds_the_rest(tmp_path, capsys):
    report = build_cache(DEMO, tmp_path / "cache", workers=1, chains=["1psm_A", "4zey_A"],
                         progress=False, limits=SizeLimits(max_tokens=50))
    by_name = {r.name: r for r in report.results}
    assert by_name["1psm_A"].status == "built"  # 38 residues
    assert by_name["4zey_A"].status == "failed"
    assert by_name["4zey_A"].error.startswith(
        f"{DEMO / 'mmcifs' / '4zey.cif'} [whole file]: input too large to featurise: 84 "
        "tokens/residues > the limit of 50 (--max-tokens)")
    # the CLI: the same limit from --max-tokens, exit status 1, the chain named
    code = fold_data_main(["cache", str(DEMO), "--out", str(tmp_path / "cli"), "--workers", "1",
                           "--chains", "4zey_A", "--no-progress", "--max-tokens", "50"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED 4zey_A: " in out and "> the limit of 50 (--max-tokens)" in out
