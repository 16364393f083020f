"""The shape of benchmarks/: every suite module is an entry point that `nox -s bench` can name,
and benchmark code imports shared code only from benchmarks.common, never another script."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SUITES = ("kernels", "model", "train", "parallel", "data", "chunk", "predict")


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (BENCH / folder).glob("*.py") if p.name != "__init__.py")


def _nox_lists() -> set[str]:
    """The entries of noxfile.py's BENCHMARKS and DISTRIBUTED_BENCHMARKS (read, not imported)."""
    names: set[str] = set()
    for node in ast.parse((REPO / "noxfile.py").read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("BENCHMARKS", "DISTRIBUTED_BENCHMARKS"):
            names |= set(ast.literal_eval(node.value))
    return names


def test_every_suite_module_is_an_entry_point_named_in_the_noxfile():
    listed = _nox_lists()
    found = {f"{suite}.{p.stem}" for suite in SUITES for p in _modules(suite)}
    assert found == listed
    for suite in (*SUITES, "tools"):
        for path in _modules(suite):
            text = path.read_text()
            assert "def main(" in text and 'if __name__ == "__main__":' in text, path


def test_scripts_import_shared_code_from_common_only():
    for folder in (*SUITES, "tools", "common"):
        for path in _modules(folder):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    mod = node.module
                elif isinstance(node, ast.Import):
                    mod = node.names[0].name
                else:
                    continue
                if mod.startswith("benchmarks"):
                    assert mod == "benchmarks.common" or mod.startswith("benchmarks.common."), (
                        f"{path.relative_to(REPO)} imports {mod}")
            assert "sys.path.insert" not in path.read_text(), path
