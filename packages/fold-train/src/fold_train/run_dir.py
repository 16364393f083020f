"""One run per run directory: a new run never mixes its config, metrics and checkpoints with an
earlier one's. A run directory that holds another run's outputs is refused unless the user
continues it (``--resume``) or replaces it (``--overwrite``). A feature cache inside the run
directory (``RUN_DIR/cache``, the default) is not a run output: it is kept and reused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fold_data.errors import InputError

__all__ = ["RUN_OUTPUTS", "prepare_run_dir", "run_outputs"]

# what a training run writes into its directory (everything --overwrite removes)
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "training.png", "checkpoints", "tensorboard")


def run_outputs(run_dir: str | os.PathLike) -> list[Path]:
    """The outputs of an earlier run present in ``run_dir`` (an empty checkpoints/ counts not)."""
    run_dir = Path(run_dir)
    found = []
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir() and not any(p.iterdir()):
            continue
        if p.exists() or p.is_symlink():
            found.append(p)
    return found


def prepare_run_dir(run_dir: str | os.PathLike, *, resume: bool, overwrite: bool,
                    remove: bool = True) -> None:
    """Check ``run_dir`` before a run starts. ``resume``: it is continued (nothing to check);
    ``overwrite``: the earlier run's outputs are deleted (only when ``remove``, i.e. on one
    rank); otherwise earlier outputs are an :class:`InputError` naming them and the options."""
    if resume and overwrite:
        raise InputError(run_dir, "--overwrite", "--resume continues this run directory and "
                                                 "--overwrite replaces it: give one of them")
    if resume:
        return
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(run_dir, "--run-dir", "is a file; expected a run directory")
    found = run_outputs(run_dir)
    if not found:
        return
    if not overwrite:
        names = ", ".join(p.name for p in found)
        raise InputError(run_dir, "--run-dir", f"already holds a run ({names}); continue it "
                         "with --resume, replace it with --overwrite, or give another --run-dir")
    if remove:
        for p in found:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
