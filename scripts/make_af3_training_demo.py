"""Cut the few real files the AF3 training-data tests need from the shared test data.

    python scripts/make_af3_training_demo.py first-model SRC.cif OUT.cif
    python scripts/make_af3_training_demo.py head-sto SRC.sto OUT.sto N

``first-model``: an NMR mmCIF with only the ``_atom_site`` rows of model 1 (every other line
byte for byte), so that a 20-model ensemble used as a template (fold-data reads model 1 only)
costs a twentieth of its size. ``head-sto``: a Stockholm alignment's first ``N`` sequences (the
query and the ``N - 1`` best hits, in HMMER's order): their ``#=GS`` / ``#=GR`` / sequence lines
and every ``#=GF`` / ``#=GC`` line, unchanged.

How these were made from OpenFold's test data (``/work/shared/data/openfold-testdata``;
Apache-2.0, the coordinates wwPDB CC0): ``data/demo/template_mmcifs/2crb.cif`` (model 1 of
2CRB), ``data/demo/af3/pairing/*.sto`` (UniProt hits of 4ZEY A and 4I6P A, first 80 sequences)
and ``data/demo/af3/template_hits/4i6p_A_hmm_output.sto`` (first 10 hits).
"""

from __future__ import annotations

import sys
from pathlib import Path


def first_model(src: str, out: str) -> None:
    lines = Path(src).read_text().splitlines(keepends=True)
    columns: list[str] = []
    kept = []
    in_loop = in_rows = False
    for line in lines:
        if line.startswith("loop_"):
            in_loop, in_rows, columns = True, False, []
        elif in_loop and line.startswith("_atom_site."):
            columns.append(line.split()[0])
            kept.append(line)
            continue
        elif in_loop and columns and not line.startswith("_"):
            in_rows = not line.startswith("#")
            if in_rows:
                model = line.split()[columns.index("_atom_site.pdbx_PDB_model_num")]
                if model != "1":
                    continue
            else:
                in_loop, columns = False, []
        elif in_loop and line.startswith("_"):
            in_loop = False  # another category's loop
        kept.append(line)
    Path(out).write_text("".join(kept))


def head_sto(src: str, out: str, n: int) -> None:
    lines = Path(src).read_text().splitlines(keepends=True)
    names: list[str] = []
    for line in lines:  # sequence names in order of first appearance
        if line.strip() and not line.startswith(("#", "//")):
            name = line.split()[0]
            if name not in names:
                names.append(name)
    keep = set(names[:n])
    kept = []
    for line in lines:
        if line.startswith(("#=GS", "#=GR")):
            if line.split()[1] in keep:
                kept.append(line)
        elif line.strip() and not line.startswith(("#", "//")):
            if line.split()[0] in keep:
                kept.append(line)
        else:
            kept.append(line)
    Path(out).write_text("".join(kept))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "first-model":
        first_model(*args)
    elif command == "head-sto":
        head_sto(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(__doc__)
