"""The reader table (fold_data.readers): one suffix -> reader choice for every input kind."""

from __future__ import annotations

import pytest
from fold_data.errors import InputError
from fold_data.msa import load_msa, parse_a3m, parse_stockholm
from fold_data.readers import (
    MMCIF_SUFFIXES,
    file_suffix,
    kinds_of,
    reader,
    suffixes,
)
from fold_data.templates import load_template_hits


@pytest.mark.parametrize("name, suffix", [
    ("4zey.cif", ".cif"), ("4ZEY.CIF.GZ", ".cif.gz"), ("hits.v2.a3m", ".a3m"),
    ("uniref90_hits.sto", ".sto"), ("README", ""),
])
def test_file_suffix(name, suffix):
    assert file_suffix(name) == suffix


def test_kinds_by_suffix():
    assert kinds_of("x.a3m") == ("msa",)
    assert kinds_of("x.hhr") == ("template_hits",)
    assert kinds_of("x.sto") == ("msa", "template_hits")
    assert kinds_of("x.json") == ("af3_entry",)
    assert set(MMCIF_SUFFIXES) <= set(suffixes("af3_entry"))


def test_msa_readers_are_the_parsers(tmp_path):
    a3m = tmp_path / "q.A3M"
    a3m.write_text(">q\nMKV\n>h\nMKaV\n")
    assert reader(a3m, "msa")(a3m).sequences == parse_a3m(a3m).sequences
    sto = tmp_path / "q.sto"
    sto.write_text("# STOCKHOLM 1.0\nq MKV\nh MKV\n//\n")
    assert reader(sto, "msa")(sto).sequences == parse_stockholm(sto).sequences


@pytest.mark.parametrize("kind, words", [
    ("msa", "unknown MSA format '.txt'; expected .a3m or .sto"),
    ("template_hits", "unknown template hits format '.txt'; expected .hhr or .sto"),
    ("af3_entry", "unknown input format '.txt'; expected .json (AlphaFold3 input), .cif"),
])
def test_unknown_suffix_names_the_file(kind, words):
    with pytest.raises(InputError) as err:
        reader("dir/hits.txt", kind)
    assert err.value.path == "dir/hits.txt" and words in err.value.reason


def test_loaders_read_by_suffix(tmp_path):
    a3m = tmp_path / "q.a3m"
    a3m.write_text(">q\nMKV\n>h\nMRV\n")
    assert load_msa("MKV", [a3m])["msa"].shape == (2, 3)
    with pytest.raises(InputError, match="unknown MSA format '.fasta'"):
        load_msa("MKV", [tmp_path / "q.fasta"])
    assert load_template_hits("MKV", None) == []
    with pytest.raises(InputError, match="unknown template hits format '.a3m'"):
        load_template_hits("MKV", a3m)
