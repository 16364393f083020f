"""discover_chains: OpenFold's data-directory layout, on the bundled data and on built trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from fold_data.dataset import discover_chains, parse_chain_name
from fold_data.errors import InputError, InputWarning

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "openfold-testdata"


def make_tree(root: Path, chains: dict[str, list[str]], mmcifs: list[str]) -> Path:
    (root / "mmcifs").mkdir(parents=True)
    for pdb in mmcifs:
        (root / "mmcifs" / f"{pdb}.cif").write_text(f"data_{pdb}\n")
    for name, files in chains.items():
        d = root / "alignments" / name
        d.mkdir(parents=True)
        for f in files:
            (d / f).write_text(">q\nMK\n")
    return root


def test_demo_chains():
    if not DEMO.is_dir():
        pytest.skip("data/demo is absent")
    entries = discover_chains(DEMO)
    assert [e.name for e in entries] == ["1psm_A", "2q2k_A", "2q2k_B", "3u8v_A", "3zee_A", "4zey_A"]
    e = {x.name: x for x in entries}
    assert e["4zey_A"].mmcif_path == DEMO / "mmcifs" / "4zey.cif" and e["4zey_A"].chain_id == "A"
    assert [p.name for p in e["4zey_A"].msa_paths] == [
        "uniref90_hits.sto", "bfd_uniclust_hits.a3m", "mgnify_hits.sto"]
    assert e["4zey_A"].template_hits.name == "hmm_output.sto"
    assert e["2q2k_B"].template_hits is None  # 2q2k has no hmm_output.sto
    assert e["4zey_A"].input_paths[0] == e["4zey_A"].mmcif_path
    assert len(e["4zey_A"].input_paths) == 5
    # Listed explicitly, a chain with an mmCIF but no alignments is a single-sequence chain.
    (single,) = discover_chains(DEMO, ["4i6p_A"])
    assert single.msa_paths == () and single.template_hits is None


def test_shared_data_skips_chain_without_mmcif():
    if not SHARED.is_dir():
        pytest.skip("shared openfold-testdata is absent")
    with pytest.warns(InputWarning, match="1hf9"):
        names = [e.name for e in discover_chains(SHARED)]
    assert "1hf9_A" not in names and "5kc1_A" in names
    for e in discover_chains(SHARED, ["4zey_A"]):
        assert "uniprot_hits.sto" not in [p.name for p in e.msa_paths]  # pairing, not an MSA


def test_layout_rules(tmp_path):
    root = make_tree(
        tmp_path / "d",
        {
            "1abc_A": ["mgnify_hits.sto", "bfd_uniclust_hits.a3m", "uniprot_hits.sto",
                       "pdb70_hits.hhr", "notes.txt", "uniref90_hits.sto", "zz_extra.a3m"],
            "1abc_B": [],
            "9zzz_A": ["uniref90_hits.sto"],  # its mmCIF is missing
        },
        ["1abc"],
    )
    (root / "alignments" / "loose_file.a3m").write_text(">q\nMK\n")  # not a chain folder
    with pytest.warns(InputWarning, match=r"9zzz_A.*9zzz.cif"):
        entries = discover_chains(root)
    assert [e.name for e in entries] == ["1abc_A", "1abc_B"]
    a, b = entries
    assert [p.name for p in a.msa_paths] == [
        "uniref90_hits.sto", "bfd_uniclust_hits.a3m", "mgnify_hits.sto", "zz_extra.a3m"]
    assert a.template_hits.name == "pdb70_hits.hhr"
    assert b.msa_paths == () and b.template_hits is None
    # Explicit chains: given order, missing mmCIF is an error, missing alignments are fine.
    assert [e.name for e in discover_chains(root, ["1abc_B", "1abc_A", "1abc_C"])] == [
        "1abc_B", "1abc_A", "1abc_C"]
    with pytest.raises(InputError, match=r"9zzz.cif.*9zzz_A.*mmCIF"):
        discover_chains(root, ["9zzz_A"])
    with pytest.raises(InputError, match="listed twice"):
        discover_chains(root, ["1abc_A", "1abc_A"])
    with pytest.raises(InputError, match="<pdb>_<chain>"):
        discover_chains(root, ["1abc"])


def test_bad_directories(tmp_path):
    with pytest.raises(InputError, match=r"mmcifs.*<pdb>.cif"):
        discover_chains(tmp_path)
    root = make_tree(tmp_path / "d", {}, ["1abc"])
    with pytest.raises(InputError, match="alignments.*name the chains"):
        discover_chains(root)
    assert discover_chains(root, ["1abc_A"])[0].msa_paths == ()
    (root / "alignments").mkdir()
    with pytest.raises(InputError, match="at least one"):
        discover_chains(root)
    two_hits = make_tree(tmp_path / "e", {"1abc_A": ["hmm_output.sto", "pdb70_hits.hhr"]}, ["1abc"])
    with pytest.raises(InputError, match="at most one template-hit file"):
        discover_chains(two_hits)


def test_parse_chain_name():
    assert parse_chain_name("4zey_A") == ("4zey", "A")
    assert parse_chain_name("5kc1_AA") == ("5kc1", "AA")
    for bad in ("4zey", "4zey_", "_A", "4zey_A_B", "4zey A"):
        with pytest.raises(InputError):
            parse_chain_name(bad)
