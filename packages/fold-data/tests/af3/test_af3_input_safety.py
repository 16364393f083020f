"""A hostile AF3 input JSON cannot make fold read files outside its directory, nor show the
content of a file that is not the expected format; pairedMsaPath is read; self-bonds, non-ASCII
chain IDs, out-of-range seeds and deeply nested JSON are clear errors naming file and field."""

from __future__ import annotations

import json
import os

import pytest
from fold_data.af3 import Ccd
from fold_data.af3.msa import chain_msa
from fold_data.af3.parse import parse_af3_json
from fold_data.errors import InputError

SECRET = "root:x:0:0:do-not-show-me"
QUERY = "MKCLV"


@pytest.fixture
def ccd():
    return Ccd([], use_biotite=False)  # protein letters need no CCD lookup


def _job(tmp_path, **protein) -> os.PathLike:
    doc = {"name": "t", "modelSeeds": [1], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": QUERY, **protein}}]}
    path = tmp_path / "job" / "job.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _outside(tmp_path) -> os.PathLike:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    return secret


@pytest.mark.parametrize("field", ["unpairedMsaPath", "pairedMsaPath"])
@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_msa_paths_outside_the_json_directory_are_refused(tmp_path, ccd, field, how):
    secret = _outside(tmp_path)
    if how == "symlink":  # a link inside the directory that points out of it
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "link.a3m").symlink_to(secret)
    name = {"absolute": str(secret), "dotdot": "../secret.txt", "symlink": "link.a3m"}[how]
    path = _job(tmp_path, **{field: name})
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert err.value.path == str(path) and err.value.record == "sequences[0] protein A"
    assert f"field {field!r}" in err.value.reason
    assert "outside the JSON's directory" in err.value.reason
    assert SECRET not in str(err.value)


def test_user_ccd_path_outside_is_refused_and_allowed_by_the_flag(tmp_path, ccd):
    _outside(tmp_path)
    path = _job(tmp_path)
    doc = json.loads(path.read_text())
    doc["userCCDPath"] = "../secret.txt"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert err.value.record == "job" and "field 'userCCDPath'" in err.value.reason
    # allowed: the file is read, and its parse error does not show its content either
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd, allow_outside_paths=True)
    assert "not a readable CCD mmCIF" in str(err.value) and SECRET not in str(err.value)


def test_template_path_outside_is_refused(tmp_path, ccd):
    secret = _outside(tmp_path)
    path = _job(tmp_path, templates=[{"mmcifPath": str(secret), "queryIndices": [0],
                                      "templateIndices": [0]}])
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert "field 'templates[0].mmcifPath'" in err.value.reason


def test_msa_file_of_another_format_is_not_echoed(tmp_path, ccd):
    secret = _outside(tmp_path)
    path = _job(tmp_path, unpairedMsaPath=str(secret))
    entry = parse_af3_json(path, ccd=ccd, allow_outside_paths=True)
    with pytest.raises(InputError) as err:
        chain_msa(entry.chains[0], source=str(path))
    assert "'>' header" in str(err.value) and SECRET not in str(err.value)


def test_paired_msa_path_is_read(tmp_path, ccd):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "paired.a3m").write_text(f">query\n{QUERY}\n>p1\nMKCLA\n")
    (tmp_path / "job" / "unpaired.a3m").write_text(f">query\n{QUERY}\n>u1\nAKCLV\n")
    path = _job(tmp_path, pairedMsaPath="paired.a3m", unpairedMsaPath="unpaired.a3m")
    chain = parse_af3_json(path, ccd=ccd).chains[0]
    assert "MKCLA" in chain.unpaired_msa and "AKCLV" in chain.unpaired_msa
    msa, _ = chain_msa(chain, source=str(path))
    assert msa.shape[0] >= 3  # query + the unpaired row + the paired row
    both = _job(tmp_path, pairedMsaPath="paired.a3m", pairedMsa=">q\nMKCLV\n")
    with pytest.raises(InputError, match="'pairedMsa' and 'pairedMsaPath' are exclusive"):
        parse_af3_json(both, ccd=ccd)


def _with(tmp_path, **top) -> os.PathLike:
    path = _job(tmp_path)
    doc = json.loads(path.read_text())
    doc.update(top)
    path.write_text(json.dumps(doc))
    return path


def test_bond_from_an_atom_to_itself_is_refused(tmp_path, ccd):
    path = _with(tmp_path, bondedAtomPairs=[[["A", 3, "SG"], ["A", 3, "SG"]]])
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert err.value.path == str(path) and err.value.record == "bondedAtomPairs[0]"
    assert "to itself" in err.value.reason


@pytest.mark.parametrize("seeds", [[-1], [2**32], [2**70]])
def test_seeds_out_of_range_are_refused(tmp_path, ccd, seeds):
    with pytest.raises(InputError) as err:
        parse_af3_json(_with(tmp_path, modelSeeds=seeds), ccd=ccd)
    assert err.value.record == "job" and "field 'modelSeeds'" in err.value.reason


def test_non_ascii_chain_id_is_refused(tmp_path, ccd):
    path = _job(tmp_path)
    doc = json.loads(path.read_text())
    doc["sequences"][0]["protein"]["id"] = "\u00c9"  # upper-case, alphabetic, not A-Z
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert "field 'id'" in err.value.reason and "A-Z" in err.value.reason


def test_deeply_nested_json_is_an_input_error(tmp_path, ccd):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError) as err:
        parse_af3_json(path, ccd=ccd)
    assert err.value.path == str(path) and "nested too deeply" in err.value.reason
