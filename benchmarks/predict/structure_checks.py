"""The coordinate terms of AF3's ranking score after a long prediction, on CPU: ``has_clash`` and
``fraction_disordered`` (``fold_train.structure_checks``, called as ``fold-train predict``'s
``structure_scores`` calls them) with close atoms found by a cell list (``cells``, the default)
and by every pair (``all``, the reference and the search before the cell list).

The structures are real: the bundled 3U8V (X-ray homodimer) read as ``fold-train predict`` reads
its own output (``structure_atoms``), copied onto a cubic grid 4 A apart until the atom count
is reached, so the density is a folded protein's: joined into one long chain (``one chain``:
the long single-sequence prediction), or each copy its own two chains (``copies``: a complex).
Each contender's median of ``--repeats`` runs is reported (one process, after a warm-up); the
two must give the same results, which the script checks. ``all`` is skipped above ``--all-max``
atoms (its time grows as ``A^2``).

    python -m benchmarks.predict.structure_checks [--atoms 10000 49000 100000] [--all-max N]
        [--layouts "one chain" copies] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common.machine import host_info
from benchmarks.common.results import REPO, RESULTS, write_result

SOURCE = REPO / "data" / "demo" / "mmcifs" / "3u8v.cif"
GAP = 4.0  # A between neighbouring copies' bounding boxes
LAYOUTS = ("one chain", "copies")


def tiled_atoms(n_atoms: int, one_chain: bool) -> dict:
    """``structure_atoms`` of 3U8V's polymer atoms, copied on a grid to ``>= n_atoms`` atoms:
    each copy its own two chains (a complex), or every copy's chains joined into one chain
    (a long single-chain prediction, as ``fold-train predict`` of one 6144-residue sequence)."""
    import gemmi
    from fold_train.confidence_outputs import structure_atoms

    one = structure_atoms(gemmi.read_structure(str(SOURCE)))
    keep = one["polymer"]
    pos, chain, residue = one["positions"][keep], one["chain"][keep], one["residue"][keep]
    n_chains = len(one["chain_ids"])
    copies = -(-n_atoms // len(pos))
    side = int(np.ceil(copies ** (1 / 3)))
    step = pos.max(0) - pos.min(0) + GAP  # [3]
    grid = np.stack(np.unravel_index(np.arange(copies), (side,) * 3), -1)  # [copies, 3]
    positions = (pos[None] + (grid * step)[:, None, :]).reshape(-1, 3)  # [copies * a, 3]
    tile = lambda a: np.tile(a[keep], copies)  # noqa: E731
    copy = np.repeat(np.arange(copies), len(pos))  # [copies * a]
    if one_chain:
        names = [n for c in range(n_chains) for n in one["res_names"][c]]  # one copy's residues
        first = np.cumsum([0] + [len(one["res_names"][c]) for c in range(n_chains)])[:-1]
        out_chain = np.zeros(len(positions), int)
        out_residue = copy * len(names) + np.tile(first[chain] + residue, copies)
        res_names = {0: names * copies}
    else:
        out_chain = copy * n_chains + np.tile(chain, copies)
        out_residue = np.tile(residue, copies)
        res_names = {k * n_chains + c: one["res_names"][c] for k in range(copies)
                     for c in range(n_chains)}
    return {"positions": positions, "chain": out_chain, "residue": out_residue,
            "polymer": tile(one["polymer"]), "protein": tile(one["protein"]),
            "atom_names": tile(one["atom_names"]), "res_names": res_names}


def timed(fn, repeats: int):
    """``fn()``'s value and its median wall and process CPU times over ``repeats`` calls (s):
    on a shared machine the CPU time is the steadier of the two."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        value = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return value, statistics.median(wall), statistics.median(cpu)


def measure(atoms: dict, neighbours: str, repeats: int = 1) -> dict:
    """``has_clash`` and ``fraction_disordered`` of ``atoms`` as ``structure_scores`` calls them."""
    from fold_train.structure_checks import fraction_disordered, has_clash

    clash, t_clash, c_clash = timed(lambda: has_clash(
        atoms["positions"], atoms["chain"], atoms["residue"], atoms["polymer"],
        neighbours=neighbours), repeats)
    disorder, t_disorder, c_disorder = timed(lambda: fraction_disordered(
        atoms["positions"], atoms["chain"], atoms["residue"], atoms["protein"],
        atoms["atom_names"], atoms["res_names"], neighbours=neighbours), repeats)
    return {"has_clash": bool(clash), "fraction_disordered": disorder,
            "has_clash_s": t_clash, "fraction_disordered_s": t_disorder,
            "has_clash_cpu_s": c_clash, "fraction_disordered_cpu_s": c_disorder}


def run(args) -> dict:
    warm = tiled_atoms(min(args.atoms), True)
    for neighbours in ("cells", "all"):  # warm-up: imports, the allocator's first big blocks
        measure(warm, neighbours)
    rows = []
    for layout in args.layouts:
        for n in args.atoms:
            atoms = tiled_atoms(n, layout == "one chain")
            row = {"layout": layout, "atoms": len(atoms["positions"]),
                   "chains": len(atoms["res_names"])}
            for neighbours in ("cells", "all"):
                if neighbours == "all" and row["atoms"] > args.all_max:
                    continue
                row[neighbours] = measure(atoms, neighbours, args.repeats)
                print(layout, row["atoms"], neighbours, row[neighbours], flush=True)
            if "all" in row:
                for key in ("has_clash", "fraction_disordered"):
                    if row["all"][key] != row["cells"][key]:
                        raise SystemExit(f"{key} differs ({layout}, {row['atoms']} atoms): "
                                         f"cells {row['cells'][key]}, all {row['all'][key]}")
            rows.append(row)
    return {"benchmark": "predict.structure_checks", "source": SOURCE.relative_to(REPO).as_posix(),
            "repeats": args.repeats, **host_info(), "rows": rows}


def markdown(doc: dict) -> str:
    lines = [
        "# has_clash and fraction_disordered: cell list against every pair (CPU)",
        "",
        f"{doc['cpu']} ({doc['usable_cpus']} usable CPUs), numpy {doc['versions']['numpy']}, "
        f"torch {doc['versions']['torch']}, {doc['date']}. Structures: `{doc['source']}` copied "
        f"on a grid {GAP:g} A apart (polymer atoms only), as one chain or as copies of its two "
        "chains. Seconds of wall time (process CPU time), the median of "
        f"{doc['repeats']} runs each; `-`: not run.",
        "",
        "| layout | atoms | chains | has_clash cells | has_clash all | fraction_disordered "
        "cells | fraction_disordered all | speed-up (both, CPU time) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        c, a = r["cells"], r.get("all")

        def fmt(d, k):
            return f"{d[k + '_s']:.3f} ({d[k + '_cpu_s']:.3f})" if d else "-"

        total = lambda d: d["has_clash_cpu_s"] + d["fraction_disordered_cpu_s"]  # noqa: E731
        speed = f"{total(a) / total(c):.1f}x" if a else "-"
        lines.append(f"| {r['layout']} | {r['atoms']} | {r['chains']} | "
                     f"{fmt(c, 'has_clash')} | {fmt(a, 'has_clash')} | "
                     f"{fmt(c, 'fraction_disordered')} | {fmt(a, 'fraction_disordered')} | "
                     f"{speed} |")
    lines += ["", "Where both ran, the two gave the same has_clash and fraction_disordered.",
              "", "Reproduce: `python -m benchmarks.predict.structure_checks`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--atoms", type=int, nargs="+", default=[10_000, 49_000, 100_000])
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    p.add_argument("--all-max", type=int, default=50_000,
                   help="largest structure the all-pairs search runs on")
    p.add_argument("--repeats", type=int, default=3, help="runs of each, median reported")
    p.add_argument("--out", type=Path, default=RESULTS / "predict")
    args = p.parse_args(argv)
    doc = run(args)
    md = markdown(doc)
    write_result(args.out / "structure_checks.json", doc, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
