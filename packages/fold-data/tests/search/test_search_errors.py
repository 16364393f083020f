"""Clear errors: missing / malformed databases, empty queries, bad configs."""

from __future__ import annotations

import gzip

import pytest
from _search_helpers import MMCIFS, UNIREF, write_config
from fold_data.errors import InputError
from fold_data.search import SearchChain, load_config, run_search


def _run(tmp_path, db, query="MKVLAAGIVALLLAAGCSSSKEETK"):
    config = load_config(write_config(tmp_path, databases={"uniref90": db}))
    return run_search([SearchChain("A", "protein", query)], config, tmp_path / "out", cpus=1)


def test_missing_database_names_the_file(tmp_path):
    missing = tmp_path / "nope.fasta.gz"
    with pytest.raises(InputError, match="sequence database not found") as err:
        _run(tmp_path, missing)
    assert err.value.path == str(missing)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_database_that_is_not_fasta(tmp_path):
    with pytest.raises(InputError, match="text before the first '>' header") as err:
        _run(tmp_path, MMCIFS / "4zey.cif")
    assert err.value.record == "line 1"


def test_binary_database(tmp_path):
    db = tmp_path / "db.fasta"
    db.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match="not UTF-8|text before"):
        _run(tmp_path, db)


def test_truncated_gzip_database(tmp_path):
    db = tmp_path / "db.fasta.gz"
    db.write_bytes(gzip.compress(UNIREF.read_bytes())[:200])
    with pytest.raises(InputError, match="unreadable"):
        _run(tmp_path, db)


def test_bad_letter_names_the_record(tmp_path):
    db = tmp_path / "db.fasta"
    db.write_text(">sp|P1|A_HUMAN ok\nMKV\n>sp|P2|B_HUMAN bad\nMK1V\n")
    with pytest.raises(InputError, match="letter '1'") as err:
        _run(tmp_path, db)
    assert err.value.record == "record 1 (sp|P2|B_HUMAN)"


def test_empty_database(tmp_path):
    db = tmp_path / "db.fasta"
    db.write_text("\n")
    with pytest.raises(InputError, match="no sequences"):
        _run(tmp_path, db)


def test_empty_query(tmp_path):
    with pytest.raises(InputError, match="empty query sequence") as err:
        _run(tmp_path, UNIREF, query="")
    assert err.value.record == "chain A"


def test_query_with_letters_outside_the_alphabet(tmp_path):
    with pytest.raises(InputError, match=r"letters \['1'\]"):
        _run(tmp_path, UNIREF, query="MKV1")


@pytest.mark.parametrize("text, match", [
    ('preset = "af9"\n[databases.uniref90]\npath = "x"\n', "expected one of af2, af3"),
    ('[databases.uniref90]\npath = "x"\nmax_hit = 3\n', "unknown key 'max_hit'"),
    ('[databases.mine]\npath = "x"\n', "not a database of preset 'af3'"),
    ('[databases.mine]\npath = "x"\nmolecule = "lipid"\nmax_hits = 3\n', "molecule 'lipid'"),
    ('preset = "af3"\n', "at least one"),
    ('[databases.uniref90\n', "not a readable TOML"),
    ('[databases.uniref90]\npath = "x"\n[templates]\nseqres = "s"\nmax_template_date = "2021"\n',
     "expected YYYY-MM-DD"),
])
def test_config_errors(tmp_path, text, match):
    path = tmp_path / "search.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=match) as err:
        load_config(path)
    assert err.value.path == str(path)
