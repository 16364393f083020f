"""The Chemical Component Dictionary (CCD): one entry per residue / ligand code.

Sources, looked up in order (the first that has a code wins):

1. user-given CCD files in mmCIF (a full ``components.cif``, single-entry files like
   ``af3-examples/ccd-components/TYR.cif``, or the ``userCCD`` text of an AF3 input JSON), read
   with gemmi;
2. biotite's shipped CCD (``biotite/structure/info/components.bcif``, BinaryCIF, ~63 MB), read
   once per process and only the columns needed here, with an index ``code -> row range`` so a
   lookup is a slice, not a scan.

:func:`default_ccd` is the per-process CCD (biotite, loaded lazily on the first lookup). A
:class:`ChemComp` is a plain, immutable record of one component: atoms (names, elements,
charges, leaving/aromatic flags, ideal and model coordinates) and bonds (orders, aromaticity).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gemmi
import numpy as np

from fold_data.errors import InputError

__all__ = ["ChemComp", "Ccd", "CcdUnavailable", "default_ccd", "biotite_ccd_path"]

_BOND_ORDERS = {"SING": 1, "DOUB": 2, "TRIP": 3, "QUAD": 4, "AROM": 1, "DELO": 1, "PI": 1}


class CcdUnavailable(RuntimeError):
    """No CCD source holds the requested code and the full CCD (biotite) cannot be loaded."""


@dataclass(frozen=True)
class ChemComp:
    """One CCD component. Atom arrays have length ``N_comp_atom`` (hydrogens included, CCD order).

    ``ideal_positions`` / ``model_positions`` [N_comp_atom, 3] float64 are NaN where the CCD has
    no value; ``bonds`` [N_comp_bond, 2] int32 index the atom arrays; ``bond_orders`` 1-4
    (Kekule orders as the CCD gives them) and ``bond_aromatic`` bool.
    """

    code: str
    name: str
    type: str  # _chem_comp.type, upper case ('L-PEPTIDE LINKING', 'DNA LINKING', 'NON-POLYMER')
    parent: str | None  # mon_nstd_parent_comp_id (modified residues), None when '?'
    atom_names: tuple[str, ...]
    elements: tuple[str, ...]  # type_symbol, upper case as in the CCD ('C', 'CL', 'SE')
    charges: np.ndarray  # [N_comp_atom] int32 formal charge
    leaving: np.ndarray  # [N_comp_atom] bool pdbx_leaving_atom_flag
    aromatic: np.ndarray  # [N_comp_atom] bool pdbx_aromatic_flag
    ideal_positions: np.ndarray
    model_positions: np.ndarray
    bonds: np.ndarray
    bond_orders: np.ndarray
    bond_aromatic: np.ndarray
    source: str  # where it came from (file path or 'biotite <version>')

    @property
    def num_atoms(self) -> int:
        return len(self.atom_names)

    @property
    def is_hydrogen(self) -> np.ndarray:
        """[N_comp_atom] bool: H or D atoms (AF3 models heavy atoms only)."""
        return np.asarray([e in ("H", "D") for e in self.elements], dtype=bool)

    def atom_index(self, name: str) -> int | None:
        try:
            return self.atom_names.index(name)
        except ValueError:
            return None

    def neighbours(self, atom: int) -> list[int]:
        """Indices of the atoms bonded to ``atom``."""
        b = self.bonds
        return [int(j) for j in b[b[:, 0] == atom, 1]] + [int(i) for i in b[b[:, 1] == atom, 0]]


def _flag(values: Iterable[str]) -> np.ndarray:
    return np.asarray([str(v).upper() == "Y" for v in values], dtype=bool)


def _parent(value: str) -> str | None:
    value = str(value).strip()
    return None if value in ("", "?", ".") else value.upper()


def _coords(columns: list) -> np.ndarray:
    out = np.full((len(columns[0]), 3), np.nan)
    for k, col in enumerate(columns):
        for i, v in enumerate(col):
            try:
                out[i, k] = float(v)
            except (TypeError, ValueError):
                pass  # '?' or '.': no coordinate
    return out


def _comp_from_block(block: gemmi.cif.Block, source: str) -> ChemComp:
    """A :class:`ChemComp` from one mmCIF data block (``data_XXX``) of a CCD file."""
    code = gemmi.cif.as_string(block.find_value("_chem_comp.id") or block.name).upper()
    where = f"component {code}"
    atoms = block.find(
        "_chem_comp_atom.",
        ["atom_id", "type_symbol", "?charge", "?pdbx_leaving_atom_flag", "?pdbx_aromatic_flag",
         "?pdbx_model_Cartn_x_ideal", "?pdbx_model_Cartn_y_ideal", "?pdbx_model_Cartn_z_ideal",
         "?model_Cartn_x", "?model_Cartn_y", "?model_Cartn_z"],
    )
    if len(atoms) == 0:
        raise InputError(source, where, "no _chem_comp_atom rows (expected the atom list)")
    cols = [[gemmi.cif.as_string(r[i]) if r.has(i) else "?" for r in atoms] for i in range(11)]
    names = tuple(cols[0])
    index = {n: i for i, n in enumerate(names)}
    bond_rows = block.find(
        "_chem_comp_bond.", ["atom_id_1", "atom_id_2", "value_order", "?pdbx_aromatic_flag"]
    )
    bonds, orders, arom = [], [], []
    for r in bond_rows:
        a, b = gemmi.cif.as_string(r[0]), gemmi.cif.as_string(r[1])
        if a not in index or b not in index:
            raise InputError(source, where, f"bond {a}-{b} names an atom not in _chem_comp_atom")
        order = gemmi.cif.as_string(r[2]).upper()
        if order not in _BOND_ORDERS:
            raise InputError(source, where, f"bond {a}-{b} has value_order {order!r}; expected "
                             f"one of {sorted(_BOND_ORDERS)}")
        bonds.append((index[a], index[b]))
        orders.append(_BOND_ORDERS[order])
        arom.append(r.has(3) and gemmi.cif.as_string(r[3]).upper() == "Y")
    charges = []
    for v in cols[2]:
        try:
            charges.append(int(float(v)))
        except ValueError:
            charges.append(0)
    value = block.find_value
    return ChemComp(
        code=code,
        name=gemmi.cif.as_string(value("_chem_comp.name") or ""),
        type=gemmi.cif.as_string(value("_chem_comp.type") or "").upper(),
        parent=_parent(gemmi.cif.as_string(value("_chem_comp.mon_nstd_parent_comp_id") or "?")),
        atom_names=names,
        elements=tuple(e.upper() for e in cols[1]),
        charges=np.asarray(charges, dtype=np.int32),
        leaving=_flag(cols[3]),
        aromatic=_flag(cols[4]),
        ideal_positions=_coords(cols[5:8]),
        model_positions=_coords(cols[8:11]),
        bonds=np.asarray(bonds, dtype=np.int32).reshape(-1, 2),
        bond_orders=np.asarray(orders, dtype=np.int32),
        bond_aromatic=np.asarray(arom, dtype=bool),
        source=source,
    )


def read_ccd_cif(path_or_text: str | os.PathLike, *, is_text: bool = False) -> dict[str, ChemComp]:
    """Every component of an mmCIF CCD file (or text), keyed by code."""
    source = "<userCCD>" if is_text else os.fspath(path_or_text)
    try:
        doc = gemmi.cif.read_string(path_or_text) if is_text else gemmi.cif.read(source)
    except (RuntimeError, ValueError, OSError) as err:
        raise InputError(source, None, f"not a readable CCD mmCIF: {err}") from None
    comps = {}
    for block in doc:
        if block.find_value("_chem_comp.id") is None and not block.find_mmcif_category(
            "_chem_comp_atom."
        ):
            continue
        comp = _comp_from_block(block, source)
        comps[comp.code] = comp
    if not comps:
        raise InputError(source, None, "no _chem_comp blocks (expected CCD entries)")
    return comps


def biotite_ccd_path() -> Path | None:
    """Path of biotite's ``components.bcif``, or None when biotite is not installed."""
    try:
        import biotite.structure.info as info
    except ImportError:
        return None
    path = Path(info.__file__).parent / "components.bcif"
    return path if path.is_file() else None


class _BiotiteCcd:
    """Column arrays of biotite's BinaryCIF CCD plus a ``code -> (start, stop)`` row index."""

    def __init__(self, path: Path):
        import biotite
        from biotite.structure.io.pdbx import BinaryCIFFile

        self.source = f"biotite {biotite.__version__} ({path.name})"
        block = BinaryCIFFile.read(str(path)).block
        comp, atom, bond = block["chem_comp"], block["chem_comp_atom"], block["chem_comp_bond"]

        def strings(cat, name):
            return cat[name].as_array(str)

        def floats(name):
            return atom[name].as_array(np.float64, masked_value=np.nan)

        ids = strings(comp, "id")
        self.comp_row = {c: i for i, c in enumerate(ids)}
        self.comp_name = strings(comp, "name")
        self.comp_type = strings(comp, "type")
        self.comp_parent = strings(comp, "mon_nstd_parent_comp_id")
        atom_comp = strings(atom, "comp_id")
        self.atom_range = _ranges(atom_comp)
        self.atom_id = strings(atom, "atom_id")
        self.type_symbol = strings(atom, "type_symbol")
        self.charge = atom["charge"].as_array(np.int32, masked_value=0)
        self.leaving = strings(atom, "pdbx_leaving_atom_flag") == "Y"
        self.aromatic = strings(atom, "pdbx_aromatic_flag") == "Y"
        self.ideal = np.stack([floats(f"pdbx_model_Cartn_{c}_ideal") for c in "xyz"], axis=-1)
        self.model = np.stack([floats(f"model_Cartn_{c}") for c in "xyz"], axis=-1)
        self.bond_range = _ranges(strings(bond, "comp_id"))
        self.bond_a = strings(bond, "atom_id_1")
        self.bond_b = strings(bond, "atom_id_2")
        self.bond_order = strings(bond, "value_order")
        self.bond_arom = strings(bond, "pdbx_aromatic_flag") == "Y"

    def get(self, code: str) -> ChemComp | None:
        row = self.comp_row.get(code)
        if row is None:
            return None
        a0, a1 = self.atom_range.get(code, (0, 0))
        names = tuple(str(n) for n in self.atom_id[a0:a1])
        index = {n: i for i, n in enumerate(names)}
        b0, b1 = self.bond_range.get(code, (0, 0))
        pairs = [(index[str(a)], index[str(b)]) for a, b in
                 zip(self.bond_a[b0:b1], self.bond_b[b0:b1])]
        orders = [_BOND_ORDERS.get(str(o).upper(), 1) for o in self.bond_order[b0:b1]]
        return ChemComp(
            code=code,
            name=str(self.comp_name[row]),
            type=str(self.comp_type[row]).upper(),
            parent=_parent(self.comp_parent[row]),
            atom_names=names,
            elements=tuple(str(e).upper() for e in self.type_symbol[a0:a1]),
            charges=np.asarray(self.charge[a0:a1], dtype=np.int32),
            leaving=self.leaving[a0:a1].copy(),
            aromatic=self.aromatic[a0:a1].copy(),
            ideal_positions=self.ideal[a0:a1].copy(),
            model_positions=self.model[a0:a1].copy(),
            bonds=np.asarray(pairs, dtype=np.int32).reshape(-1, 2),
            bond_orders=np.asarray(orders, dtype=np.int32),
            bond_aromatic=self.bond_arom[b0:b1].copy(),
            source=self.source,
        )


def _ranges(codes: np.ndarray) -> dict[str, tuple[int, int]]:
    """``code -> (start, stop)`` of the runs of equal values (the CCD's rows are grouped)."""
    if len(codes) == 0:
        return {}
    change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [len(codes)]])
    return {str(codes[s]): (int(s), int(e)) for s, e in zip(starts, stops)}


class Ccd:
    """Component lookup over user CCD files and (optionally) biotite's full CCD.

    ``files``: mmCIF CCD files or directories of them (``*.cif``), searched before biotite;
    ``use_biotite``: fall back to biotite's shipped CCD (loaded lazily, once per instance).
    Lookups are memoized.
    """

    def __init__(self, files: Iterable[str | os.PathLike] = (), *, use_biotite: bool = True):
        self._user: dict[str, ChemComp] = {}
        self._files: list[str] = []
        for f in files:
            self.add_file(f)
        self.use_biotite = use_biotite
        self._biotite: _BiotiteCcd | None = None
        self._lock = threading.Lock()

    def add_file(self, path: str | os.PathLike) -> None:
        path = Path(path)
        paths = sorted(path.glob("*.cif")) if path.is_dir() else [path]
        for p in paths:
            if not p.is_file():
                raise InputError(p, None, "CCD file not found")
            self._user.update(read_ccd_cif(p))
            self._files.append(os.fspath(p))

    def add_text(self, text: str) -> None:
        """Add components from mmCIF text (the AF3 JSON's ``userCCD``)."""
        self._user.update(read_ccd_cif(text, is_text=True))

    def with_text(self, text: str | None) -> Ccd:
        """A CCD that also knows the components in ``text``, sharing this one's loaded data."""
        if not text:
            return self
        other = Ccd.__new__(Ccd)
        other.__dict__.update(self.__dict__)
        other._user = dict(self._user)
        other._files = list(self._files)
        other.add_text(text)
        return other

    @property
    def identity(self) -> str:
        """What this CCD is made of (cache keys include it: a different CCD, a different entry)."""
        parts = []
        for f in self._files:
            st = os.stat(f)
            parts.append(f"{Path(f).name}:{st.st_size}:{st.st_mtime_ns}")
        if self.use_biotite:
            path = biotite_ccd_path()
            parts.append(f"biotite:{path.stat().st_size}" if path else "biotite:absent")
        return ";".join(parts)

    def _full(self) -> _BiotiteCcd:
        with self._lock:
            if self._biotite is None:
                path = biotite_ccd_path()
                if path is None:
                    raise CcdUnavailable(
                        "biotite's components.bcif is not installed (pip install biotite>=1.0) "
                        "and no user CCD file defines the code"
                    )
                self._biotite = _BiotiteCcd(path)
            return self._biotite

    def get(self, code: str) -> ChemComp | None:
        """The component ``code`` (case-insensitive), or None if no source has it."""
        code = code.strip().upper()
        comp = self._user.get(code)
        if comp is None and self.use_biotite and biotite_ccd_path() is not None:
            comp = self._full().get(code)
            if comp is not None:
                self._user[code] = comp  # memoize
        return comp

    def __contains__(self, code: str) -> bool:
        return self.get(code) is not None

    def require(
        self, code: str, path: str | os.PathLike | None, record: str, field: str
    ) -> ChemComp:
        """The component, or :class:`InputError` naming ``record`` and ``field``."""
        comp = self.get(code)
        if comp is None:
            sources = ", ".join(self._files) or "no user CCD files"
            full = "biotite's CCD" if self.use_biotite and biotite_ccd_path() else "no full CCD"
            raise InputError(path, record, f"field {field!r}: unknown CCD code {code!r} "
                             f"(searched {sources} and {full})")
        return comp


_DEFAULT: Ccd | None = None


def default_ccd() -> Ccd:
    """The process-wide CCD: biotite's shipped dictionary, loaded on the first lookup."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Ccd()
    return _DEFAULT
