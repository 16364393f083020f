"""jackhmmer / nhmmer searches of real queries against the bundled databases, written as files
fold-data's loaders read."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
from _search_helpers import MMCIFS, NUCLEIC, UNIPROT, UNIREF, sources, write_config
from fold_data.msa import check_query, load_msa, parse_a3m, read_stockholm_alignment
from fold_data.search import PRESETS, SearchChain, load_config, run_search
from fold_data.search.database import load_database
from fold_data.search.jackhmmer import jackhmmer_rows


def _fasta(path):
    opener = gzip.open if path.suffix == ".gz" else open
    records, name = {}, None
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.strip()
            if line.startswith(">"):
                name = line[1:].split()[0]
                records[name] = ""
            elif line:
                records[name] += line
    return records


@pytest.fixture()
def searched(tmp_path, nrbf2):
    config = load_config(write_config(tmp_path))
    chains = [SearchChain("A", "protein", nrbf2)]
    return run_search(chains, config, tmp_path / "out", name="4zey", cpus=2), nrbf2


def test_jackhmmer_finds_the_nrbf2_homologues_and_only_them(searched):
    result, query = searched
    chain = result.chains["A"]
    rows = parse_a3m(chain.folder.parent / "pairing" / "4zey_A" / "uniprot_hits.a3m")
    # the bundled UniProt set holds hits OpenFold's jackhmmer run found for 4ZEY (NRBF2) next
    # to those of Par-3 (4I6P) and SmbP (3U8V)
    raw = jackhmmer_rows(query, load_database(UNIPROT, "protein"), PRESETS["af3"].jackhmmer)
    nrbf2_entries = sources("uniprot_mini", "4zey_A")
    found = {r.name.split("/")[0] for r in raw}
    # every entry OpenFold's jackhmmer run found for 4ZEY, none of the Par-3 / SmbP ones
    assert found == nrbf2_entries
    # pairing rows are capped, not deduplicated (AF3: deduplicate=False for the paired MSA)
    assert len(rows) - 1 == len(raw)
    check_query(rows, query)
    # species for pairing: UniProt mnemonics, read by fold-data's own MSA loader
    assert "PONAB" in rows.species and "" not in rows.species[1:]


def test_rows_are_the_database_residues_aligned_to_the_query(searched):
    result, query = searched
    path = result.chains["A"].msa_paths[0]
    text = path.read_text().splitlines()
    database = _fasta(UNIREF)
    identities = []
    for header, row in zip(text[2::2], text[3::2]):
        name, span = header[1:].split()[0].split("/")
        start, end = map(int, span.split("-"))
        # the row's residues (matches and insertions) are the hit's residues start..end
        assert row.replace("-", "").upper() == database[name][start - 1:end]
        aligned = [c for c in row if not c.islower()]
        assert len(aligned) == len(query)
        pairs = [(a, q) for a, q in zip(aligned, query) if a != "-"]
        identities.append(sum(a == q for a, q in pairs) / len(pairs))
    # orthologues of human NRBF2: the best hits are near-identical to the query
    assert max(identities) > 0.95
    assert np.median(identities) > 0.5


def test_outputs_load_through_fold_data_loaders(searched):
    result, query = searched
    chain = result.chains["A"]
    feats = load_msa(query, chain.msa_paths)
    assert feats["msa"].shape[1] == len(query)
    assert feats["msa"].shape[0] == 1 + chain.rows["uniref90"]


def test_search_json_lists_the_files(searched):
    import json

    result, _ = searched
    doc = json.loads((result.chains["A"].folder.parent / "search.json").read_text())
    assert doc["chains"]["A"]["msas"] == [str(p) for p in result.chains["A"].msa_paths]
    assert doc["chains"]["A"]["rows"]["uniprot"] == result.chains["A"].rows["uniprot"]


def test_max_hits_caps_rows_per_database(tmp_path, nrbf2):
    config_path = write_config(tmp_path, databases={"my_uniref": UNIREF})
    config_path.write_text(config_path.read_text() + 'molecule = "protein"\nmax_hits = 12\n')
    result = run_search([SearchChain("A", "protein", nrbf2)], load_config(config_path),
                        tmp_path / "out", cpus=1)
    raw = jackhmmer_rows(nrbf2, load_database(UNIREF, "protein"), PRESETS["af3"].jackhmmer)
    assert len(raw) > 12
    # the first 12 hits, then without repeats of the query or of an earlier row
    distinct = list(dict.fromkeys(r.aligned for r in raw[:12] if r.aligned != nrbf2))
    assert result.chains["A"].rows["my_uniref"] == len(distinct)
    msa = parse_a3m(result.chains["A"].msa_paths[0])
    assert msa.sequences[1:] == distinct


def test_nhmmer_finds_the_rna_and_not_the_dna(tmp_path):
    tymv = _fasta(NUCLEIC)["4p5j_A"]
    query = tymv[:70]  # the first 70 nucleotides of the TYMV tRNA-like structure
    config = load_config(write_config(tmp_path, databases={"rfam": NUCLEIC}))
    result = run_search([SearchChain("R", "rna", query)], config, tmp_path / "out", cpus=1)
    msa = parse_a3m(result.chains["R"].msa_paths[0])
    # one hit: the TYMV RNA itself (the DNA strands of 2Q2K and 5UGO are not homologous)
    (name,) = [d.split()[0] for d in msa.descriptions[1:]]
    assert name.startswith("4p5j_A/1-")
    end = int(name.rsplit("-", 1)[1])
    assert end >= 65
    assert msa.sequences[1][:end] == query[:end]
    assert "T" not in "".join(msa.sequences)


def test_layout_is_read_as_an_alignments_folder(tmp_path, nrbf2):
    from fold_data.dataset import discover_chains

    config = load_config(write_config(tmp_path))
    root = tmp_path / "root"
    (root / "mmcifs").mkdir(parents=True)
    shutil.copy(MMCIFS / "4zey.cif", root / "mmcifs" / "4zey.cif")
    run_search([SearchChain("A", "protein", nrbf2)], config, root / "alignments", name="4zey",
               cpus=1, cache_dir=None)
    (entry,) = discover_chains(root)
    assert entry.name == "4zey_A"
    assert [p.name for p in entry.msa_paths] == ["uniref90_hits.a3m"]


def test_openfold_jackhmmer_hits_are_found_again(tmp_path, nrbf2):
    """The UniRef90 entries OpenFold's jackhmmer run found for 4ZEY (those in the bundled
    database) are found again with AF's parameters."""
    sto = MMCIFS.parents[1] / "demo" / "alignments" / "4zey_A" / "uniref90_hits.sto"
    if not sto.is_file():
        pytest.skip("demo alignments not present")
    reference = read_stockholm_alignment(sto)
    found = {r.name.split("/")[0] for r in jackhmmer_rows(
        nrbf2, load_database(UNIREF, "protein"), PRESETS["af3"].jackhmmer)}
    database = set(_fasta(UNIREF))
    theirs = {n.split("/")[0] for n in list(reference.rows)[1:]} & database
    assert theirs and len(found & theirs) >= 0.9 * len(theirs)
