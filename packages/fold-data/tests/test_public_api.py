"""The public API of fold_data and its subpackages: every name in ``__all__`` resolves, the lazy
packages export exactly what their tables name, and ``import fold_data`` stays light."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["fold_data", "fold_data.af2", "fold_data.af3"])
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    if hasattr(module, "_EXPORTS"):
        assert sorted(module.__all__) == sorted(module._EXPORTS)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_importing_fold_data_loads_no_parser():
    code = ("import sys, fold_data, fold_data.af2; "
            "heavy = {'gemmi', 'rdkit', 'torch'} & set(sys.modules); "
            "sys.exit(f'loaded {heavy}' if heavy else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
