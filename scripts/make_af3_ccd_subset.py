"""Write a few Chemical Component Dictionary entries from biotite's CCD as a small mmCIF file.

    python scripts/make_af3_ccd_subset.py OUT.cif CODE [CODE ...]

How ``data/demo/af3/ccd.cif`` was made (the 20 standard amino acids and FK5), so that the AF3
demo and tests featurise 3O5R without biotite's 63 MB dictionary. Only the columns that
``fold_data.af3.ccd`` reads are written; every value is copied from the CCD unchanged.
"""

from __future__ import annotations

import sys

import gemmi

COLUMNS = {
    "chem_comp": ["id", "name", "type", "mon_nstd_parent_comp_id"],
    "chem_comp_atom": ["comp_id", "atom_id", "type_symbol", "charge", "pdbx_leaving_atom_flag",
                       "pdbx_aromatic_flag", "model_Cartn_x", "model_Cartn_y", "model_Cartn_z",
                       "pdbx_model_Cartn_x_ideal", "pdbx_model_Cartn_y_ideal",
                       "pdbx_model_Cartn_z_ideal"],
    "chem_comp_bond": ["comp_id", "atom_id_1", "atom_id_2", "value_order", "pdbx_aromatic_flag"],
}


def main(out: str, codes: list[str]) -> None:
    from biotite.structure.io.pdbx import BinaryCIFFile
    from fold_data.af3.ccd import biotite_ccd_path

    block = BinaryCIFFile.read(str(biotite_ccd_path())).block
    cols = {cat: {c: block[cat][c].as_array(str, masked_value="?") for c in names}
            for cat, names in COLUMNS.items()}
    doc = gemmi.cif.Document()
    for code in codes:
        b = doc.add_new_block(code)
        for cat, names in COLUMNS.items():
            key = cols[cat]["id" if cat == "chem_comp" else "comp_id"]
            rows = [i for i in range(len(key)) if key[i] == code]
            if cat == "chem_comp" and not rows:
                raise SystemExit(f"{code}: not in biotite's CCD")
            loop = b.init_loop(f"_{cat}.", names)
            for i in rows:
                loop.add_row([gemmi.cif.quote(str(cols[cat][c][i])) for c in names])
    doc.write_file(out)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], [c.upper() for c in sys.argv[2:]])
