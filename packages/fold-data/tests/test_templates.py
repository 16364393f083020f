"""Template features from real HHsearch / hmmsearch hits and the demo mmCIFs."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.errors import InputError, InputWarning
from fold_data.mmcif import parse_mmcif
from fold_data.template_hits import TemplateHit, parse_hhr, parse_hmmsearch_sto
from fold_data.templates import make_template_features, realign_segment

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
MMCIFS = DEMO / "mmcifs"
QUERY = "".join((DEMO / "monomer" / "short.fasta").read_text().splitlines()[1:]).strip()


@pytest.fixture(scope="module")
def hhr_hits():
    return parse_hhr(DEMO / "monomer" / "pdb70_hits.hhr")


def _run(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        feats = make_template_features(*args, **kwargs)
    return feats, [w for w in caught if issubclass(w.category, InputWarning)]


def _check_shapes(feats, t, n):
    assert feats["template_aatype"].shape == (t, n) and feats["template_aatype"].dtype == np.int32
    assert feats["template_all_atom_positions"].shape == (t, n, 37, 3)
    assert feats["template_all_atom_mask"].shape == (t, n, 37)
    assert feats["template_all_atom_positions"].dtype == np.float32
    assert feats["template_sum_probs"].shape == (t,)
    assert feats["template_domain_names"].shape == (t,)
    assert feats["template_domain_names"].dtype.kind == "S"


def test_hhr_hits_with_missing_files(hhr_hits):
    feats, warned = _run(QUERY, hhr_hits, MMCIFS, max_hits=20)
    messages = [str(w.message) for w in warned]
    assert any("1hf9_B" in m and "1hf9.cif" in m for m in messages)  # the missing top hit
    names = [n.decode() for n in feats["template_domain_names"]]
    present = {p.stem for p in MMCIFS.glob("*.cif")}
    assert names and all(n.split("_")[0] in present for n in names)
    _check_shapes(feats, len(names), len(QUERY))
    # Ranked by sum_probs.
    assert np.all(np.diff(feats["template_sum_probs"]) <= 0)
    assert names[0] == "3u8v_A"

    # The 3u8v hit's aligned template residues carry the mmCIF chain's atoms.
    hit = next(h for h in hhr_hits if h.name.lower() == "3u8v_a")
    chain = parse_mmcif(MMCIFS / "3u8v.cif").get_chain("A")
    t = names.index("3u8v_A")
    seen = 0
    for qi, ti in zip(hit.indices_query, hit.indices_hit):
        if qi < 0 or ti < 0:
            continue
        assert feats["template_aatype"][t, qi] == chain.aatype[ti]
        np.testing.assert_array_equal(feats["template_all_atom_positions"][t, qi],
                                      chain.atom37_positions[ti])
        np.testing.assert_array_equal(feats["template_all_atom_mask"][t, qi], chain.atom37_mask[ti])
        seen += 1
    assert seen > 20
    unaligned = set(range(len(QUERY))) - {q for q, h in zip(hit.indices_query, hit.indices_hit)
                                          if q >= 0 and h >= 0}
    assert all(feats["template_aatype"][t, q] == 21 for q in unaligned)
    assert feats["template_all_atom_mask"][t, sorted(unaligned)].sum() == 0


def test_max_hits_and_date_filter(hhr_hits):
    feats, _ = _run(QUERY, hhr_hits, MMCIFS, max_hits=2)
    assert len(feats["template_aatype"]) == 2
    feats, _ = _run(QUERY, hhr_hits, MMCIFS, max_template_date="2012-01-01", max_hits=20)
    names = {n.decode().split("_")[0] for n in feats["template_domain_names"]}
    # Released after the cut-off: 4zey (2015), 3zee and 4i6p (2013).
    assert names and not names & {"4zey", "3zee", "4i6p"}
    assert "3u8v" in names  # released 2011-11-09
    with pytest.raises(InputError, match="max_template_date"):
        make_template_features(QUERY, hhr_hits, MMCIFS, max_template_date="yesterday")


def test_each_mmcif_parsed_once(hhr_hits, monkeypatch):
    import fold_data.mmcif as mmcif_module  # templates imports its reader when it needs it

    calls: list[str] = []
    real = mmcif_module.parse_mmcif

    def counting(path):
        calls.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(mmcif_module, "parse_mmcif", counting)
    twice = list(hhr_hits) + [dataclasses.replace(h, index=h.index + 100) for h in hhr_hits]
    _run(QUERY, twice, MMCIFS, max_hits=40)
    assert len(calls) == len(set(calls)) > 3


def test_hmmsearch_self_hit_excluded_and_missing_entries_warned():
    chain = parse_mmcif(MMCIFS / "4zey.cif").get_chain("A")
    hits = parse_hmmsearch_sto(DEMO / "alignments" / "4zey_A" / "hmm_output.sto", chain.sequence)
    assert any(h.pdb_id.lower() == "4zey" for h in hits)
    feats, warned = _run(chain.sequence, hits, MMCIFS, max_hits=4)
    names = [n.decode() for n in feats["template_domain_names"]]
    assert "4zey_A" not in names  # identical to the query
    assert not any("4zey" in str(w.message) for w in warned)
    assert any("not found" in str(w.message) for w in warned)
    _check_shapes(feats, len(names), chain.num_res)


def _hit(query: str, template: str, q_start: int, t_start: int, name="3u8v_A") -> TemplateHit:
    """A gapless hit aligning query[q_start:] to template residues numbered from t_start."""
    n = len(template)
    return TemplateHit(index=0, name=name, pdb_id=name[:4], chain_id=name[5:], aligned_cols=n,
                       sum_probs=50.0, query=query[q_start:q_start + n], hit_sequence=template,
                       indices_query=list(range(q_start, q_start + n)),
                       indices_hit=list(range(t_start, t_start + n)))


def test_realignment_of_misnumbered_hit():
    chain = parse_mmcif(MMCIFS / "3u8v.cif").get_chain("A")
    # A query whose residues 2..51 are template 10..59 (and longer, so not "the query itself").
    query = "GG" + chain.sequence[10:60] + "W" * 20
    right = _hit(query, chain.sequence[10:60], 2, 10)
    wrong = _hit(query, chain.sequence[10:60], 2, 13)  # numbering off by three
    a, warned_a = _run(query, [right], MMCIFS)
    b, warned_b = _run(query, [wrong], MMCIFS)
    assert not warned_a and not warned_b
    for k in ("template_aatype", "template_all_atom_positions", "template_all_atom_mask"):
        np.testing.assert_array_equal(a[k], b[k])
    assert a["template_all_atom_mask"][0, 2:].sum() > 0
    # A hit whose residues are not in the template at all is skipped with a warning.
    junk = _hit(query, "W" * 50, 2, 10)
    c, warned_c = _run(query, [junk], MMCIFS)
    assert len(c["template_aatype"]) == 0 and "realigned" in str(warned_c[0].message)


def test_realign_segment():
    seq = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
    assert realign_segment("AKQRQ", seq) == [6, 7, 8, 9, 10]
    # One mismatch in 20 residues: local alignment, 95% identity.
    seg = seq[5:25]
    mutated = seg[:7] + "W" + seg[8:]
    assert realign_segment(mutated, seq) == list(range(5, 25))
    assert realign_segment("WWWWWWWWWW", seq) is None


def test_missing_chain_and_wrong_query():
    query = "A" * 60
    hit = _hit(query, "A" * 20, 0, 0, name="3u8v_Z")
    feats, warned = _run(query, [hit], MMCIFS)
    assert len(feats["template_aatype"]) == 0
    assert "chain Z" in str(warned[0].message) and "3u8v_Z" in str(warned[0].message)
    bad = dataclasses.replace(hit, query="C" * 20)
    with pytest.raises(InputError, match="another query"):
        make_template_features(query, [bad], MMCIFS)


def test_no_hits():
    feats, warned = _run(QUERY, [], MMCIFS)
    _check_shapes(feats, 0, len(QUERY))
    assert not warned
    assert rc.atom_type_num == feats["template_all_atom_mask"].shape[-1]
