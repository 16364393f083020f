"""The AF3 featurizer with the paired rows of a search: paired rows right after the query row,
side by side across chains, then each chain's unpaired rows."""

from __future__ import annotations

import numpy as np
import pytest
from _search_helpers import write_config
from fold_data.af3.msa import make_msa_features
from fold_data.af3.parse import parse_fasta_entry
from fold_data.af3.tokenizer import GAP, restype_of
from fold_data.errors import InputError
from fold_data.msa import parse_a3m
from fold_data.residue_constants import restype_1to3
from fold_data.search import SearchChain, load_config, run_search


def _tokens(entry):
    """One token per residue (standard residues only), as the tokenizer makes them."""
    asym, res, restype = [], [], []
    for a, chain in enumerate(entry.chains):
        asym += [a] * len(chain.residues)
        res += list(range(len(chain.residues)))
        restype += [restype_of(c, chain.mol_type) for c in chain.residues]
    return {"asym_id": np.asarray(asym), "residue_index": np.asarray(res),
            "restype": np.asarray(restype, np.int32),
            "is_ligand": np.zeros(len(asym), np.int32)}


@pytest.fixture()
def complex_search(tmp_path, nrbf2, par3):
    fasta = tmp_path / "complex.fasta"
    fasta.write_text(f">nrbf2\n{nrbf2}\n>par3\n{par3}\n")
    config = load_config(write_config(tmp_path))
    chains = [SearchChain("A", "protein", nrbf2), SearchChain("B", "protein", par3)]
    result = run_search(chains, config, tmp_path / "out", name="complex", cpus=2)
    return parse_fasta_entry(fasta), result


def test_paired_rows_come_first_and_line_up(complex_search):
    entry, result = complex_search
    tokens = _tokens(entry)
    msa_paths = {c: r.msa_paths for c, r in result.chains.items()}
    paired_paths = {c: r.paired_path for c, r in result.chains.items()}
    plain = make_msa_features(entry, tokens, msa_paths)
    feats = make_msa_features(entry, tokens, msa_paths, paired_paths=paired_paths)
    n_a = len(entry.chains[0].residues)
    paired_a = parse_a3m(paired_paths["A"])
    paired_b = parse_a3m(paired_paths["B"])
    depth = len(paired_a) - 1
    assert depth > 0
    assert feats["msa"].shape == (1 + depth + plain["msa"].shape[0] - 1, len(tokens["asym_id"]))
    np.testing.assert_array_equal(feats["msa"][0], plain["msa"][0])
    # row 1 + i holds paired row i of each chain (its letters, gaps as GAP)
    for i in range(depth):
        row = feats["msa"][1 + i]
        letters_a = [GAP if c == "-" else restype_of(restype_1to3[c], "protein")
                     for c in paired_a.sequences[1 + i]]
        letters_b = [GAP if c == "-" else restype_of(restype_1to3[c], "protein")
                     for c in paired_b.sequences[1 + i]]
        np.testing.assert_array_equal(row[:n_a], letters_a)
        np.testing.assert_array_equal(row[n_a:], letters_b)
    # then the unpaired rows, as without pairing; the profile is the unpaired rows'
    np.testing.assert_array_equal(feats["msa"][1 + depth:], plain["msa"][1:])
    np.testing.assert_array_equal(feats["profile"], plain["profile"])


def test_paired_row_counts_must_agree(complex_search, tmp_path):
    entry, result = complex_search
    short = tmp_path / "short.a3m"
    lines = result.chains["B"].paired_path.read_text().splitlines()
    short.write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(InputError, match="paired row counts differ"):
        make_msa_features(entry, _tokens(entry), {},
                          paired_paths={"A": result.chains["A"].paired_path, "B": short})
