"""Shared by the search tests: the small real databases bundled in ``data/`` (built by
``scripts/make_search_test_data.py`` from /work/shared/data) and real query chains from the
repository's demo mmCIFs. A uniquely named module: the tests import it, not a conftest (several
test folders have one)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
REPO = HERE.parents[3]
MMCIFS = REPO / "data" / "demo" / "mmcifs"
UNIPROT = DATA / "uniprot_mini.fasta.gz"
UNIREF = DATA / "uniref90_mini.fasta"
SEQRES = DATA / "pdb_seqres_mini.txt"
NUCLEIC = DATA / "rna_mini.fasta"


def sources(database: str, chain: str) -> set[str]:
    """Record names of a bundled database that OpenFold's search for ``chain`` found."""
    lines = (DATA / "sources.tsv").read_text().splitlines()[1:]
    return {n for d, n, c in (line.split("\t") for line in lines) if d == database and c == chain}


def chain_sequence(pdb: str, chain: str) -> str:
    from fold_data.mmcif import parse_mmcif

    return parse_mmcif(MMCIFS / f"{pdb}.cif").get_chain(chain).sequence


def write_config(tmp: Path, *, preset: str = "af3", templates: str = "",
                 databases: dict[str, Path] | None = None) -> Path:
    databases = databases or {"uniref90": UNIREF, "uniprot": UNIPROT}
    lines = [f'preset = "{preset}"']
    for name, path in databases.items():
        lines += [f"[databases.{name}]", f'path = "{path}"']
    if templates:
        lines.append(templates)
    path = tmp / "search.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
