"""Shared fixtures: a feature cache of two bundled real chains, and small training configs."""

from __future__ import annotations

import pytest
import torch
from _train_helpers import CHAINS, DEMO

# One intra-op thread: these models are tiny, and the CI machine is shared (OMP_NUM_THREADS=1
# there too); more threads only oversubscribe the cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> tuple[str, list[tuple[str, str]]]:
    """``(cache dir, [(chain, key)])`` built from the bundled data (skipped if it is absent)."""
    if not (DEMO / "mmcifs").is_dir():
        pytest.skip(f"bundled demo data not found at {DEMO}")
    from fold_train.data import open_cache

    cache = tmp_path_factory.mktemp("cache")
    chains = open_cache(DEMO, cache, chains=list(CHAINS), workers=1)
    return str(cache), chains


@pytest.fixture(scope="session")
def af3_cache_entries(tmp_path_factory) -> tuple[str, list[tuple[str, str]]]:
    """``(cache dir, [(entry, key)])`` of the bundled 3O5R (built with the bundled CCD)."""
    from _af3_helpers import AF3_DEMO, CCD, needs_af3_demo

    needs_af3_demo()
    from fold_data.af3 import Ccd
    from fold_train.af3_data import open_af3_cache

    cache = tmp_path_factory.mktemp("af3_cache")
    return str(cache), open_af3_cache(AF3_DEMO, cache, ccd=Ccd([CCD], use_biotite=False))


def pytest_configure(config):
    # also registered by the repository's conftest.py, which pytest may not load from here
    config.addinivalue_line("markers", "distributed: starts several processes (torch.distributed)")
