"""Fixtures for the AF3 data tests: the shared real data and the full CCD, skipping cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SHARED = REPO.parent / "shared" / "data"
AF3 = SHARED / "af3-examples"
STRUCTURES = AF3 / "biotite-structures"
JSONS = AF3 / "alphafold3-inputs"
CCD_FILES = AF3 / "ccd-components"


@pytest.fixture(scope="session")
def af3_data() -> Path:
    if not AF3.is_dir():
        pytest.skip(f"shared AF3 examples not found at {AF3}")
    return AF3


@pytest.fixture(scope="session")
def full_ccd():
    """biotite's full CCD (loaded once per test session)."""
    from fold_data.af3.ccd import biotite_ccd_path, default_ccd

    if biotite_ccd_path() is None:
        pytest.skip("biotite's components.bcif is not installed (pip install biotite>=1.0)")
    return default_ccd()


@pytest.fixture(scope="session")
def raw_features(af3_data, full_ccd):
    """``name -> raw AF3 features`` of the examples, built once (memoized conformers)."""
    from fold_data.af3 import make_features

    built: dict = {}

    def get(name: str, **kwargs):
        if name not in built:
            path = JSONS / name if name.endswith(".json") else STRUCTURES / name
            if not path.exists():
                path = SHARED / "openfold-testdata" / "mmcifs" / name
            built[name] = make_features(path, ccd=full_ccd, **kwargs)
        return built[name]

    return get


@pytest.fixture(scope="session")
def ccd_dir(af3_data) -> Path:
    return CCD_FILES


@pytest.fixture(scope="session")
def structures(af3_data) -> Path:
    return STRUCTURES


@pytest.fixture(scope="session")
def jsons(af3_data) -> Path:
    return JSONS


@pytest.fixture(scope="session")
def openfold_data() -> Path:
    path = SHARED / "openfold-testdata"
    if not path.is_dir():
        pytest.skip(f"openfold test data not found at {path}")
    return path
