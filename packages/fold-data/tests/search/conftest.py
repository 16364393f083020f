"""Fixtures of the search tests (constants and helpers: ``_search_helpers``)."""

from __future__ import annotations

import pytest
from _search_helpers import chain_sequence

pytest.importorskip("pyhmmer")  # a declared dependency of fold-data; never missing after install


@pytest.fixture(scope="session")
def nrbf2() -> str:
    """4ZEY chain A, human NRBF2 MIT domain (84 residues)."""
    return chain_sequence("4zey", "A")


@pytest.fixture(scope="session")
def par3() -> str:
    """4I6P chain A, the Par-3 N-terminal domain (88 residues)."""
    return chain_sequence("4i6p", "A")
