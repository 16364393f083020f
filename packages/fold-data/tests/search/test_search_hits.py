"""A3M rows from HMMER domain alignments, deduplication and caps."""

from __future__ import annotations

import pytest
from fold_data.search.hits import A3mRow, dedup_and_cap, domain_row, to_a3m


def test_domain_row_places_matches_insertions_and_deletions():
    # query of 9 residues; the domain covers model states 2..8; the target has an insertion
    # ('.' in the model line) after state 4 and skips state 6 ('-' in the target)
    row = domain_row(2, 8, "abc.defg", "ABCxD-FG", 9)
    assert row == "-ABCxD-FG-"
    assert "".join(c for c in row if not c.islower()) == "-ABCD-FG-"


def test_domain_row_rejects_a_wrong_length():
    with pytest.raises(ValueError, match="expected 8"):
        domain_row(1, 8, "abcdefg", "ABCDEFG", 8)


def _row(name, row, evalue=1e-5):
    return A3mRow(name, "", row, evalue)


def test_cap_then_dedup_in_hmmer_order():
    query = "ACDE"
    rows = [_row("a", "ACDE"), _row("b", "AC-E"), _row("c", "ACkD-"), _row("d", "AC-E"),
            _row("e", "GGGG")]
    kept = dedup_and_cap(rows, 4, query=query)
    # the cap takes the first 4 (a-d); 'a' is the query itself and 'd' repeats 'b'; 'c' has
    # an insertion (aligned string 'ACD-')
    assert [r.name for r in kept] == ["b", "c"]
    seen = {r.aligned for r in kept}
    assert dedup_and_cap([_row("f", "AC-E"), _row("g", "-CDE")], None, query=query,
                         seen=seen)[0].name == "g"


def test_to_a3m_writes_query_first():
    text = to_a3m("query", "ACDE", [A3mRow("x/1-4", "OX=9606", "AC-E", 1e-3)])
    assert text == ">query\nACDE\n>x/1-4 OX=9606\nAC-E\n"
