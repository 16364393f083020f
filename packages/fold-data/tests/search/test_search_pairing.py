"""Pairing by species across chains (two-chain heteromer of NRBF2 and Par-3, both with hits from
many vertebrates in the bundled UniProt set)."""

from __future__ import annotations

from _search_helpers import write_config
from fold_data.msa import parse_a3m
from fold_data.search import SearchChain, load_config, run_search
from fold_data.search.hits import A3mRow
from fold_data.search.pairing import pair_by_species


def test_two_chains_are_paired_by_species(tmp_path, nrbf2, par3):
    config = load_config(write_config(tmp_path))
    chains = [SearchChain("A", "protein", nrbf2), SearchChain("B", "protein", par3)]
    result = run_search(chains, config, tmp_path / "out", name="x", cpus=2)
    a = parse_a3m(result.chains["A"].paired_path)
    b = parse_a3m(result.chains["B"].paired_path)
    assert len(a) == len(b) > 1
    assert a.sequences[0] == nrbf2 and b.sequences[0] == par3
    for sa, sb in zip(a.species[1:], b.species[1:]):
        assert sa and sa == sb
    # every species both chains' UniProt hits share is paired (independently from the files)
    hits_a = parse_a3m(tmp_path / "out" / "pairing" / "x_A" / "uniprot_hits.a3m")
    hits_b = parse_a3m(tmp_path / "out" / "pairing" / "x_B" / "uniprot_hits.a3m")
    shared = (set(hits_a.species[1:]) & set(hits_b.species[1:])) - {""}
    assert shared and set(a.species[1:]) == shared
    # unpaired rows are written as well, per chain
    assert parse_a3m(result.chains["B"].msa_paths[0]).sequences[0] == par3


def _row(name, species, evalue):
    return A3mRow(f"tr|X|{name.upper()}_{species}/1-3", f"OS={species.title()}", "ACD", evalue)


def test_pairing_rules():
    chains = {
        "A": ("AAA", [_row("a1", "HUMAN", 1e-9), _row("a2", "HUMAN", 1e-5),
                      _row("a3", "MOUSE", 1e-7), _row("a4", "YEAST", 1e-3)]),
        "B": ("CCC", [_row("b1", "HUMAN", 1e-8), _row("b2", "MOUSE", 1e-4)]),
        "C": ("DDD", [_row("c1", "HUMAN", 1e-6), _row("c2", "YEAST", 1e-2)]),
        "D": ("AAA", []),  # a second copy of A's entity
    }
    paired = pair_by_species(chains)
    assert {k: len(v) for k, v in paired.items()} == {"A": 3, "B": 3, "C": 3, "D": 3}
    names = [[paired[c][i].name.split("|")[2].split("/")[0].lower() if paired[c][i].name != "gap"
              else "gap" for c in "ABC"] for i in range(3)]
    # HUMAN is in all three chains (first), with one row (C has one HUMAN hit); then the
    # two-chain species by best E-value: MOUSE (A, B), YEAST (A, C); chains without it: gaps
    assert names[0] == ["a1_human", "b1_human", "c1_human"]
    assert names[1] == ["a3_mouse", "b2_mouse", "gap"]
    assert names[2] == ["a4_yeast", "gap", "c2_yeast"]
    # a2_HUMAN is not paired: the other chains have one HUMAN hit each
    assert paired["D"] is paired["A"]
    assert paired["B"][2].row == "---"


def test_one_entity_is_not_paired():
    rows = [_row("a1", "HUMAN", 1e-9)]
    assert pair_by_species({"A": ("AAA", rows), "B": ("AAA", rows)}) == {"A": [], "B": []}


def test_species_from_uniprot_uniref_and_bare_ox_headers():
    from fold_data.search.species import hit_species

    assert hit_species("tr|A0A2K5JW76|A0A2K5JW76_COLAP", "Nrbf2 OS=Colobus OX=336983") == "COLAP"
    assert hit_species("MGYP000613015979", "PL=11 OX=10090") == "10090"
    assert hit_species("UniRef90_Q96F24", "NRBF2 n=58 Tax=Simiiformes TaxID=314293") == "314293"
    assert hit_species("MGYP000613015979", "PL=11 UP=0 BIOMES=0000000011000") == ""
