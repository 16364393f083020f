"""Build the small sequence databases that fold-data's search tests bundle.

    python scripts/make_search_test_data.py /work/shared/data packages/fold-data/tests/search/data

Every sequence is real (see /work/shared/data/README.md for the sources and licences):

* ``uniprot_mini.fasta.gz``: UniProt hits of the jackhmmer runs that OpenFold ships for
  4ZEY chain A (NRBF2), 4I6P chain A (Par-3) and 3U8V chain A (SmbP), the residues of each
  Stockholm row (the hit's aligned segment), written as UniProt FASTA headers
  (``>tr|ACC|NAME_SPECIES description OS=... OX=...``), gzipped. For 4ZEY and 4I6P: the first
  15 hits and up to 2 more of each of 12 species that both chains' hits have (so that a
  two-chain search has rows to pair); for 3U8V the first 40.
* ``sources.tsv``: database, record name, the chain whose search found it.
* ``uniref90_mini.fasta``: UniRef90 hits of the same runs for 4ZEY and 4I6P (UniRef headers,
  ``TaxID=``), plain FASTA.
* ``pdb_seqres_mini.txt``: the full entity sequences of every polymer chain of the mmCIFs in
  ``openfold-testdata/mmcifs`` and ``af3-examples/biotite-structures``, in the RCSB
  ``pdb_seqres.txt`` layout (``>4i6p_A mol:protein length:88  TITLE``).
* ``rna_mini.fasta``: the nucleic-acid chains of the same mmCIFs (RNA of 4P5J, the DNA strands
  of 2Q2K and 5UGO).
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import gemmi
from fold_data.msa import read_stockholm_alignment, species_id

PER_CHAIN = 40  # hits kept per (chain, database)


def _rows(sto: Path, limit: int) -> list[tuple[str, str]]:
    """(header, residues) of the first ``limit`` hit rows (the query row skipped)."""
    ali = read_stockholm_alignment(sto)
    out = []
    for name in list(ali.rows)[1:limit + 1]:
        residues = "".join(c for c in ali.rows[name] if c.isalpha()).upper()
        desc = ali.gs.get(name, {}).get("DE", "").replace("[subseq from] ", "")
        out.append((f"{name.split('/')[0]} {desc}".strip(), residues))
    return out


def _write_fasta(records: list[tuple[str, str]], path: Path) -> None:
    text = "".join(f">{h}\n" + "\n".join(s[i:i + 60] for i in range(0, len(s), 60)) + "\n"
                   for h, s in records)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def _dedup(records: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    for header, seq in records:
        name = header.split()[0]
        if name not in seen:
            seen.add(name)
            out.append((header, seq))
    return out


def _pairable(ali: Path) -> dict[str, list[tuple[str, str]]]:
    """For 4ZEY A and 4I6P A: the first 15 hits, then up to 2 hits of each of the first 12
    species (in 4ZEY's hit order) that both chains' hits have."""
    rows = {c: _rows(ali / c / "uniprot_hits.sto", 10_000) for c in ("4zey_A", "4i6p_A")}
    in_b = {species_id(h) for h, _ in rows["4i6p_A"]} - {""}
    chosen = list(dict.fromkeys(s for h, _ in rows["4zey_A"]
                                if (s := species_id(h)) in in_b))[:12]
    out = {}
    for c, r in rows.items():
        picked = r[:15]
        for sp in chosen:
            picked += [x for x in r[15:] if species_id(x[0]) == sp][:2]
        out[c] = picked
    return out


def main(shared: Path, out: Path) -> None:
    ali = shared / "openfold-testdata" / "alignments"
    picked = _pairable(ali)
    picked["3u8v_A"] = _rows(ali / "3u8v_A" / "uniprot_hits.sto", PER_CHAIN)
    sources = []
    uniprot = []
    for chain, records in picked.items():
        for record in records:
            uniprot.append(record)
            sources.append(("uniprot_mini", record[0].split()[0], chain))
    _write_fasta(_dedup(uniprot), out / "uniprot_mini.fasta.gz")
    uniref = []
    for chain in ("4zey_A", "4i6p_A"):
        for record in _rows(ali / chain / "uniref90_hits.sto", 30):
            uniref.append(record)
            sources.append(("uniref90_mini", record[0].split()[0], chain))
    _write_fasta(_dedup(uniref), out / "uniref90_mini.fasta")
    (out / "sources.tsv").write_text("database\tname\tfound_for\n" + "".join(
        f"{d}\t{n}\t{c}\n" for d, n, c in dict.fromkeys(sources)))
    seqres, nucleic = [], []
    cifs = sorted((shared / "openfold-testdata" / "mmcifs").glob("*.cif")) + sorted(
        (shared / "af3-examples" / "biotite-structures").glob("*.cif"))
    for cif in cifs:
        st = gemmi.read_structure(str(cif))
        st.setup_entities()
        for entity in st.entities:
            if entity.entity_type != gemmi.EntityType.Polymer or not entity.full_sequence:
                continue
            kind = entity.polymer_type
            mol = "protein" if kind == gemmi.PolymerType.PeptideL else "na"
            seq = gemmi.one_letter_code([gemmi.Entity.first_mon(m) for m in
                                         entity.full_sequence]).upper()
            seq = seq.replace("(", "").replace(")", "")
            for chain_id in dict.fromkeys(sub.split(".")[0] for sub in entity.subchains):
                auth = next((ch.name for ch in st[0] for sub in [ch.get_polymer()]
                             if sub and sub.subchain_id() == chain_id), chain_id)
                if mol == "na":  # modified nucleotides: N, which nucleotide alphabets have
                    seq = seq.replace("X", "N")
                title = st.info["_struct.title"] if "_struct.title" in st.info else entity.name
                header = f"{st.name.lower()}_{auth} mol:{mol} length:{len(seq)}  {title}"
                seqres.append((header, seq))
                if mol == "na":
                    nucleic.append((header, seq))
    _write_fasta(seqres, out / "pdb_seqres_mini.txt")
    _write_fasta(nucleic, out / "rna_mini.fasta")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
