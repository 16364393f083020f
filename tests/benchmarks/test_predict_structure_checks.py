"""The structure-checks benchmark (``benchmarks/predict/structure_checks.py``) at small sizes:
both layouts built from the bundled 3U8V, the cell list and every pair run and agree, and the
JSON and Markdown results are written where asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.predict import structure_checks

COPY = 1258  # 3U8V's polymer atoms (two chains)


def test_structure_checks_cpu_smoke(tmp_path: Path) -> None:
    assert structure_checks.main(["--atoms", "1500", "3000", "--all-max", "2600",
                                  "--repeats", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "structure_checks.json").read_text())
    assert "| one chain | 2516 | 1 |" in (tmp_path / "structure_checks.md").read_text()
    rows = doc["rows"]
    # 1500 atoms: 2 copies, every pair runs too; 3000: 3 copies, above --all-max
    assert [(r["layout"], r["atoms"], r["chains"], "all" in r) for r in rows] == [
        ("one chain", 2 * COPY, 1, True), ("one chain", 3 * COPY, 1, False),
        ("copies", 2 * COPY, 4, True), ("copies", 3 * COPY, 6, False)]
    for r in rows:
        assert r["cells"]["has_clash"] is False  # a real structure, copies 4 A apart
        assert 0.0 <= r["cells"]["fraction_disordered"] < 0.5
        if "all" in r:
            assert r["all"]["fraction_disordered"] == r["cells"]["fraction_disordered"]
            assert r["all"]["has_clash"] is False


def test_tiled_atoms_layouts() -> None:
    """One chain: residues numbered on across copies, each naming its residue; copies: two
    chains each, the same positions."""
    one = structure_checks.tiled_atoms(COPY + 1, True)
    many = structure_checks.tiled_atoms(COPY + 1, False)
    np.testing.assert_array_equal(one["positions"], many["positions"])
    assert len(one["positions"]) == 2 * COPY
    assert set(one["chain"]) == {0} and set(many["chain"]) == {0, 1, 2, 3}
    second = slice(COPY, None)  # the second copy: the same residues, numbered after the first
    first_names = one["res_names"][0][:len(one["res_names"][0]) // 2]
    assert one["res_names"][0] == first_names * 2
    assert [one["res_names"][0][i] for i in one["residue"][second]] == \
        [many["res_names"][c][i] for c, i in zip(many["chain"][second],
                                                 many["residue"][second], strict=True)]
