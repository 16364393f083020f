"""HHsearch (.hhr) and hmmsearch (Stockholm) template-hit parsing on real and hand-made files."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from fold_data.errors import InputError
from fold_data.msa import parse_a3m, parse_fasta, read_stockholm_alignment
from fold_data.template_hits import TemplateHit, parse_hhr, parse_hmmsearch_sto, split_hit_name

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "demo"
SHARED_MMCIFS = REPO.parent / "shared" / "data" / "openfold-testdata" / "mmcifs"
HHR = DEMO / "monomer" / "pdb70_hits.hhr"

needs_demo = pytest.mark.skipif(not DEMO.is_dir(), reason="data/demo is absent")

HHR_NAMES = ["1hf9_B", "2crb_A", "4zey_A", "3u8v_A", "1psm_A", "5kc1_F", "5kc1_J", "3zee_A",
             "4i6p_A", "2q2k_A"]
# '#=GS' entries of hmm_output.sto (data README, section 1b); all are protein chains.
HMMSEARCH_COUNTS = {"1psm_A": 445, "3u8v_A": 1188, "4zey_A": 1432}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@functools.cache
def _seqres(pdb_id: str, chain_id: str) -> str | None:
    """Full SEQRES (one-letter, MSE -> M) of an author chain, from the mmCIF's entity_poly."""
    gemmi = pytest.importorskip("gemmi")
    for folder in (DEMO / "mmcifs", SHARED_MMCIFS):
        path = folder / f"{pdb_id}.cif"
        if path.is_file():
            break
    else:
        return None
    block = gemmi.cif.read(str(path)).sole_block()
    polys = block.find("_entity_poly.", ["entity_id", "pdbx_strand_id"])
    entity = next((row[0] for row in polys if chain_id in row[1].replace(" ", "").split(",")),
                  None)
    if entity is None:
        return None
    residues: dict[int, str] = {}
    for row in block.find("_entity_poly_seq.", ["entity_id", "num", "mon_id"]):
        if row[0] == entity:
            residues.setdefault(int(row[1]), row[2])  # first of any microheterogeneity
    return "".join(gemmi.find_tabulated_residue(residues[n]).one_letter_code.upper()
                   for n in sorted(residues))


def _check_consistent(hit: TemplateHit, query_sequence: str) -> None:
    """Shared invariants: equal column counts, the query maps onto itself, indices increase."""
    columns = len(hit.query)
    assert columns == len(hit.hit_sequence) == len(hit.indices_query) == len(hit.indices_hit) > 0
    for char, i in zip(hit.query, hit.indices_query):
        assert (char == "-") == (i == -1)
        if i >= 0:
            assert query_sequence[i] == char
    for char, i in zip(hit.hit_sequence, hit.indices_hit):
        assert (char == "-") == (i == -1)
    for indices in (hit.indices_query, hit.indices_hit):
        real = [i for i in indices if i >= 0]
        assert real == list(range(real[0], real[0] + len(real)))  # consecutive, increasing
    assert hit.name == f"{hit.pdb_id}_{hit.chain_id}" and hit.pdb_id == hit.pdb_id.lower()


# --- HHR --------------------------------------------------------------------------------------


@needs_demo
def test_parse_hhr_real_file():
    hits = parse_hhr(HHR)
    query = parse_fasta(DEMO / "monomer" / "short.fasta")[0][1]
    assert [h.name for h in hits] == HHR_NAMES
    assert [h.index for h in hits] == list(range(10))
    # Summary table 'Cols' column.
    assert [h.aligned_cols for h in hits] == [22, 20, 20, 32, 18, 17, 17, 15, 16, 17]
    assert hits[0].sum_probs == pytest.approx(13.1) and hits[3].sum_probs == pytest.approx(15.8)
    first = hits[0]
    assert (first.pdb_id, first.chain_id) == ("1hf9", "B")
    assert first.query == "AEHHHKAAEHHEQAAKHHHAAA"
    assert first.hit_sequence == "ISHHAKEIERLQKEIERHKQSI"
    assert first.indices_query == list(range(6, 28))  # 'Q query 7 ... 28'
    assert first.indices_hit == list(range(9, 31))  # 'T 1HF9_B 10 ... 31'
    for hit in hits:
        _check_consistent(hit, query)
        assert hit.aligned_cols == sum(q >= 0 and t >= 0 for q, t in
                                       zip(hit.indices_query, hit.indices_hit))


@needs_demo
def test_hhr_hit_residues_match_template_seqres():
    """The T residues sit at ``indices_hit`` of the template chain's full SEQRES."""
    checked = 0
    for hit in parse_hhr(HHR):
        seqres = _seqres(hit.pdb_id, hit.chain_id)
        if seqres is None:  # 1hf9 is not in the data; 2crb / 5kc1 only in /work/shared
            continue
        assert "".join(seqres[i] for i in hit.indices_hit if i >= 0) == \
            hit.hit_sequence.replace("-", ""), hit.name
        checked += 1
    assert checked >= 6


HAND_HHR = """\
Query         query
Match_columns 12
No_of_seqs    3 out of 3

 No Hit                             Prob E-value P-value  Score    SS Cols Query HMM  Template HMM
  1 1ABC_A some protein             50.0 1.0E-01 1.0E-05   20.0   0.0   10    2-11     5-12  (30)
  2 7XYZ_AB other                   10.0 1.0E+00 1.0E-04   10.0   0.0    3    1-4      2-4   (9)

No 1
>1ABC_A some protein; X-RAY
Probab=50.00  E-value=0.1  Score=20.00  Aligned_cols=10  Identities=30%  Sum_probs=8.5

Q ss_pred             CCHHH
Q query             2 CD-EF    5 (12)
Q Consensus         2 cd-ef    5 (12)
                      ||.|
T Consensus         5 CDWE-    8 (30)
T 1ABC_A            5 CDWE-    8 (30)
T ss_dssp             CCHH-
T ss_pred             CCHH-
Confidence            5789

Q query             6 GHIKLM   11 (12)
T 1ABC_A            9 GH--LM   12 (30)


No 2
>7XYZ_AB other
Probab=10.00  E-value=1  Score=10.00  Aligned_cols=3  Identities=10%  Template_Neff=1.0

Q query             1 ACDE    4 (12)
T 7XYZ_AB           2 AC-E    4 (9)

Done!
"""


def test_parse_hhr_multi_block_with_gaps(tmp_path):
    hits = parse_hhr(_write(tmp_path, "hand.hhr", HAND_HHR))
    assert hits == [
        TemplateHit(index=0, name="1abc_A", pdb_id="1abc", chain_id="A", aligned_cols=10,
                    sum_probs=8.5, query="CD-EFGHIKLM", hit_sequence="CDWE-GH--LM",
                    indices_query=[1, 2, -1, 3, 4, 5, 6, 7, 8, 9, 10],
                    indices_hit=[4, 5, 6, 7, -1, 8, 9, -1, -1, 10, 11]),
        TemplateHit(index=1, name="7xyz_AB", pdb_id="7xyz", chain_id="AB", aligned_cols=3,
                    sum_probs=None, query="ACDE", hit_sequence="AC-E",
                    indices_query=[0, 1, 2, 3], indices_hit=[1, 2, -1, 3]),
    ]


@pytest.mark.parametrize(
    ("old", "new", "record", "expected"),
    [
        # Truncated hit block: the file ends after the query line.
        ("T 7XYZ_AB           2 AC-E    4 (9)\n\nDone!\n", "", "hit 2", "truncated"),
        ("Q query             6 GHIKLM   11 (12)\n", "", "hit 1",
         "query alignment has 5 columns but the template's has 11"),
        ("  2 7XYZ_AB other", "  3 9ZZZ_C more\n  2 7XYZ_AB other", "hit 3",
         "no alignment block"),
        ("No 2\n", "No 3\n", "hit 2", "'No 3'"),
        ("Q query             1 ACDE    4 (12)", "Q query             1 ACDE", "hit 2, line",
         "malformed alignment line"),
        ("T 7XYZ_AB           2 AC-E    4 (9)", "T 7XYZ_AB           2 AC-E    9 (9)",
         "hit 2, line", "3 residues between positions 2 and 9"),
        (">7XYZ_AB other\n", "", "hit 2", "no '>name' line"),
        ("Probab=10.00  E-value=1  Score=10.00  Aligned_cols=3", "Probab=10.00", "hit 2",
         "Aligned_cols"),
        (">7XYZ_AB other", ">XYZ other", "hit 2", "expected '<pdb id>_<chain>'"),
        ("  2 7XYZ_AB other", "  2 8XYZ_AB other", "hit 2", "summary table names 8XYZ_AB"),
    ],
)
def test_parse_hhr_bad_input(tmp_path, old, new, record, expected):
    assert old in HAND_HHR
    path = _write(tmp_path, "bad.hhr", HAND_HHR.replace(old, new))
    with pytest.raises(InputError, match=re.escape(expected)) as err:
        parse_hhr(path)
    assert err.value.record.startswith(record) and err.value.path == str(path)


def test_parse_hhr_empty_file(tmp_path):
    path = _write(tmp_path, "empty.hhr", "\n")
    with pytest.raises(InputError, match="empty file") as err:
        parse_hhr(path)
    assert err.value.path == str(path)


def test_split_hit_name():
    assert split_hit_name("1HF9_B") == ("1hf9", "B")
    assert split_hit_name("8ap6_G1") == ("8ap6", "G1")
    assert split_hit_name("query") is None and split_hit_name("1HF9") is None


# --- hmmsearch Stockholm ----------------------------------------------------------------------


def _reference_pairs(row: str, start: int) -> set[tuple[int, int]]:
    """AF2-style reading by case: upper = match state (query position), lower = insert."""
    pairs, q, t = set(), 0, start - 1
    for char in row:
        if char == ".":
            continue
        if char == "-":
            q += 1
        elif char.isupper():
            pairs.add((q, t))
            q, t = q + 1, t + 1
        else:
            t += 1
    return pairs


@needs_demo
@pytest.mark.parametrize("chain", sorted(HMMSEARCH_COUNTS))
def test_parse_hmmsearch_real_files(chain):
    folder = DEMO / "alignments" / chain
    query = parse_a3m(folder / "bfd_uniclust_hits.a3m").sequences[0]
    path = folder / "hmm_output.sto"
    hits = parse_hmmsearch_sto(path, query)
    assert len(hits) == HMMSEARCH_COUNTS[chain]
    assert [h.index for h in hits] == list(range(len(hits)))
    assert hits[0].name == chain and all(h.sum_probs is None for h in hits)
    rows = read_stockholm_alignment(path).rows
    for hit, (name, row) in zip(hits, rows.items()):
        assert name.split("/")[0] == hit.name
        _check_consistent(hit, query)
        start, end = map(int, name.split("/")[1].split("-"))
        real_hit = [i for i in hit.indices_hit if i >= 0]
        assert (real_hit[0], real_hit[-1]) == (start - 1, end - 1)
        both = {(q, t) for q, t in zip(hit.indices_query, hit.indices_hit) if q >= 0 and t >= 0}
        assert both == _reference_pairs(row, start)
        assert hit.aligned_cols == len(both)
        assert hit.hit_sequence[0] != "-" and hit.hit_sequence[-1] != "-"  # trimmed to the hit


@needs_demo
def test_hmmsearch_hits_match_template_seqres():
    folder = DEMO / "alignments" / "3u8v_A"
    query = parse_a3m(folder / "bfd_uniclust_hits.a3m").sequences[0]
    hits = parse_hmmsearch_sto(folder / "hmm_output.sto", query)
    # The chain itself aligns end to end onto its own SEQRES.
    assert hits[0].query == hits[0].hit_sequence == query == _seqres("3u8v", "A")
    assert hits[0].indices_query == hits[0].indices_hit == list(range(len(query)))
    checked = 0
    for hit in hits:
        seqres = _seqres(hit.pdb_id, hit.chain_id) if hit.pdb_id in {"3u8v", "4zey"} else None
        if seqres:
            got = "".join(seqres[i] for i in hit.indices_hit if i >= 0)
            assert got == hit.hit_sequence.replace("-", ""), hit.name
            checked += 1
    assert checked >= 2


HAND_STO = """\
# STOCKHOLM 1.0
#=GF ID query
#=GS 1abc_A/3-9 DE [subseq from] mol:protein length:20  Protein
#=GS 2xyz_B/1-3 DE [subseq from] mol:na length:10  DNA
#=GS 3def_C/5-8 DE [subseq from] mol:protein length:8  Other

query          AC..DEFG
1abc_A/3-9     ACkwD-FG
2xyz_B/1-3     --..ACG-
3def_C/5-8     -C.aDE--
#=GC RF        xx..xxxx
//
"""
HAND_HITS = [
    TemplateHit(index=0, name="1abc_A", pdb_id="1abc", chain_id="A", aligned_cols=5,
                sum_probs=None, query="AC--DEFG", hit_sequence="ACKWD-FG",
                indices_query=[0, 1, -1, -1, 2, 3, 4, 5], indices_hit=[2, 3, 4, 5, 6, -1, 7, 8]),
    # 2xyz_B (rank 1) is a nucleic acid: skipped.
    TemplateHit(index=2, name="3def_C", pdb_id="3def", chain_id="C", aligned_cols=3,
                sum_probs=None, query="C-DE", hit_sequence="CADE",
                indices_query=[1, -1, 2, 3], indices_hit=[4, 5, 6, 7]),
]


@pytest.mark.parametrize(
    "variant", ["query row + RF", "RF only", "query row only", "neither (letter case)"]
)
def test_parse_hmmsearch_hand_made(tmp_path, variant):
    """Match columns come from #=GC RF, else the query row, else the letter case; same hits."""
    text = HAND_STO
    if "query row" not in variant:
        text = text.replace("query          AC..DEFG\n", "")
    if "RF" not in variant:
        text = text.replace("#=GC RF        xx..xxxx\n", "")
    path = _write(tmp_path, "hits.sto", text)
    assert parse_hmmsearch_sto(path, "acdefg") == HAND_HITS


@pytest.mark.parametrize(
    ("old", "new", "record", "expected"),
    [
        ("#=GC RF        xx..xxxx", "#=GC RF        xx..xxx.", "#=GC RF",
         "5 match columns; expected 6"),
        ("1abc_A/3-9     ACkwD-FG", "1abc_A         ACkwD-FG", "hit 0 (1abc_A)",
         "'<pdb id>_<chain>/<start>-<end>'"),
        ("3def_C/5-8     -C.aDE--", "notpdb/5-8     -C.aDE--", "hit 2 (notpdb/5-8)",
         "'<pdb id>_<chain>/<start>-<end>'"),
        ("1abc_A/3-9     ACkwD-FG", "1abc_A/3-12    ACkwD-FG", "hit 0 (1abc_A/3-12)",
         "7 residues in the row; expected 10"),
        ("1abc_A/3-9     ACkwD-FG", "1abc_A/3-9     ACkw1-FG", "hit 0 (1abc_A/3-9)",
         "illegal character '1'"),
    ],
)
def test_parse_hmmsearch_bad_input(tmp_path, old, new, record, expected):
    assert old in HAND_STO
    path = _write(tmp_path, "bad.sto", HAND_STO.replace(old, new))
    with pytest.raises(InputError, match=re.escape(expected)) as err:
        parse_hmmsearch_sto(path, "ACDEFG")
    assert err.value.record == record and err.value.path == str(path)


def test_parse_hmmsearch_wrong_query_length(tmp_path):
    path = _write(tmp_path, "hits.sto", HAND_STO)
    with pytest.raises(InputError, match="6 match columns; expected 7"):
        parse_hmmsearch_sto(path, "ACDEFGH")
