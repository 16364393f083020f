"""The representative ("pseudo-beta") atom of each AF3 token, ``token_pseudo_beta_atom``: CB (CA
for glycine), C4 for purines, C2 for pyrimidines, C1' for ``N`` / ``DN``, the atom of a one-atom
token (AF3's ``PseudoBetaInfo``, Protenix's ``distogram_rep_atom_mask``); kept on the right atom
through cropping and padding.

Real files, bundled: 3O5R (FKBP51 + FK506, glycines), 4ZEY (selenomethionine, SO4), 2Q2K
(protein-DNA with the modified nucleotide 5IU); the chosen atoms are checked by name and by
their coordinates against the mmCIF read independently with gemmi.
"""

from __future__ import annotations

import json
from pathlib import Path

import gemmi
import numpy as np
import pytest
from fold_data.af3 import AF3DataPreset, make_features, make_sample
from fold_data.af3.crop import contiguous_crop, crop_features, spatial_crop
from fold_data.af3.tokenizer import atom_name_from_chars

DEMO = Path(__file__).resolve().parents[4] / "data" / "demo"
CIFS = {"3o5r": DEMO / "af3" / "mmcifs" / "3o5r.cif", "4zey": DEMO / "mmcifs" / "4zey.cif",
        "2q2k": DEMO / "mmcifs" / "2q2k.cif"}
PYRIMIDINES = {"C", "U", "DC", "DT"}


@pytest.fixture(scope="module")
def feats(full_ccd):
    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = make_features(CIFS[name], ccd=full_ccd)
        return built[name]

    return get


def _names(f) -> list[str]:
    return [atom_name_from_chars(c) for c in f["ref_atom_name_chars"]]


def _expected(res_name: str, mol_type: str) -> str:
    if mol_type == "protein":
        return "CA" if res_name == "GLY" else "CB"
    return "C2" if res_name in PYRIMIDINES else "C4"


def _polymers(path: Path) -> dict[str, tuple[list[str], dict[int, gemmi.Residue]]]:
    """Per polymer chain (``label_asym_id``, fold's chain ID): the entity's full sequence and
    the modelled residues by ``label_seq_id`` (model 1), read with gemmi."""
    st = gemmi.read_structure(str(path))
    st.setup_entities()
    out = {}
    for chain in st[0]:
        poly = chain.get_polymer()
        if len(poly):
            seq = [gemmi.Entity.first_mon(m) for m in st.get_entity_of(poly).full_sequence]
            out[poly.subchain_id()] = (seq, {r.label_seq: r for r in poly})
    return out


@pytest.mark.parametrize("name", ["3o5r", "4zey", "2q2k"])
def test_representative_atom_by_name_and_position(feats, name):
    f = feats(name)
    rep, a2t = f["token_pseudo_beta_atom"], f["atom_to_token"]
    n = len(f["restype"])
    assert rep.dtype == np.int32 and rep.shape == (n,)
    assert (a2t[rep] == np.arange(n)).all()  # each token's own atom
    names = _names(f)
    atomized = f["is_atomized"] > 0
    # one-atom tokens (ligands, ions, modified residues): the atom itself, the centre
    np.testing.assert_array_equal(rep[atomized], f["token_center_atom"][atomized])
    np.testing.assert_array_equal(rep[atomized], np.flatnonzero(np.isin(a2t, np.flatnonzero(
        atomized))))
    # standard residues against the mmCIF: the residue's name decides, the coordinates agree
    polymers = _polymers(CIFS[name])
    chain_ids = [c.decode() for c in f["chain_ids"]]
    seen = {"CA": 0, "CB": 0, "C4": 0, "C2": 0}
    for t in np.flatnonzero(~atomized):
        chain = chain_ids[f["asym_id"][t]]
        seq, modelled = polymers[chain]
        pos = int(f["residue_index"][t]) + 1  # label_seq_id
        mol_type = "protein" if f["is_protein"][t] else "dna" if f["is_dna"][t] else "rna"
        want = _expected(seq[pos - 1], mol_type)
        assert names[rep[t]] == want, (name, chain, pos, seq[pos - 1])
        seen[want] += 1
        res = modelled.get(pos)
        # the atom's sites (one per altloc; fold-data keeps the most occupied conformer)
        sites = np.array([a.pos.tolist() for a in res if a.name == want] if res else [])
        if f["atom_resolved"][rep[t]]:
            err = np.linalg.norm(sites - f["atom_positions"][rep[t]], axis=-1).min()
            assert err < 1e-3, (chain, pos, want, err)
        else:
            assert len(sites) == 0, (chain, pos, want)
    assert seen["CA"] > 0 and seen["CB"] > 0  # glycines and others
    if name == "2q2k":
        assert seen["C4"] > 0 and seen["C2"] > 0
        # 5IU (5-iodo-dU, per-atom tokens): its I5 atom is a token of its own, represented by I5
        i5 = names.index("I5")
        assert rep[a2t[i5]] == i5
    if name in ("3o5r", "4zey"):  # FK5 / SO4: every ligand atom its own token
        lig = np.flatnonzero(f["is_ligand"])
        assert len(lig) > 0 and (a2t[rep[lig]] == lig).all()


def test_nucleotides_and_unknowns_from_a_json(tmp_path, full_ccd):
    """RNA ``ACGUN``, DNA ``ACGTN`` and protein ``GAX`` (X: UNK) from an AF3 input JSON: every
    token's representative atom by its residue (no coordinates: all unresolved)."""
    doc = {"name": "rep", "modelSeeds": [1], "dialect": "alphafold3", "version": 1,
           "sequences": [{"rna": {"id": "R", "sequence": "ACGUN"}},
                         {"dna": {"id": "D", "sequence": "ACGTN"}},
                         {"protein": {"id": "P", "sequence": "GAX"}},
                         {"ligand": {"id": "L", "ccdCodes": ["MG"]}}]}
    path = tmp_path / "rep.json"
    path.write_text(json.dumps(doc))
    f = make_features(path, ccd=full_ccd)
    names = _names(f)
    got = [names[a] for a in f["token_pseudo_beta_atom"]]
    assert got == ["C4", "C2", "C4", "C2", "C1'",  # A C G U N
                   "C4", "C2", "C4", "C2", "C1'",  # DA DC DG DT DN
                   "CA", "CB", "CB",  # GLY ALA UNK
                   "MG"]


def _check_remapped(raw, cropped, tokens) -> None:
    """The cropped representative atoms are the same atoms as before the crop."""
    names_raw, names_crop = _names(raw), _names(cropped)
    old = raw["token_pseudo_beta_atom"][tokens]
    new = cropped["token_pseudo_beta_atom"][: len(tokens)]
    assert (cropped["atom_to_token"][new] == np.arange(len(tokens))).all()
    assert [names_crop[a] for a in new] == [names_raw[a] for a in old]
    np.testing.assert_array_equal(cropped["atom_positions"][new], raw["atom_positions"][old])
    np.testing.assert_array_equal(cropped["atom_resolved"][new], raw["atom_resolved"][old])


@pytest.mark.parametrize("method", ["contiguous", "spatial"])
def test_cropping_keeps_the_representative_atoms(feats, method):
    raw = feats("3o5r")
    for seed in range(3):
        rng = np.random.default_rng(seed)
        tokens = (contiguous_crop(raw, 60, rng, max_atoms=500) if method == "contiguous"
                  else spatial_crop(raw, 60, rng, 500))
        _check_remapped(raw, crop_features(raw, tokens), tokens)


def test_samples_crop_and_pad_the_representative_atoms(feats):
    raw = feats("2q2k")
    n_tok, n_atom = len(raw["restype"]), len(raw["atom_to_token"])
    # padded without a crop: real tokens unchanged, padding tokens point at atom 0
    pad = AF3DataPreset("pad", n_token=n_tok + 7, n_atom=n_atom + 30, n_msa=3, n_templ=1)
    s = make_sample(raw, pad, seed=1)
    np.testing.assert_array_equal(s["token_pseudo_beta_atom"][:n_tok],
                                  raw["token_pseudo_beta_atom"])
    assert (s["token_pseudo_beta_atom"][n_tok:] == 0).all()
    # cropped and padded: the crop's tokens are recovered from token_index
    crop = AF3DataPreset("crop", n_token=64, n_atom=640, n_msa=3, n_templ=1)
    for seed in range(4):
        s = make_sample(raw, crop, seed=seed)
        real = int(s["token_mask"].sum())
        assert real < n_tok
        tokens = s["token_index"][:real]
        _check_remapped(raw, s, tokens)
        assert (s["atom_mask"][s["token_pseudo_beta_atom"][:real]] == 1).all()
