"""FASTA / a3m / Stockholm parsing, merging, query checks and MSA features (real + hand-made)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fold_data.errors import InputError
from fold_data.msa import (
    Msa,
    check_query,
    make_msa_features,
    merge_msas,
    parse_a3m,
    parse_fasta,
    parse_stockholm,
    read_stockholm_alignment,
    species_id,
)

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "demo"
ALIGNMENTS = DEMO / "alignments"
SHORT_QUERY = "MAAHKGAEHHHKAAEHHEQAAKHHHAAAEHHEKGEHEQAAHHADTAYAHHKHAEEHAAQAAKHDAEHHAPKPH"

needs_demo = pytest.mark.skipif(not DEMO.is_dir(), reason="data/demo is absent")

# (file, expected number of rows): a3m records; Stockholm '#=GS' entries + the query row.
# Counts from /work/shared/data/README.md sections 1b and 1c.
A3M_COUNTS = {
    "monomer/bfd_uniclust_hits.a3m": 1024,
    "alignments/1psm_A/bfd_uniclust_hits.a3m": 12,
    "alignments/2q2k_A/bfd_uniclust_hits.a3m": 4,
    "alignments/3u8v_A/bfd_uniclust_hits.a3m": 734,
    "alignments/4zey_A/bfd_uniclust_hits.a3m": 401,
}
STO_COUNTS = {
    "monomer/uniref90_hits.sto": 57,
    "monomer/mgnify_hits.sto": 59,
    "alignments/1psm_A/uniref90_hits.sto": 19 + 1,
    "alignments/1psm_A/mgnify_hits.sto": 8 + 1,
    "alignments/2q2k_A/uniref90_hits.sto": 15 + 1,
    "alignments/2q2k_A/mgnify_hits.sto": 6 + 1,
    "alignments/3u8v_A/uniref90_hits.sto": 478 + 1,
    "alignments/3u8v_A/mgnify_hits.sto": 156 + 1,
    "alignments/4zey_A/uniref90_hits.sto": 456 + 1,
    "alignments/4zey_A/mgnify_hits.sto": 16 + 1,
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- independent references -------------------------------------------------------------------


def _reference_a3m_row(row: str) -> tuple[str, list[int]]:
    """Aligned row and deletions by regex: each aligned char with the insertion run before it."""
    row = row.replace(".", "")
    tokens = re.findall(r"([a-z]*)([A-Z\-])", row)
    return "".join(c for _, c in tokens), [len(ins) for ins, _ in tokens]


def _reference_stockholm(path: Path) -> tuple[list[str], np.ndarray]:
    """Single-block Stockholm by numpy masking: query columns kept, residues elsewhere counted."""
    rows = [line.split() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith(("#", "//"))]
    chars = np.array([list(seq) for _, seq in rows])  # [N_seq, N_col]
    residue = ~np.isin(chars, ["-", "."])
    query_cols = residue[0]
    # Residues in non-query columns, cumulated; deletions = increase between query columns.
    cum = np.cumsum(residue & ~query_cols, axis=1)[:, query_cols]  # [N_seq, N_res]
    deletions = np.diff(cum, axis=1, prepend=0)
    aligned = ["".join(r).upper().replace(".", "-") for r in chars[:, query_cols]]
    return aligned, deletions


# --- FASTA ------------------------------------------------------------------------------------


@needs_demo
def test_parse_fasta_file_and_text():
    assert parse_fasta(DEMO / "monomer" / "short.fasta") == [("query", SHORT_QUERY)]
    assert parse_fasta(str(DEMO / "monomer" / "short.fasta")) == [("query", SHORT_QUERY)]
    text = "#comment\n>a first one\nACD\nEF-g\n\n>b\n  KL. M\n"
    assert parse_fasta(text) == [("a first one", "ACDEF-g"), ("b", "KL.M")]


@pytest.mark.parametrize(
    ("text", "record", "expected"),
    [
        ("", None, "no sequences"),
        ("\n\n", None, "no sequences"),
        ("ACDE\n>a\nAC\n", "line 1", "before the first"),
        (">a\nACD\n>b desc\nAC*D\n", "record 1 (b), line 4", "'*'"),
        (">a\nAC1D\n", "record 0 (a), line 2", "'1'"),
    ],
)
def test_parse_fasta_bad_input(text, record, expected):
    with pytest.raises(InputError, match=re.escape(expected)) as err:
        parse_fasta(text)
    assert err.value.record == record


def test_parse_fasta_bad_file_names_the_file(tmp_path):
    path = _write(tmp_path, "bad.fasta", ">x\nAC!D\n")
    with pytest.raises(InputError, match="'!'") as err:
        parse_fasta(path)
    assert err.value.path == str(path) and "bad.fasta" in str(err.value)


# --- a3m --------------------------------------------------------------------------------------


def test_parse_a3m_insertions_into_deletion_matrix(tmp_path):
    path = _write(tmp_path, "x.a3m", ">query\nACDEF\n>s1 OX=9606\nAcc-DEFgg\n>s2\nA..CDkEF\n"
                                     ">s3\nqqqA-D-F\n")
    msa = parse_a3m(path)
    assert msa.sequences == ["ACDEF", "A-DEF", "ACDEF", "A-D-F"]
    assert msa.deletion_matrix == [[0] * 5, [0, 2, 0, 0, 0], [0, 0, 0, 1, 0], [3, 0, 0, 0, 0]]
    assert msa.descriptions == ["query", "s1 OX=9606", "s2", "s3"]
    assert msa.source == str(path)
    assert len(msa) == 4 and msa.num_res == 5
    assert msa.species == ["", "9606", "", ""]


@needs_demo
@pytest.mark.parametrize("name", sorted(A3M_COUNTS))
def test_parse_a3m_real_files_match_reference(name):
    path = DEMO / name
    msa = parse_a3m(path)
    assert len(msa) == A3M_COUNTS[name]
    records = parse_fasta(path)
    for (description, row), seq, dels, desc in zip(records, msa.sequences, msa.deletion_matrix,
                                                    msa.descriptions):
        ref_seq, ref_dels = _reference_a3m_row(row)
        assert (seq, dels, desc) == (ref_seq, ref_dels, description)
        assert len(seq) == msa.num_res  # every aligned row has the query's length
    # Deletions are the insertions, less the ones after the last aligned column.
    trailing = sum(len(re.search(r"[a-z]*$", row).group()) for _, row in records)
    lower = sum(sum(c.islower() for c in row) for _, row in records)
    assert sum(map(sum, msa.deletion_matrix)) == lower - trailing > 0
    assert "-" not in msa.sequences[0] and msa.deletion_matrix[0] == [0] * msa.num_res


@needs_demo
def test_monomer_a3m_query_is_the_fasta_sequence():
    msa = parse_a3m(DEMO / "monomer" / "bfd_uniclust_hits.a3m")
    check_query(msa, SHORT_QUERY)
    assert msa.sequences[0] == SHORT_QUERY
    # Real UniProt headers give mnemonic species codes.
    assert msa.species[1] == "9BRAD" and msa.species[0] == ""


def test_parse_a3m_bad_input(tmp_path):
    empty = _write(tmp_path, "empty.a3m", "")
    with pytest.raises(InputError, match="no sequences") as err:
        parse_a3m(empty)
    assert err.value.path == str(empty)

    wrong = _write(tmp_path, "wrong.a3m", ">query\nACDEF\n>ok\nAC-EF\n>short_one desc\nACkE\n")
    with pytest.raises(InputError, match=r"aligned length 3 .* expected 5") as err:
        parse_a3m(wrong)
    assert err.value.record == "record 2 (short_one)" and "wrong.a3m" in str(err.value)

    illegal = _write(tmp_path, "illegal.a3m", ">query\nACDEF\n>bad\nAC*EF\n")
    with pytest.raises(InputError, match=r"'\*'") as err:
        parse_a3m(illegal)
    assert "record 1 (bad)" in err.value.record

    no_query = _write(tmp_path, "noquery.a3m", ">query\nacdef\n>x\nACDEF\n")
    with pytest.raises(InputError, match="query has no aligned residues"):
        parse_a3m(no_query)


# --- Stockholm --------------------------------------------------------------------------------


@needs_demo
@pytest.mark.parametrize("name", sorted(STO_COUNTS))
def test_parse_stockholm_real_files_match_reference(name):
    path = DEMO / name
    msa = parse_stockholm(path)
    assert len(msa) == STO_COUNTS[name]
    ref_sequences, ref_deletions = _reference_stockholm(path)
    assert msa.sequences == ref_sequences
    np.testing.assert_array_equal(np.array(msa.deletion_matrix), ref_deletions)
    assert all(len(s) == msa.num_res for s in msa.sequences)
    assert "-" not in msa.sequences[0]


@needs_demo
@pytest.mark.parametrize("chain", ["1psm_A", "2q2k_A", "3u8v_A", "4zey_A"])
def test_stockholm_and_a3m_queries_agree(chain):
    """The jackhmmer and HHblits alignments of one chain have the same query (row 0)."""
    a3m = parse_a3m(ALIGNMENTS / chain / "bfd_uniclust_hits.a3m")
    for name in ("uniref90_hits.sto", "mgnify_hits.sto"):
        sto = parse_stockholm(ALIGNMENTS / chain / name)
        check_query(sto, a3m.sequences[0])
        assert sto.num_res == a3m.num_res


@needs_demo
def test_parse_stockholm_descriptions_and_max_sequences():
    path = ALIGNMENTS / "4zey_A" / "uniref90_hits.sto"
    msa = parse_stockholm(path)
    assert msa.descriptions[0] == "query"
    assert msa.descriptions[1].startswith("UniRef90_A0A2K5JW76/4-86 [subseq from] Nuclear")
    assert "TaxID=336983" in msa.descriptions[1]
    top = parse_stockholm(path, max_sequences=10)
    assert len(top) == 10
    assert top == msa.truncate(10)
    assert len(msa.truncate(0)) == 0


@needs_demo
def test_parse_stockholm_interleaved_blocks(tmp_path):
    """Re-blocking a real file into interleaved 37-column blocks (#=GR/#=GC too) changes nothing."""
    source = DEMO / "monomer" / "uniref90_hits.sto"
    single = read_stockholm_alignment(source)
    width = single.num_columns
    lines = ["# STOCKHOLM 1.0", *(f"#=GF {k} {v}" for k, v in single.gf.items()), ""]
    lines += [f"#=GS {name} DE {feats['DE']}" for name, feats in single.gs.items()]
    for lo in range(0, width, 37):
        lines.append("")
        for name, row in single.rows.items():
            lines.append(f"{name} {row[lo:lo + 37]}")
            for feat, ann in single.gr.get(name, {}).items():
                lines.append(f"#=GR {name} {feat} {ann[lo:lo + 37]}")
        for feat, ann in single.gc.items():
            lines.append(f"#=GC {feat} {ann[lo:lo + 37]}")
    lines.append("//")
    blocked = _write(tmp_path, "blocked.sto", "\n".join(lines) + "\n")
    assert width > 37 * 2 and single.gr and "RF" in single.gc
    again = read_stockholm_alignment(blocked)
    assert (again.rows, again.gr, again.gc, again.gf) == (single.rows, single.gr, single.gc,
                                                          single.gf)
    assert single.gf["AU"] == "jackhmmer (HMMER 3.3.2)"
    original, reblocked = parse_stockholm(source), parse_stockholm(blocked)
    assert reblocked.sequences == original.sequences
    assert reblocked.deletion_matrix == original.deletion_matrix
    assert reblocked.descriptions == original.descriptions


def test_parse_stockholm_hand_made(tmp_path):
    text = ("# STOCKHOLM 1.0\n"
            "#=GS hit1/2-6 DE some protein OX=9606\n"
            "#=GS Q9XYZ_HUMAN/1-100 DE other\n\n"
            "query          AC--DE.F\n"
            "hit1/2-6       A-kkDe.F\n"
            "Q9XYZ_HUMAN/1-100  -Cr-..wF\n"
            "#=GR hit1/2-6 PP 9.99999.\n"
            "#=GC RF        xx..xx.x\n"
            "//\n")
    msa = parse_stockholm(_write(tmp_path, "hand.sto", text))
    assert msa.sequences == ["ACDEF", "A-DEF", "-C--F"]
    assert msa.deletion_matrix == [[0] * 5, [0, 0, 2, 0, 0], [0, 0, 1, 0, 1]]
    assert msa.descriptions == ["query", "hit1/2-6 some protein OX=9606", "Q9XYZ_HUMAN/1-100 other"]
    assert msa.species == ["", "9606", "HUMAN"]


@pytest.mark.parametrize(
    ("text", "record", "expected"),
    [
        ("", None, "empty file"),
        ("query ACD\n//\n", "line 1", "STOCKHOLM"),
        ("# STOCKHOLM 1.0\n//\n", None, "no sequences"),
        ("# STOCKHOLM 1.0\nq ACDE\nhit/1-3 AC-\n//\n", "record 1 (hit/1-3)", "aligned length 3"),
        ("# STOCKHOLM 1.0\nq ACDE\nhit AC D E\n//\n", "line 3", "malformed sequence line"),
        ("# STOCKHOLM 1.0\nq ACDE\n#=GC RF xx\n//\n", "#=GC RF", "annotation length 2"),
        ("# STOCKHOLM 1.0\nq ACDE\nh AC1E\n//\n", "record 1 (h)", "'1'"),
        ("# STOCKHOLM 1.0\nq --..\nh AC-E\n//\n", "record 0 (q)", "no residues"),
    ],
)
def test_parse_stockholm_bad_input(tmp_path, text, record, expected):
    path = _write(tmp_path, "bad.sto", text)
    with pytest.raises(InputError, match=re.escape(expected)) as err:
        parse_stockholm(path)
    assert err.value.record == record and err.value.path == str(path)


# --- species ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "species"),
    [
        ("tr|A0A2A6NXF8|A0A2A6NXF8_9BRAD Uncharacterized OS=Bradyrhizobium OX=142585", "9BRAD"),
        ("sp|P69905|HBA_HUMAN Hemoglobin subunit alpha", "HUMAN"),
        ("tr|A0A146SKV9|A0A146SKV9_FUNHE/123-456", "FUNHE"),
        ("Q9XYZ_HUMAN/1-100", "HUMAN"),
        ("UniRef100_A0A0B4J2F0 protein OS=Homo sapiens OX=9606", "9606"),
        ("UniRef90_Q96F24/4-86 [subseq from] n=58 Tax=Simiiformes TaxID=314293", ""),
        ("MGYP000406148242/1-68 [subseq from] PL=00 UP=0", ""),
        ("query", ""),
        ("", ""),
    ],
)
def test_species_id(description, species):
    assert species_id(description) == species


# --- merging and query checks -----------------------------------------------------------------


def _msa(rows: list[str], dels: list[list[int]] | None = None, source: str = "m") -> Msa:
    dels = dels or [[i % 3 for i in range(len(r))] for r in rows]
    return Msa(rows, dels, [f"{source}{i}" for i in range(len(rows))], source)


def test_merge_msas_deduplicates_keeping_first():
    a = _msa(["ACDE", "A-DE", "AC-E"], [[0] * 4, [0, 1, 0, 0], [0] * 4], "a.a3m")
    b = _msa(["ACDE", "AC-E", "GGGG"], [[0] * 4, [5, 5, 5, 5], [0, 2, 0, 0]], "b.sto")
    merged = merge_msas([a, b])
    assert merged.sequences == ["ACDE", "A-DE", "AC-E", "GGGG"]
    assert merged.deletion_matrix == [[0] * 4, [0, 1, 0, 0], [0] * 4, [0, 2, 0, 0]]
    assert merged.descriptions == ["a.a3m0", "a.a3m1", "a.a3m2", "b.sto2"]
    assert merged.source == "a.a3m; b.sto"
    with pytest.raises(InputError, match="3 columns; expected 4") as err:
        merge_msas([a, _msa(["ACD"], source="c.a3m")])
    assert err.value.path == "c.a3m" and err.value.record == "query"


@needs_demo
def test_merge_real_msas():
    chain = ALIGNMENTS / "4zey_A"
    parts = [parse_stockholm(chain / "uniref90_hits.sto"),
             parse_a3m(chain / "bfd_uniclust_hits.a3m"),
             parse_stockholm(chain / "mgnify_hits.sto")]
    merged = merge_msas(parts)
    unique = list(dict.fromkeys(s for m in parts for s in m.sequences))
    assert merged.sequences == unique
    assert merged.sequences.count(parts[0].sequences[0]) == 1
    assert len(set(merged.sequences)) == len(merged) < sum(map(len, parts))
    # Each kept row carries the deletions of its first occurrence.
    first = {}
    for m in parts:
        for s, d in zip(m.sequences, m.deletion_matrix):
            first.setdefault(s, d)
    assert all(first[s] == d for s, d in zip(merged.sequences, merged.deletion_matrix))


def test_check_query():
    msa = _msa(["AC-DEF", "ACGDEF"], source="x.a3m")
    check_query(msa, "ACDEF")
    check_query(msa, "aXDEX")  # X in the chain matches anything; case is ignored
    with pytest.raises(InputError, match=r"residue 3 .* 'D'; expected 'W'") as err:
        check_query(msa, "ACWEF")
    assert (err.value.path, err.value.record) == ("x.a3m", "query")
    with pytest.raises(InputError, match="5 residues; expected 6") as err:
        check_query(msa, "ACDEFG", path="chain.cif")
    assert err.value.path == "chain.cif"
    with pytest.raises(InputError, match="empty MSA"):
        check_query(_msa([]), "ACDEF")


@needs_demo
def test_check_query_against_mmcif_sequence():
    """4zey's alignment query is its SEQRES with MSE read as M (data README, section 1b)."""
    gemmi = pytest.importorskip("gemmi")
    block = gemmi.cif.read(str(DEMO / "mmcifs" / "4zey.cif")).sole_block()
    names = [n for e, n in zip(block.find_values("_entity_poly_seq.entity_id"),
                               block.find_values("_entity_poly_seq.mon_id")) if e == "1"]
    seqres = "".join(gemmi.find_tabulated_residue(n).one_letter_code.upper() for n in names)
    assert "MSE" in names
    msa = parse_a3m(ALIGNMENTS / "4zey_A" / "bfd_uniclust_hits.a3m")
    check_query(msa, seqres)
    with pytest.raises(InputError, match="query"):
        check_query(msa, seqres[1:] + "A")


# --- features ---------------------------------------------------------------------------------


def test_make_msa_features_codes():
    rows = ["ARNDCQEGHILKMFPSTWYVXBZUOJ-", "-" * 27]
    dels = [[i for i in range(27)], [0] * 27]
    features = make_msa_features(Msa(rows, dels, ["tr|P1|X_HUMAN", "OX=10090"], "f.a3m"))
    # B->D, Z->E, U->C (HHblits alphabet); O, J and X -> 20 unknown; '-' -> 21.
    expected = list(range(20)) + [20, 3, 6, 4, 20, 20, 21]
    np.testing.assert_array_equal(features["msa"], [expected, [21] * 27])
    assert features["msa"].dtype == np.int32
    assert features["deletion_matrix"].dtype == np.float32
    np.testing.assert_array_equal(features["deletion_matrix"], np.array(dels, dtype=np.float32))
    assert features["msa_species"].dtype.kind == "S"
    assert features["msa_species"].tolist() == [b"HUMAN", b"10090"]


@needs_demo
def test_make_msa_features_real():
    msa = parse_a3m(DEMO / "monomer" / "bfd_uniclust_hits.a3m")
    features = make_msa_features(msa)
    n, l = len(msa), len(SHORT_QUERY)
    assert features["msa"].shape == (n, l) and features["deletion_matrix"].shape == (n, l)
    assert features["msa_species"].shape == (n,)
    restypes = "ARNDCQEGHILKMFPSTWYVX-"
    decoded = ["".join(restypes[c] for c in row) for row in features["msa"]]
    # No ambiguity codes in this file, so decoding gives back the aligned rows.
    assert decoded == msa.sequences
    np.testing.assert_array_equal(features["deletion_matrix"], np.array(msa.deletion_matrix))
    assert features["msa"].min() >= 0 and features["msa"].max() == 21


def test_make_msa_features_bad_input():
    with pytest.raises(InputError, match=r"'\*' at column 3") as err:
        make_msa_features(Msa(["ACDE", "AC*E"], [[0] * 4] * 2, ["q", "bad row"], "h.a3m"))
    assert err.value.record == "record 1 (bad)" and err.value.path == "h.a3m"
    with pytest.raises(InputError, match="'é'"):
        make_msa_features(Msa(["ACDE", "ACéE"], [[0] * 4] * 2, ["q", "x"], "h.a3m"))
    with pytest.raises(InputError, match="empty MSA"):
        make_msa_features(Msa([], [], [], "e.a3m"))


def test_msa_rejects_inconsistent_rows():
    with pytest.raises(InputError, match=r"expected 4 \(the query's length\)") as err:
        Msa(["ACDE", "ACD"], [[0] * 4, [0] * 3], ["q", "r"], "m.sto")
    assert err.value.record == "record 1 (r)"
    with pytest.raises(InputError, match="deletion counts"):
        Msa(["ACDE", "ACDF"], [[0] * 4, [0] * 3], ["q", "r"], "m.sto")
    with pytest.raises(InputError, match="2 sequences but 1 deletion rows"):
        Msa(["ACDE", "ACDF"], [[0] * 4], ["q", "r"], "m.sto")
