"""An mmCIF cut at a line boundary inside ``_atom_site`` (a real file, cut here) parses, but with
a :class:`TruncatedMmcifWarning` naming the file, the chain, where it stops and what is lost;
the complete bundled files give no such warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from fold_data.mmcif import parse_mmcif
from fold_data.mmcif_truncation import TruncatedMmcifWarning

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
pytestmark = pytest.mark.skipif(not DEMO.is_dir(), reason="bundled demo data not found")


def _cut_after(src: Path, dst: Path, atom_id: int) -> Path:
    """``src`` cut at the end of the line of ``_atom_site.id`` ``atom_id`` (a line boundary)."""
    lines = src.read_text().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines)
               if ln.split()[:2] in (["ATOM", str(atom_id)], ["HETATM", str(atom_id)]))
    dst.write_text("".join(lines[:end + 1]))
    return dst


def test_cut_mid_residue_warns_with_chain_residue_and_lost_residues(tmp_path):
    cut = _cut_after(DEMO / "mmcifs" / "4zey.cif", tmp_path / "4zey.cif", 307)  # GLU 41: N CA C
    with pytest.warns(TruncatedMmcifWarning) as record:
        structure = parse_mmcif(cut)
    assert len(record) == 1
    message = str(record[0].message)
    assert message.startswith(f"{cut}: chain A (label A) ends abruptly at residue GLU 41: ")
    assert "lacks heavy atoms O, CB, CG, CD, OE1, OE2" in message
    assert "43 residues of its _entity_poly_seq (42..84) come after the last atom row" in message
    chain = structure.get_chain("A")  # what is there is still read, the rest unmodelled
    assert chain.num_res == 84 and chain.modelled[40] and not chain.modelled[41:].any()


def test_cut_between_chains_names_the_chains_without_atoms(tmp_path):
    cut = _cut_after(DEMO / "mmcifs" / "3u8v.cif", tmp_path / "3u8v.cif", 200)
    with pytest.warns(TruncatedMmcifWarning, match=r"chain A \(label A\) ends abruptly at "
                                                   r"residue \w+ \d+: .*polymer chains "
                                                   r"\(label\) B have no atoms"):
        structure = parse_mmcif(cut)
    assert sorted(structure.chains) == ["A"]


def test_cut_at_a_residue_boundary_still_warns(tmp_path):
    cut = _cut_after(DEMO / "mmcifs" / "4zey.cif", tmp_path / "4zey.cif", 304)  # SER 40 whole
    with pytest.warns(TruncatedMmcifWarning) as record:
        parse_mmcif(cut)
    message = str(record[0].message)
    assert "at residue SER 40: 44 residues of its _entity_poly_seq (41..84)" in message
    assert "lacks heavy atoms" not in message


def test_af3_complex_reader_warns_too(tmp_path):
    from fold_data.af3 import Ccd
    from fold_data.af3.parse import parse_complex_mmcif

    cut = _cut_after(DEMO / "af3" / "mmcifs" / "3o5r.cif", tmp_path / "3o5r.cif", 100)
    with pytest.warns(TruncatedMmcifWarning, match=rf"^{cut}: chain A \(label A\) ends abruptly"):
        parse_complex_mmcif(cut, ccd=Ccd([DEMO / "af3" / "ccd.cif"], use_biotite=False))


@pytest.mark.parametrize("path", sorted((DEMO / "mmcifs").glob("*.cif")), ids=lambda p: p.name)
def test_complete_files_do_not_warn(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedMmcifWarning)
        parse_mmcif(path)


def test_a_file_closed_after_atom_site_does_not_warn(tmp_path):
    """Cut right after the loop's closing '#': the coordinates are whole."""
    lines = (DEMO / "mmcifs" / "4zey.cif").read_text().splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("_atom_site.group_PDB"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("#"))
    whole = tmp_path / "4zey.cif"
    whole.write_text("".join(lines[:end + 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedMmcifWarning)
        parse_mmcif(whole)
