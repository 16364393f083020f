"""AF3's per-chain training filters (supplement 2.5.4, :mod:`fold_data.af3.filters`) on the
bundled real mmCIFs, each edited minimally (rows of ``_atom_site`` dropped, moved or renamed,
``_exptl.method`` changed, a copy of a ligand added) so that exactly one filter has to act.

4ZEY: NRBF2 (X-ray) with two SO4; 4I6P: a homodimer; 3O5R: FKBP51 + FK506; 3U8V: a homodimer
with a Ni ion; 2Q2K: protein-DNA with EPE; 1PSM: NMR.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gemmi
import numpy as np
import pytest
from fold_data.af3 import ChainFilters, af3_cache, fetch_af3_features, filter_chains, load_entry
from fold_data.af3.filters import ATOM_FILTERS, CHAIN_FILTERS
from fold_data.af3.parse import Bond
from fold_data.errors import InputError

DEMO = Path(__file__).resolve().parents[4] / "data" / "demo"
MMCIFS = DEMO / "mmcifs"
FKBP = DEMO / "af3" / "mmcifs" / "3o5r.cif"


def _edit(src: Path, dst: Path, *, atoms=None, categories=None) -> Path:
    """A copy of ``src`` with ``atoms(rows) -> rows`` applied to ``_atom_site`` (a list of dicts
    of its columns) and ``categories``: ``{category: function(rows) -> rows}`` to others."""
    doc = gemmi.cif.read(str(src))
    block = doc.sole_block()
    for cat, fn in {**({"_atom_site.": atoms} if atoms else {}), **(categories or {})}.items():
        table = block.get_mmcif_category(cat)
        rows = [dict(zip(table, vals)) for vals in zip(*table.values())]
        rows = fn(rows)
        block.set_mmcif_category(cat, {k: [r[k] for r in rows] for k in table})
    doc.write_file(str(dst))
    return dst


def _filtered(path: Path, ccd, **settings):
    entry = load_entry(path, ccd=ccd)
    return entry, filter_chains(entry, ChainFilters(**settings), ccd)


def _removed(result) -> list[tuple[str, str]]:
    return [(r.filter, r.chain_id) for r in result.removed]


def test_crystallization_aids_only_in_crystal_structures(full_ccd, tmp_path):
    entry, result = _filtered(MMCIFS / "4zey.cif", full_ccd)
    assert entry.methods == ("X-RAY DIFFRACTION",)
    assert _removed(result) == [("crystallization_aid", "B"), ("crystallization_aid", "C")]
    assert [c.chain_id for c in result.entry.chains] == ["A"]
    assert "SO4" in result.removed[0].detail
    # the same file as an NMR entry keeps its sulfates
    nmr = _edit(MMCIFS / "4zey.cif", tmp_path / "4zey_nmr.cif", categories={
        "_exptl.": lambda rows: [dict(r, method="SOLUTION NMR") for r in rows]})
    _, kept = _filtered(nmr, full_ccd)
    assert kept.removed == () and len(kept.entry.chains) == 3
    # ... and so does the filter switched off
    _, off = _filtered(MMCIFS / "4zey.cif", full_ccd, remove_crystallization_aids=False)
    assert off.removed == ()
    # an untouched NMR entry, an untouched EM entry: nothing removed
    for name in ("1psm.cif", "3zee.cif"):
        assert _filtered(MMCIFS / name, full_ccd)[1].removed == ()


def _chain_b_residues(rows, n: int):
    """``_atom_site`` of 4I6P with chain B cut to its first ``n`` modelled residues."""
    seqs = sorted({int(r["label_seq_id"]) for r in rows if r["label_asym_id"] == "B"})
    keep = set(seqs[:n])
    return [r for r in rows if r["label_asym_id"] != "B" or int(r["label_seq_id"]) in keep]


@pytest.mark.parametrize("n,removed", [(3, True), (4, False)])
def test_polymer_chains_with_fewer_than_4_resolved_residues(full_ccd, tmp_path, n, removed):
    path = _edit(MMCIFS / "4i6p.cif", tmp_path / f"4i6p_{n}.cif",
                 atoms=lambda rows: _chain_b_residues(rows, n))
    _, result = _filtered(path, full_ccd)
    if removed:
        assert _removed(result) == [("too_few_resolved", "B")]
        assert result.removed[0].detail == "3 resolved residues < 4"
        assert [c.chain_id for c in result.entry.chains] == ["A"]
    else:
        assert result.removed == ()


def test_protein_chains_with_a_ca_gap(full_ccd, tmp_path):
    """Chain B's residues after its 20th modelled one moved 15 A away from chain A: one pair of
    sequence-consecutive CA atoms is 15 A apart (no clash is made: the move is away from A)."""
    st = gemmi.read_structure(str(MMCIFS / "4i6p.cif"))
    centre = {ch.name: np.mean([a.pos.tolist() for r in ch for a in r], axis=0)
              for ch in st[0] if ch.name in "AB"}
    away = (centre["B"] - centre["A"]) / np.linalg.norm(centre["B"] - centre["A"]) * 15.0

    def move(rows):
        seqs = sorted({int(r["label_seq_id"]) for r in rows if r["label_asym_id"] == "B"})
        for r in rows:
            if r["label_asym_id"] == "B" and int(r["label_seq_id"]) > seqs[19]:
                for axis, d in zip("xyz", away):
                    r[f"Cartn_{axis}"] = f"{float(r[f'Cartn_{axis}']) + d:.3f}"
        return rows

    _, result = _filtered(_edit(MMCIFS / "4i6p.cif", tmp_path / "gap.cif", atoms=move), full_ccd)
    assert _removed(result) == [("ca_gap", "B")]
    assert "A apart > 10.0 A" in result.removed[0].detail
    _, off = _filtered(tmp_path / "gap.cif", full_ccd, max_ca_distance=None)
    assert off.removed == ()


def _with_ligand_copy(tmp_path: Path, n_atoms: int | None, name: str) -> Path:
    """3O5R with a copy of FK506 (chain B; all its atoms or the first ``n_atoms``) as chain Z,
    0.2 A off the original: a second, clashing ligand chain of the same entity."""
    def atoms(rows):
        fk5 = [r for r in rows if r["label_asym_id"] == "B"][:n_atoms]
        serial = max(int(r["id"]) for r in rows)
        copies = [dict(r, id=str(serial + 1 + k), label_asym_id="Z", auth_asym_id="Z",
                       Cartn_x=f"{float(r['Cartn_x']) + 0.2:.3f}") for k, r in enumerate(fk5)]
        return rows + copies

    def struct_asym(rows):
        return rows + [dict(next(r for r in rows if r["id"] == "B"), id="Z")]

    return _edit(FKBP, tmp_path / name, atoms=atoms, categories={"_struct_asym.": struct_asym})


def test_clashing_chains(full_ccd, tmp_path):
    # a full copy: both chains 100% clashing, same atom count -> the larger chain ID goes
    entry, result = _filtered(_with_ligand_copy(tmp_path, None, "copy.cif"), full_ccd)
    assert [c.chain_id for c in entry.chains] == ["A", "B", "Z"]
    assert _removed(result) == [("clashing", "Z")]
    assert result.removed[0].detail.startswith("100% of its 57 resolved atoms within 1.7 A")
    # 20 atoms copied: the copy clashes 100%, FK506 20/57 (35% > 30%) -> the copy goes
    _, part = _filtered(_with_ligand_copy(tmp_path, 20, "part.cif"), full_ccd)
    assert _removed(part) == [("clashing", "Z")]
    # chains bonded to each other do not clash (a covalent ligand next to its partner)
    bonded = dataclasses.replace(entry, bonds=[*entry.bonds, Bond(("B", 0, "C1"), ("Z", 0, "C1"))])
    assert filter_chains(bonded, ChainFilters(), full_ccd).removed == ()


def test_all_unknown_polymer_chains_and_no_chain_left(full_ccd, tmp_path):
    """2Q2K's DNA strand made of unknown nucleotides ``DN`` is removed (its EPE as a
    crystallization aid); 4ZEY's protein made of ``UNK`` leaves no chain (its SO4 are aids):
    an error naming the file."""
    def dna_unknown(rows):
        return [dict(r, label_comp_id="DN", auth_comp_id="DN") if r["label_asym_id"] == "A"
                else r for r in rows]

    path = _edit(MMCIFS / "2q2k.cif", tmp_path / "2q2k_dn.cif", atoms=dna_unknown, categories={
        "_entity_poly_seq.": lambda rows: [dict(r, mon_id="DN") if r["entity_id"] == "1" else r
                                           for r in rows]})
    entry, result = _filtered(path, full_ccd)
    assert entry.chain("A").residues == ["DN"] * 20
    assert _removed(result) == [("all_unknown", "A"), ("crystallization_aid", "D")]
    assert [c.chain_id for c in result.entry.chains] == ["B", "C"]
    assert [c.entity_id for c in result.entry.chains] == [1, 1]  # renumbered from 2

    def unk(rows):
        return [dict(r, label_comp_id="UNK", auth_comp_id="UNK") if r["label_asym_id"] == "A"
                else r for r in rows]

    path = _edit(MMCIFS / "4zey.cif", tmp_path / "4zey_unk.cif", atoms=unk, categories={
        "_entity_poly_seq.": lambda rows: [dict(r, mon_id="UNK") for r in rows]})
    with pytest.raises(InputError, match="every chain removed by the AF3 training filters") as e:
        _filtered(path, full_ccd)
    assert "4zey_unk.cif" in str(e.value) and "A: all_unknown" in str(e.value)


def test_ligands_bonded_to_a_removed_chain_go_with_it(full_ccd, tmp_path):
    """3U8V with chain B cut to 3 residues and its Ni ion (chain C) bonded to B's N-terminus."""
    path = _edit(MMCIFS / "3u8v.cif", tmp_path / "3u8v.cif",
                 atoms=lambda rows: _chain_b_residues(rows, 3))
    entry = load_entry(path, ccd=full_ccd)
    bonded = dataclasses.replace(entry, bonds=[Bond(("C", 0, "NI"), ("B", 0, "N"))])
    result = filter_chains(bonded, ChainFilters(), full_ccd)
    assert _removed(result) == [("too_few_resolved", "B"), ("attached_to_removed", "C")]
    assert result.entry.bonds == []
    # without the bond the ion stays
    assert _removed(filter_chains(entry, ChainFilters(), full_ccd)) == [("too_few_resolved", "B")]


def test_atoms_outside_the_ccd_are_counted_and_not_featurised(full_ccd, tmp_path):
    """One CB of 4ZEY renamed CX: counted in ``outside_ccd``; the residue's CB is unresolved
    in the features."""
    def rename(rows):
        first = next(r for r in rows if r["label_asym_id"] == "A" and r["label_atom_id"] == "CB")
        first["label_atom_id"] = first["auth_atom_id"] = "CX"
        return rows

    path = _edit(MMCIFS / "4zey.cif", tmp_path / "4zey_cx.cif", atoms=rename)
    _, result = _filtered(path, full_ccd)
    report = result.report()
    assert list(report) == [*CHAIN_FILTERS, *ATOM_FILTERS]  # one line per filter
    assert report["outside_ccd"] == 1 and report["leaving"] == 0
    assert [r["chain_id"] for r in report["crystallization_aid"]] == ["B", "C"]
    assert _filtered(MMCIFS / "4zey.cif", full_ccd)[1].atoms["outside_ccd"] == 0


def test_filtering_twice_removes_nothing_more(full_ccd, tmp_path):
    path = _with_ligand_copy(tmp_path, None, "copy.cif")
    _, once = _filtered(path, full_ccd)
    twice = filter_chains(once.entry, ChainFilters(), full_ccd)
    assert twice.removed == () and twice.entry == once.entry


def test_the_cache_stores_filtered_features(full_ccd, tmp_path):
    cache = af3_cache(tmp_path / "cache")
    path = MMCIFS / "4zey.cif"
    plain = fetch_af3_features(cache, path, ccd=full_ccd)
    filt = fetch_af3_features(cache, path, ccd=full_ccd, chain_filters=ChainFilters())
    assert filt.key != plain.key  # the settings are part of the key
    assert plain.features["is_ligand"].sum() == 10 and filt.features["is_ligand"].sum() == 0
    assert len(filt.features["chain_ids"]) == 1
    again = fetch_af3_features(cache, path, ccd=full_ccd, chain_filters=ChainFilters())
    assert again.status == "reused" and again.key == filt.key
    off = fetch_af3_features(cache, path, ccd=full_ccd,
                             chain_filters=ChainFilters(remove_crystallization_aids=False))
    assert off.key not in (plain.key, filt.key) and off.features["is_ligand"].sum() == 10
