"""has_clash and fraction_disordered (AF3's ranking terms from coordinates) on real structures:
the Shrake-Rupley areas against biotite's implementation (a fold-data dependency), a folded
chain against the same chain stretched out, and a chain against a copy of itself laid on top."""

from __future__ import annotations

import numpy as np
import pytest
from _train_helpers import DEMO
from fold_train.structure_checks import (
    atom_sasa,
    fraction_disordered,
    has_clash,
    relative_sasa,
)

DSSP_RADII = {"N": 1.65, "CA": 1.87, "C": 1.76, "O": 1.4}


@pytest.fixture(scope="module")
def chain_a():
    """4ZEY chain A's heavy protein atoms: coordinates, atom names, residue index, names."""
    import biotite.structure as bs
    import biotite.structure.io.pdbx as pdbx

    atoms = pdbx.get_structure(pdbx.CIFFile.read(DEMO / "mmcifs" / "4zey.cif"), model=1)
    atoms = atoms[(atoms.chain_id == "A") & bs.filter_amino_acids(atoms) & (atoms.element != "H")]
    starts = bs.get_residue_starts(atoms)
    residue = np.cumsum(np.isin(np.arange(len(atoms)), starts)) - 1
    return atoms, residue, [str(atoms.res_name[s]) for s in starts]


def test_sasa_agrees_with_biotite(chain_a):
    import biotite.structure as bs

    atoms, residue, names = chain_a
    radii = np.array([DSSP_RADII.get(n, 1.8) for n in atoms.atom_name])
    mine = atom_sasa(atoms.coord, radii)
    ref = bs.sasa(atoms, probe_radius=1.4, point_number=1000, vdw_radii=radii)
    # 100 points per atom against 1000: a few percent on the total, per atom within ~8 A^2
    assert mine.sum() == pytest.approx(ref.sum(), rel=0.02)
    assert np.corrcoef(mine, ref)[0, 1] > 0.99
    rasa = relative_sasa(atoms.coord, atoms.atom_name, residue, names)
    assert rasa.shape == (len(names),) and (rasa >= 0).all() and (rasa <= 1).all()


def test_fraction_disordered_folded_versus_stretched(chain_a):
    atoms, residue, names = chain_a
    n = len(atoms)
    args = (np.zeros(n, int), residue, np.ones(n, bool), atoms.atom_name, {0: names})
    folded = fraction_disordered(atoms.coord, *args)
    # each residue moved 4 A further along x than the previous one: an extended, exposed chain
    stretched = atoms.coord + np.stack([residue * 4.0 * 3, np.zeros(n), np.zeros(n)], -1)
    assert folded < 0.2 and fraction_disordered(stretched, *args) > 0.8
    # no protein atom: nothing is disordered
    assert fraction_disordered(atoms.coord, args[0], residue, np.zeros(n, bool),
                               atoms.atom_name, {0: names}) == 0.0


def test_has_clash(chain_a):
    atoms, residue, _ = chain_a
    n = len(atoms)
    one = np.zeros(n, int)
    assert not has_clash(atoms.coord, one, residue, np.ones(n, bool))  # a real chain
    # a second copy on top of the first: every atom clashes with the other chain
    two = np.concatenate([atoms.coord, atoms.coord + 0.3])
    chain = np.concatenate([one, one + 1])
    assert has_clash(two, chain, np.concatenate([residue, residue]), np.ones(2 * n, bool))
    # ...unless the copy is a ligand (not a polymer): AF3 counts polymer atoms only
    polymer = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    assert not has_clash(two, chain, np.concatenate([residue, residue]), polymer)
    # 40 atoms moved onto 40 others: 80 clashing atoms of 679, under both the count (100)
    # and half the chain; 150 moved: 300, over the count
    few = atoms.coord.copy()
    far = residue > residue.max() // 2
    idx_far = np.flatnonzero(far)[:40]
    few[idx_far] = atoms.coord[np.flatnonzero(~far)[:40]] + 0.2
    assert not has_clash(few, one, residue, np.ones(n, bool))
    many = atoms.coord.copy()
    idx_far = np.flatnonzero(far)[:150]
    many[idx_far] = atoms.coord[np.flatnonzero(~far)[:150]] + 0.2
    assert has_clash(many, one, residue, np.ones(n, bool))


def test_sasa_of_a_crowded_structure_equals_the_direct_count():
    """A collapsed structure (an untrained model's prediction: every atom overlaps hundreds of
    others), where the areas are computed against the nearest neighbours first and only the
    points still free meet the next ones: the same areas as testing every point against every
    other atom."""
    from fold_train.structure_checks import _sphere

    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 3)) * 2.5  # 300 atoms in a ball of ~5 A
    radii = rng.uniform(1.4, 1.9, len(x))
    r = radii + 1.4  # the probe
    pts = x[:, None, :] + r[:, None, None] * _sphere(100)  # [A, P, 3]
    d2 = ((pts[:, :, None, :] - x[None, None, :, :]) ** 2).sum(-1)  # [A, P, A]
    covered = (d2 < r[None, None, :] ** 2) & ~np.eye(len(x), dtype=bool)[:, None, :]
    direct = 4.0 * np.pi * r ** 2 * (~covered.any(-1)).mean(-1)
    np.testing.assert_allclose(atom_sasa(x, radii), direct, rtol=0, atol=1e-9)
    # torch's path (on the GPU in a prediction; on the CPU here, the same code)
    np.testing.assert_allclose(atom_sasa(x, radii, device="cpu"), direct, rtol=0, atol=1e-9)
    assert 0 < direct.sum() < 0.2 * (4.0 * np.pi * r ** 2).sum()  # mostly buried


# ---- the cell list (neighbours="cells", the default) against every pair (neighbours="all")

MMCIFS = sorted((DEMO / "mmcifs").glob("*.cif"))


def _atoms(path):
    """A bundled structure's atoms as ``fold-train predict`` reads its own output."""
    import gemmi
    from fold_train.confidence_outputs import structure_atoms

    return structure_atoms(gemmi.read_structure(str(path)))


def _same_checks(atoms, min_clashing: int = 0):
    """Per-atom clashes equal, has_clash equal, per-atom areas equal to float64 round-off and
    fraction_disordered equal, for the cell list and for every pair."""
    from fold_train.structure_checks import _clashing

    args = (atoms["positions"], atoms["chain"], atoms["residue"], atoms["polymer"])
    cells, every = _clashing(*args), _clashing(*args, neighbours="all")
    np.testing.assert_array_equal(cells, every)
    assert cells.sum() >= min_clashing
    assert has_clash(*args) == has_clash(*args, neighbours="all")
    radii = np.array([DSSP_RADII.get(str(n), 1.8) for n in atoms["atom_names"]])
    area = atom_sasa(atoms["positions"], radii)
    # the same points tested against the same neighbours: only the matrix products' rounding
    # (|x|^2 ~ 1e4 A^2, float64) may differ, far below one point's share (~0.3 A^2)
    np.testing.assert_allclose(area, atom_sasa(atoms["positions"], radii, neighbours="all"),
                               rtol=0, atol=1e-9)
    # torch's blocked all-pairs path (fold_train.sasa_device; the GPU's in a prediction)
    np.testing.assert_allclose(area, atom_sasa(atoms["positions"], radii, device="cpu"),
                               rtol=0, atol=1e-9)
    disorder = (atoms["positions"], atoms["chain"], atoms["residue"], atoms["protein"],
                atoms["atom_names"], atoms["res_names"])
    assert fraction_disordered(*disorder) == fraction_disordered(*disorder, neighbours="all")
    assert fraction_disordered(*disorder) == fraction_disordered(*disorder, device="cpu")
    return cells


@pytest.mark.parametrize("path", MMCIFS, ids=lambda p: p.stem)
def test_cells_equal_every_pair_on_real_structures(path):
    atoms = _atoms(path)
    assert len(atoms["positions"]) > 300
    _same_checks(atoms)
    # every polymer chain after the first moved onto the first (0.4 A off): many clashes
    first = atoms["chain"] == atoms["chain"][0]
    if (~first & atoms["polymer"]).any():
        pos = atoms["positions"].copy()
        pos[~first] += pos[first].mean(0) - pos[~first].mean(0) + 0.4
        _same_checks({**atoms, "positions": pos}, min_clashing=20)


def test_cells_equal_every_pair_on_a_collapsed_structure():
    """An untrained model's prediction: 3 chains of 1201 atoms piled into a ball of ~5 A."""
    rng = np.random.default_rng(11)
    n = 3 * 1201
    chain = np.repeat(np.arange(3), 1201)
    residue = np.tile(np.arange(1201) // 8, 3)
    names = np.array(["N", "CA", "C", "O", "CB", "CG", "CD", "NE"])[np.arange(n) % 8]
    atoms = {"positions": rng.normal(size=(n, 3)) * 1.7, "chain": chain, "residue": residue,
             "polymer": np.arange(n) % 97 != 0, "protein": np.ones(n, bool),
             "atom_names": names, "res_names": {c: ["GLY"] * 151 for c in range(3)}}
    _same_checks(atoms, min_clashing=n // 2)
    assert has_clash(atoms["positions"], chain, residue, atoms["polymer"])


def test_structure_scores_on_a_device_equal_numpys(monkeypatch):
    """What a prediction on a GPU computes (``structure_scores(atoms, device)``) against the
    numpy default, and which device the areas are computed on: the prediction's when it is a
    GPU, numpy's cell list otherwise."""
    import fold_train.sasa_device as sasa_device
    import torch
    from fold_train.confidence_outputs import structure_scores

    atoms = _atoms(MMCIFS[0])
    radii = np.array([DSSP_RADII.get(str(n), 1.8) for n in atoms["atom_names"]])
    np.testing.assert_allclose(atom_sasa(atoms["positions"], radii, device="cpu"),
                               atom_sasa(atoms["positions"], radii), rtol=0, atol=1e-9)
    asked = []
    real = sasa_device.atom_sasa_device

    def spy(positions, radii, dots, device):  # a CUDA device, computed here on the CPU
        asked.append(torch.device(device))
        return real(positions, radii, dots, "cpu")

    monkeypatch.setattr(sasa_device, "atom_sasa_device", spy)
    assert structure_scores(atoms, torch.device("cpu")) == structure_scores(atoms)
    assert asked == []
    assert structure_scores(atoms, torch.device("cuda", 1)) == structure_scores(atoms)
    assert set(asked) == {torch.device("cuda", 1)}


def test_device_sasa_of_no_atoms_and_of_one():
    assert atom_sasa(np.zeros((0, 3)), np.zeros(0), device="cpu").shape == (0,)
    one = atom_sasa(np.zeros((1, 3)), np.array([1.8]), device="cpu")
    np.testing.assert_allclose(one, 4.0 * np.pi * (1.8 + 1.4) ** 2, rtol=1e-12)


def test_neighbours_must_be_known(chain_a):
    atoms, residue, _ = chain_a
    with pytest.raises(ValueError, match="neighbours"):
        has_clash(atoms.coord, np.zeros(len(atoms), int), residue, np.ones(len(atoms), bool),
                  neighbours="grid")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -2.0])
def test_a_bad_radius_is_named(bad):
    x = np.arange(12, dtype=float).reshape(4, 3)
    radii = np.full(4, 1.8)
    radii[2] = bad
    with pytest.raises(ValueError, match="atom 2 has radius"):
        atom_sasa(x, radii)
