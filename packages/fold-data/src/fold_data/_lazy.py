"""Lazy package exports: a package names what it exports and the submodule of each, and the
submodule is imported only when the name is first used, so ``import fold_data`` (or
``fold_data.af2``) stays light: numpy only, no gemmi, RDKit or torch until a parser is touched.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str], namespace: dict[str, Any]
                 ) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports[name]`` is the submodule (relative,
    ``".msa"``) holding ``name``, or ``""`` for a subpackage itself; the value is cached in the
    package's ``namespace`` after the first lookup."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = exports[name]
        if where:
            value = getattr(importlib.import_module(where, package), name)
        else:
            value = importlib.import_module(f".{name}", package)
        namespace[name] = value
        return value

    return __getattr__
