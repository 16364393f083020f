"""mmCIF parsing on real entries and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import gemmi
import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif, residue_one_letter

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "demo"
SHARED = REPO.parent / "shared" / "data" / "openfold-testdata"


def _a3m_query(pdb_chain: str) -> str:
    lines = (DEMO / "alignments" / pdb_chain / "bfd_uniclust_hits.a3m").read_text().splitlines()
    return lines[1].strip()


def test_nmr_first_model_only():
    s = parse_mmcif(DEMO / "mmcifs" / "1psm.cif")
    assert s.pdb_id == "1psm" and s.method == "SOLUTION NMR" and s.resolution == 0.0
    assert s.release_date == "1995-02-07"
    chain = s.get_chain("A")
    st = gemmi.read_structure(str(DEMO / "mmcifs" / "1psm.cif"))
    assert len(st) == 20
    ca0 = st[0]["A"][0]["CA"][0].pos
    ca1 = st[1]["A"][0]["CA"][0].pos
    assert ca0.dist(ca1) > 0.01  # the models differ, so this checks which one we took
    got = chain.atom37_positions[0, rc.atom_order["CA"]]
    assert np.allclose(got, [ca0.x, ca0.y, ca0.z], atol=1e-4)
    assert chain.sequence == _a3m_query("1psm_A")
    assert chain.modelled.all()


def test_author_and_label_chain_ids_2q2k():
    s = parse_mmcif(DEMO / "mmcifs" / "2q2k.cif")
    assert set(s.chains) == {"F", "A", "B"}
    dna = s.get_chain("F")
    assert dna.label_chain_id == "A" and dna.polymer_type == "dna"
    assert dna.sequence == "AGTATAXACXAGTATATACT"  # 5IU (5-iodo-dU) has no tabulated parent
    assert dna.atom37_mask.sum() == 0 and dna.modelled.all()
    # Author ID first, then label ID: label "C" is author chain "B".
    assert s.get_chain("B").label_chain_id == "C"
    assert s.get_chain("C").author_chain_id == "B"
    cache_file = SHARED / "train_mmcifs_cache.json"
    if cache_file.is_file():  # OpenFold's cache of this entry, when the shared data is present
        cache = json.loads(cache_file.read_text())["2q2k"]
        assert s.release_date == cache["release_date"] and s.resolution == cache["resolution"]
        for cid, seq in zip(cache["chain_ids"], cache["seqs"]):
            assert s.get_chain(cid).sequence == seq
    for cid in ("A", "B"):
        chain = s.get_chain(cid)
        assert chain.sequence == _a3m_query(f"2q2k_{cid}")
        assert 0 < chain.modelled.sum() < chain.num_res  # His tag etc. not modelled
        # Unmodelled residues have no atoms; modelled ones have their backbone.
        assert chain.atom37_mask[~chain.modelled].sum() == 0
        assert chain.atom37_mask[chain.modelled, rc.atom_order["CA"]].all()


def test_mse_mapped_to_met_4zey():
    s = parse_mmcif(DEMO / "mmcifs" / "4zey.cif")
    assert s.method == "X-RAY DIFFRACTION" and s.resolution == pytest.approx(1.5)
    chain = s.get_chain("A")
    assert chain.sequence == _a3m_query("4zey_A")
    mse = [i for i, n in enumerate(chain.residue_names) if n == "MSE"]
    assert mse and all(chain.sequence[i] == "M" for i in mse)
    sd = rc.atom_order["SD"]
    assert all(chain.atom37_mask[i, sd] == 1 for i in mse if chain.modelled[i])
    # Masks stay within each residue type's atoms (plus OXT).
    allowed = rc.restype_atom37_mask[chain.aatype].copy()
    allowed[:, rc.atom_order["OXT"]] = 1
    assert np.all(chain.atom37_mask <= allowed)
    assert chain.unknown_residues == ()


@pytest.mark.parametrize("pdb,chains", [("3u8v", "AB"), ("4i6p", "AB"), ("3zee", "A")])
def test_homodimers_and_em(pdb, chains):
    s = parse_mmcif(DEMO / "mmcifs" / f"{pdb}.cif")
    assert set(s.chains) == set(chains)
    seqs = {s.get_chain(c).sequence for c in chains}
    assert len(seqs) == 1
    if pdb == "3zee":
        assert s.method == "ELECTRON MICROSCOPY" and s.resolution == pytest.approx(6.1)
    if pdb == "3u8v":
        assert s.get_chain("A").sequence == _a3m_query("3u8v_A")
    for c in chains:
        ch = s.get_chain(c)
        assert ch.atom37_positions.shape == (ch.num_res, 37, 3)
        assert ch.atom37_positions.dtype == np.float32 and ch.atom37_mask.dtype == np.float32
        assert np.isfinite(ch.atom37_positions).all()


def test_many_chains_label_order_differs_5kc1():
    path = SHARED / "mmcifs" / "5kc1.cif"
    if not path.is_file():
        pytest.skip("shared openfold test data not present")
    s = parse_mmcif(path)
    assert len(s.chains) == 12
    assert s.get_chain("C").label_chain_id == "A" and s.get_chain("A").label_chain_id == "C"
    a = s.get_chain("A")
    assert a.modelled.sum() < a.num_res  # partially modelled
    # Modelled residues sit at their label_seq_id: compare CA with gemmi directly.
    st = gemmi.read_structure(str(path))
    for res in st[0]["A"].get_polymer():
        if res.find_atom("CA", "*") is not None:
            i = res.label_seq - 1
            assert a.modelled[i] and a.author_residue_numbers[i] == res.seqid.num
            assert a.residue_names[i] == res.name
    # Altloc: ARG 137 of chain A has conformers A (occupancy 0.56) and B (0.44).
    res = next(r for r in st[0]["A"] if r.seqid.num == 137)
    cz_a = next(at.pos for at in res if at.name == "CZ" and at.altloc == "A")
    i = res.label_seq - 1
    assert np.allclose(a.atom37_positions[i, rc.atom_order["CZ"]], [cz_a.x, cz_a.y, cz_a.z],
                       atol=1e-4)


def test_altloc_highest_occupancy_not_first(tmp_path):
    st = gemmi.read_structure(str(DEMO / "mmcifs" / "4zey.cif"))
    res = next(r for r in st[0]["A"] if r.seqid.num == 66)  # LYS with altlocs A/B at 0.5/0.5
    for atom in res:
        if atom.altloc == "B":
            atom.occ = 0.7
        elif atom.altloc == "A":
            atom.occ = 0.3
    nz_b = next(at.pos for at in res if at.name == "NZ" and at.altloc == "B")
    out = tmp_path / "4zey_altB.cif"
    st.make_mmcif_document().write_file(str(out))
    chain = parse_mmcif(out).get_chain("A")
    got = chain.atom37_positions[res.label_seq - 1, rc.atom_order["NZ"]]
    assert np.allclose(got, [nz_b.x, nz_b.y, nz_b.z], atol=1e-3)
    # With equal occupancies the first conformer (A) wins.
    orig = parse_mmcif(DEMO / "mmcifs" / "4zey.cif").get_chain("A")
    nz_a = next(at.pos for at in res if at.name == "NZ" and at.altloc == "A")
    assert np.allclose(orig.atom37_positions[res.label_seq - 1, rc.atom_order["NZ"]],
                       [nz_a.x, nz_a.y, nz_a.z], atol=1e-3)


def test_one_letter_codes():
    assert residue_one_letter("MSE") == "M" and residue_one_letter("SEP") == "S"
    assert residue_one_letter("PTR") == "Y" and residue_one_letter("UNK") == "X"
    assert residue_one_letter("ZZZ") == "X" and residue_one_letter("DG", "dna") == "G"


def test_missing_chain_names_available_chains():
    s = parse_mmcif(DEMO / "mmcifs" / "2q2k.cif")
    with pytest.raises(InputError, match="available chains: F") as err:
        s.get_chain("Q")
    assert err.value.record == "chain Q" and err.value.path.endswith("2q2k.cif")


def test_truncated_file(tmp_path):
    text = (DEMO / "mmcifs" / "3u8v.cif").read_text()
    start = text.index("_atom_site.")
    cut = tmp_path / "3u8v_truncated.cif"
    cut.write_text(text[: start + (len(text) - start) // 2])  # mid-way through a row
    with pytest.raises(InputError, match="3u8v_truncated.cif"):
        parse_mmcif(cut)
    # Cut before the coordinates: syntactically fine, but no _atom_site.
    cut.write_text(text[:start].rsplit("loop_", 1)[0])
    with pytest.raises(InputError, match="_atom_site"):
        parse_mmcif(cut)


def test_garbage_and_missing_files(tmp_path):
    garbage = tmp_path / "garbage.cif"
    garbage.write_text("this is not\n an mmCIF 'file\n")
    with pytest.raises(InputError, match="garbage.cif"):
        parse_mmcif(garbage)
    with pytest.raises(InputError, match="not found"):
        parse_mmcif(tmp_path / "nope.cif")


def test_unknown_residues_mapped_to_x(tmp_path):
    text = (DEMO / "mmcifs" / "1psm.cif").read_text()
    # Rename every LYS of the entity and its atoms to an unknown component ZZZ.
    renamed = text.replace(" LYS ", " ZZZ ")
    path = tmp_path / "1psm_zzz.cif"
    path.write_text(renamed)
    chain = parse_mmcif(path).get_chain("A")
    lys = [i for i, r in enumerate(_a3m_query("1psm_A")) if r == "K"]
    assert [i for i, _ in chain.unknown_residues] == lys
    assert all(chain.sequence[i] == "X" for i in lys)
    # Unknown residues keep their backbone only.
    assert chain.atom37_mask[lys][:, rc.atom_order["CA"]].all()
    assert chain.atom37_mask[lys][:, rc.atom_order["NZ"]].sum() == 0
    # A protein chain made only of unknown residues is refused when asked for.
    all_unknown = text
    for name in rc.resnames[:20]:
        all_unknown = all_unknown.replace(f" {name} ", " ZZZ ")
    path.write_text(all_unknown)
    s = parse_mmcif(path)
    assert set(s.chains["A"].sequence) == {"X"}
    with pytest.raises(InputError, match="unknown"):
        s.get_chain("A")
