"""Protein MSA search: jackhmmer (one iteration, as AF2 and AF3 run it) through pyhmmer."""

from __future__ import annotations

from .database import Database, alphabet_for
from .hits import A3mRow, rows_from_hits
from .presets import JackhmmerParams

__all__ = ["jackhmmer_rows"]


def jackhmmer_rows(query: str, database: Database, params: JackhmmerParams) -> list[A3mRow]:
    """Included domains of ``query`` against ``database``, best first, as A3M rows."""
    from pyhmmer import easel, hmmer

    alphabet = alphabet_for("protein")
    seq = easel.TextSequence(name="query", sequence=query).digitize(alphabet)
    options = {"E": params.e_value, "incE": params.inc_e, "F1": params.f1, "F2": params.f2,
               "F3": params.f3}
    if params.z_value is not None:
        options.update(Z=params.z_value, domZ=params.z_value)
    result = next(hmmer.jackhmmer(seq, database.block, max_iterations=1, cpus=1, **options))
    return rows_from_hits(result.hits, len(query))
