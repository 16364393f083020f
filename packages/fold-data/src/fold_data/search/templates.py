"""Template search: hmmsearch of the query's MSA profile against a PDB SEQRES database.

As AF2 / AF3: an HMM is built from the chain's MSA (``hmmbuild --hand``: one match state per
query residue, the query's columns marked in the reference line), searched against the SEQRES
FASTA (``pdb_seqres.txt``: ``>1abc_A mol:protein length:N  TITLE``) with the hmmsearch preset,
and the included domains written as hmmsearch's Stockholm (``hmm_output.sto``, names
``<pdb>_<chain>/<start>-<end>``), the file :func:`fold_data.template_hits.parse_hmmsearch_sto`
reads. With ``max_template_date``, hits whose structure was released after it are dropped; the
release date is the earliest ``_pdbx_audit_revision_history.revision_date`` of the hit's mmCIF in
``mmcif_dir`` (hits without a readable mmCIF there are dropped too: their date is unknown and
fold-data cannot featurize them).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from fold_data.errors import InputError

from .database import Database, alphabet_for
from .presets import HmmsearchParams

__all__ = ["build_profile", "release_date", "template_search"]


def build_profile(query: str, aligned_rows: list[str]):
    """A pyhmmer HMM with one match state per query residue, built from the query and rows of
    the query's length (``-`` for gaps; a3m insertions removed)."""
    from pyhmmer import easel, plan7

    alphabet = alphabet_for("protein")
    seqs = [easel.TextSequence(name="query", sequence=query)]
    seqs += [easel.TextSequence(name=f"row{i}", sequence=row)
             for i, row in enumerate(aligned_rows) if len(row) == len(query)]
    msa = easel.TextMSA(name=b"query", sequences=seqs)
    msa.reference = "x" * len(query)
    builder = plan7.Builder(alphabet, architecture="hand")
    hmm, _, _ = builder.build_msa(msa.digitize(alphabet), plan7.Background(alphabet))
    return hmm


def release_date(mmcif_dir: str | os.PathLike, pdb_id: str) -> str | None:
    """Earliest revision date (YYYY-MM-DD) of ``<mmcif_dir>/<pdb_id>.cif[.gz]``, None when the
    file is missing or has no date."""
    import gemmi

    for name in (pdb_id.lower(), pdb_id.upper()):
        for suffix in (".cif", ".cif.gz"):
            path = Path(mmcif_dir) / f"{name}{suffix}"
            if path.is_file():
                try:
                    block = gemmi.cif.read(os.fspath(path)).sole_block()
                except (RuntimeError, ValueError, IndexError):
                    return None
                dates = list(block.find_values("_pdbx_audit_revision_history.revision_date"))
                return min(dates) if dates else None
    return None


def template_search(query: str, aligned_rows: list[str], seqres: Database,
                    params: HmmsearchParams, *, max_template_date: str | None = None,
                    mmcif_dir: str | os.PathLike | None = None) -> tuple[str, int]:
    """``(Stockholm text, number of hits kept)`` of the hmmsearch template hits."""
    from pyhmmer import hmmer

    if max_template_date is not None and mmcif_dir is None:
        raise InputError(None, "templates", "max_template_date needs mmcif_dir (the hits' "
                         "release dates are read from their mmCIFs)")
    hmm = build_profile(query, aligned_rows)
    hits = next(hmmer.hmmsearch(
        hmm, seqres.block, cpus=1, E=params.e_value, incE=params.inc_e, domE=params.dom_e,
        incdomE=params.incdom_e, F1=params.f1, F2=params.f2, F3=params.f3))
    dates: dict[str, str | None] = {}
    kept = 0
    for hit in hits:
        if not hit.included:
            continue
        if max_template_date is not None:
            pdb_id = hit.name.split("_")[0]
            if pdb_id not in dates:
                dates[pdb_id] = release_date(mmcif_dir, pdb_id)
            date = dates[pdb_id]
            if date is None or date > max_template_date:
                hit.included = False
                continue
        kept += 1
    if kept == 0:  # hmmsearch writes no alignment for no hits; an empty hits file is valid
        return _empty_sto(query), 0
    msa = hits.to_msa(alphabet_for("protein"), trim=True, all_consensus_cols=True)
    out = io.BytesIO()
    msa.write(out, "stockholm")
    return out.getvalue().decode(), kept


def _empty_sto(query: str) -> str:
    """hmmsearch's Stockholm with the query alone (no hits), which the hits parser reads."""
    return (f"# STOCKHOLM 1.0\n\nquery {query}\n#=GC RF {'x' * len(query)}\n//\n")
