"""Search parameters of AlphaFold2 and AlphaFold3, as presets (HMMER option names).

Sources (parameters only; no code is taken from them):

* AF2: ``alphafold/data/tools/jackhmmer.py`` (``Jackhmmer.__init__`` defaults: one iteration,
  ``-E``/``--incE`` 1e-4, filters ``--F1 0.0005 --F2 0.00005 --F3 0.0000005``),
  ``alphafold/data/pipeline.py`` (``uniref_max_hits=10000``, ``mgnify_max_hits=501``; the
  small-BFD jackhmmer result is not truncated), ``alphafold/data/pipeline_multimer.py``
  (``uniprot_max_hits=50000``, UniProt hits used for pairing only) and
  ``alphafold/data/tools/hmmsearch.py`` (``--F1 0.1 --F2 0.1 --F3 0.1 --incE 100 -E 100
  --domE 100 --incdomE 100``; the profile built by ``hmmbuild --hand --amino`` from the UniRef90
  alignment).
* AF3: ``src/alphafold3/data/pipeline.py`` (``DataPipeline.__init__``: jackhmmer one
  iteration, e-value 1e-4, ``max_sequences`` UniRef90 10000, MGnify 5000, small BFD 5000,
  UniProt 50000 for pairing; nhmmer e-value 1e-3 and 10000 sequences for Rfam, RNAcentral and
  NT-RNA; hmmsearch as AF2) and ``src/alphafold3/data/tools/nhmmer.py`` (``--F3 0.00005``,
  ``0.02`` for queries under 50 nucleotides, top strand only: ``--watson``). AF3 merges the
  unpaired protein MSAs in the order UniRef90, small BFD, MGnify (RNA: Rfam, RNAcentral,
  NT-RNA) with deduplication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DatabasePreset", "HmmsearchParams", "JackhmmerParams", "NhmmerParams", "PRESETS",
           "Preset"]


@dataclass(frozen=True)
class JackhmmerParams:
    """jackhmmer options (one iteration: AF2 and AF3 both run ``-N 1``)."""

    e_value: float = 1e-4        # -E
    inc_e: float = 1e-4          # --incE
    f1: float = 0.0005           # --F1
    f2: float = 0.00005          # --F2
    f3: float = 0.0000005        # --F3
    z_value: float | None = None  # -Z / --domZ (database size in sequences); None: counted


@dataclass(frozen=True)
class NhmmerParams:
    """nhmmer options (AF3 ``nhmmer.py``)."""

    e_value: float = 1e-3        # -E
    inc_e: float = 1e-3          # --incE
    f3: float = 0.00005          # --F3
    f3_short: float = 0.02       # --F3 for queries shorter than short_query
    short_query: int = 50
    watson: bool = True          # --watson: the top strand only
    z_value: float | None = None  # -Z in megabases; None: counted


@dataclass(frozen=True)
class HmmsearchParams:
    """hmmsearch options of the template search (AF2 ``hmmsearch.py``, AF3 ``pipeline.py``)."""

    e_value: float = 100.0       # -E
    inc_e: float = 100.0         # --incE
    dom_e: float = 100.0         # --domE
    incdom_e: float = 100.0      # --incdomE
    f1: float = 0.1
    f2: float = 0.1
    f3: float = 0.1


@dataclass(frozen=True)
class DatabasePreset:
    """What a preset does with a database of a given name."""

    molecule: str                # 'protein' (jackhmmer) | 'rna' / 'dna' (nhmmer)
    max_hits: int | None         # rows kept (after the query); None: all
    pairing: bool = False        # hits used to pair chains by species, not as unpaired rows


@dataclass(frozen=True)
class Preset:
    name: str
    databases: dict[str, DatabasePreset]
    order: tuple[str, ...]       # merge order of unpaired MSAs (deduplicated in this order)
    jackhmmer: JackhmmerParams = field(default_factory=JackhmmerParams)
    nhmmer: NhmmerParams = field(default_factory=NhmmerParams)
    hmmsearch: HmmsearchParams = field(default_factory=HmmsearchParams)
    template_profile_max_rows: int | None = 10000  # rows of the MSA the template HMM is built on


PRESETS: dict[str, Preset] = {
    "af2": Preset(
        name="af2",
        databases={
            "uniref90": DatabasePreset("protein", 10000),
            "mgnify": DatabasePreset("protein", 501),
            "small_bfd": DatabasePreset("protein", None),
            "uniprot": DatabasePreset("protein", 50000, pairing=True),
        },
        order=("uniref90", "small_bfd", "mgnify"),
    ),
    "af3": Preset(
        name="af3",
        databases={
            "uniref90": DatabasePreset("protein", 10000),
            "mgnify": DatabasePreset("protein", 5000),
            "small_bfd": DatabasePreset("protein", 5000),
            "uniprot": DatabasePreset("protein", 50000, pairing=True),
            "rfam": DatabasePreset("rna", 10000),
            "rnacentral": DatabasePreset("rna", 10000),
            "nt_rna": DatabasePreset("rna", 10000),
        },
        order=("uniref90", "small_bfd", "mgnify", "rfam", "rnacentral", "nt_rna"),
    ),
}
