"""Inputs that used to pass as silent garbage are errors naming the file and the record: a
Stockholm file cut before its closing '//', B/J/O/U/Z in an AF2 query; and a file of another
format is reported without showing its content."""

from __future__ import annotations

import pytest
from fold_data.af2 import make_features_from_sequence
from fold_data.errors import InputError
from fold_data.msa import parse_a3m, read_stockholm_alignment

SECRET = "root:x:0:0:do-not-show-me"
STO = "# STOCKHOLM 1.0\n\nquery MKCLV\nhit1  MKC-V\n"


def test_stockholm_without_closing_slashes_is_refused(tmp_path):
    cut = tmp_path / "cut.sto"
    cut.write_text(STO)
    with pytest.raises(InputError) as err:
        read_stockholm_alignment(cut)
    assert err.value.path == str(cut) and "does not end with '//'" in err.value.reason
    whole = tmp_path / "whole.sto"
    whole.write_text(STO + "//\n")
    assert list(read_stockholm_alignment(whole).rows) == ["query", "hit1"]


@pytest.mark.parametrize("reader, suffix", [(parse_a3m, ".a3m"),
                                            (read_stockholm_alignment, ".sto")])
def test_file_of_another_format_is_not_echoed(tmp_path, reader, suffix):
    path = tmp_path / f"not_an_alignment{suffix}"
    path.write_text(SECRET + "\n")
    with pytest.raises(InputError) as err:
        reader(path)
    assert err.value.path == str(path) and err.value.record == "line 1"
    assert SECRET not in str(err.value) and "do-not-show-me" not in str(err.value)


def test_stockholm_malformed_line_is_not_echoed(tmp_path):
    path = tmp_path / "odd.sto"
    path.write_text(f"# STOCKHOLM 1.0\n{SECRET} a b\n//\n")
    with pytest.raises(InputError) as err:
        read_stockholm_alignment(path)
    assert err.value.record == "line 2" and SECRET not in str(err.value)


@pytest.mark.parametrize("letter", list("BJOUZ"))
def test_ambiguous_letters_in_an_af2_query_are_refused(letter):
    with pytest.raises(InputError) as err:
        make_features_from_sequence(f"MKC{letter}LV")
    assert err.value.record == "query sequence" and repr(letter) in err.value.reason


def test_x_stays_an_unknown_residue():
    raw = make_features_from_sequence("MKXLV")
    assert int(raw["seq_length"]) == 5


def test_empty_mmcif_is_an_input_error(tmp_path):
    from fold_data.af3 import Ccd
    from fold_data.af3.parse import parse_complex_mmcif
    from fold_data.mmcif import parse_mmcif

    empty = tmp_path / "empty.cif"
    empty.write_text("")
    for parse in (parse_mmcif, lambda p: parse_complex_mmcif(p, ccd=Ccd([], use_biotite=False))):
        with pytest.raises(InputError) as err:  # was gemmi's IndexError vector::_M_range_check
            parse(empty)
        assert err.value.path == str(empty) and "empty file" in err.value.reason
