"""RNA / DNA MSA search: nhmmer through pyhmmer, with AF3's parameters."""

from __future__ import annotations

from .database import Database, alphabet_for
from .hits import A3mRow, rows_from_hits
from .presets import NhmmerParams

__all__ = ["nhmmer_rows"]


def nhmmer_rows(query: str, molecule: str, database: Database,
                params: NhmmerParams) -> list[A3mRow]:
    """Included hits of ``query`` (``molecule`` 'rna' or 'dna') against ``database``, best first,
    as A3M rows in the query's letters (RNA rows with U, DNA rows with T)."""
    from pyhmmer import easel, hmmer

    alphabet = alphabet_for(molecule)
    seq = easel.TextSequence(name="query", sequence=query).digitize(alphabet)
    f3 = params.f3_short if len(query) < params.short_query else params.f3
    options = {"E": params.e_value, "incE": params.inc_e, "F3": f3}
    if params.watson:
        options["strand"] = "watson"
    if params.z_value is not None:
        options["Z"] = params.z_value
    if database.molecule != molecule:  # an RNA query against a DNA-letter database, or back
        block = easel.DigitalSequenceBlock(alphabet, [
            easel.TextSequence(name=s.name, description=s.description,
                               sequence=s.textize().sequence).digitize(alphabet)
            for s in database.block])
    else:
        block = database.block
    hits = next(hmmer.nhmmer(seq, block, cpus=1, **options))
    rows = rows_from_hits(hits, len(query))
    swap = str.maketrans("Tt", "Uu") if molecule == "rna" else str.maketrans("Uu", "Tt")
    return [A3mRow(r.name, r.description, r.row.translate(swap), r.evalue) for r in rows]
