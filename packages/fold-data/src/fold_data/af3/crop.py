"""AF3 cropping (AF3 supplement 2.7; AF-Multimer supplement 7.2.2 Algorithms 1 and 2), atom-aware.

Three methods pick the tokens of one training sample:

* **contiguous**: chains in random order, each contributes one contiguous window whose length is
  drawn so that the remaining chains can still fill the budget (AF-Multimer Algorithm 1);
* **spatial**: the tokens nearest (by centre atom) to a random resolved reference token
  (Algorithm 2);
* **spatial interface**: as spatial, with the reference drawn from interface tokens (a resolved
  centre within 15 Angstrom of another chain's resolved centre); spatial when there are none.

Atom-aware: tokens are grouped into *units* that are kept or dropped whole: a standard residue,
an atomized (modified) polymer residue, and a whole ligand chain (every atom of a ligand, a
glycan or an ion). A crop never holds more than ``max_tokens`` tokens or ``max_atoms`` atoms.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "INTERFACE_DISTANCE",
    "contiguous_crop",
    "crop_features",
    "crop_units",
    "spatial_crop",
]

INTERFACE_DISTANCE = 15.0  # Angstrom (AF3 supplement 2.7)


def crop_units(raw: dict[str, np.ndarray]) -> np.ndarray:
    """[N_token] int32 unit id of each token (units are consecutive token runs)."""
    asym, res = raw["asym_id"], raw["residue_index"]
    ligand, atomized = raw["is_ligand"].astype(bool), raw["is_atomized"].astype(bool)
    units = np.zeros(len(asym), dtype=np.int32)
    for t in range(1, len(asym)):
        same = asym[t] == asym[t - 1] and (
            ligand[t] or (atomized[t] and atomized[t - 1] and res[t] == res[t - 1])
        )
        units[t] = units[t - 1] + (0 if same else 1)
    return units


def _atoms_per_token(raw: dict[str, np.ndarray]) -> np.ndarray:
    return np.bincount(raw["atom_to_token"], minlength=len(raw["asym_id"]))


def _take_in_order(
    unit_order: np.ndarray, units: np.ndarray, atom_counts: np.ndarray, max_tokens: int,
    max_atoms: int | None, *, skip: bool,
) -> np.ndarray:
    """Tokens of units taken in ``unit_order`` while they fit; ``skip``: a unit that does not
    fit is passed over (smaller ones may still fit), else taking stops there."""
    tokens_of = np.bincount(units)
    atoms_of = np.bincount(units, weights=atom_counts).astype(np.int64)
    keep = np.zeros(len(tokens_of), dtype=bool)
    n_tok = n_atom = 0
    for u in unit_order:
        fits = n_tok + tokens_of[u] <= max_tokens and (
            max_atoms is None or n_atom + atoms_of[u] <= max_atoms)
        if not fits:
            if skip:
                continue
            break
        keep[u] = True
        n_tok += tokens_of[u]
        n_atom += atoms_of[u]
    return np.flatnonzero(keep[units]).astype(np.int32)


def contiguous_crop(
    raw: dict[str, np.ndarray], max_tokens: int, rng: np.random.Generator,
    max_atoms: int | None = None,
) -> np.ndarray:
    """Sorted token indices of a contiguous crop (AF-Multimer Algorithm 1, in units)."""
    units = crop_units(raw)
    asym = raw["asym_id"]
    chains = np.unique(asym)
    order = rng.permutation(chains)
    # Unit sequence of each chain.
    chain_units = {c: np.unique(units[asym == c]) for c in chains}
    tokens_of = np.bincount(units)
    n_added, n_remaining = 0, int(len(asym))
    picked: list[int] = []
    for c in order:
        u = chain_units[c]
        n_k = int(tokens_of[u].sum())
        n_remaining -= n_k
        size_max = min(max_tokens - n_added, n_k)
        size_min = min(n_k, max(0, max_tokens - n_added - n_remaining))
        size = int(rng.integers(size_min, size_max + 1)) if size_max > 0 else 0
        if size <= 0:
            continue
        # Window of whole units with at most `size` tokens, from a random start unit.
        cum = np.concatenate([[0], np.cumsum(tokens_of[u])])
        starts = np.flatnonzero(cum[:-1] + size <= n_k) if size < n_k else np.array([0])
        start = int(rng.choice(starts)) if len(starts) else 0
        stop = int(np.searchsorted(cum, cum[start] + size, side="right")) - 1
        window = u[start:max(stop, start)]
        picked += list(window)
        n_added += int(tokens_of[window].sum())
    return _take_in_order(np.asarray(picked, dtype=np.int64), units, _atoms_per_token(raw),
                          max_tokens, max_atoms, skip=False)


def _centres(raw: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    centre = raw["token_center_atom"]
    return raw["atom_positions"][centre].astype(np.float64), raw["atom_resolved"][centre] > 0


def spatial_crop(
    raw: dict[str, np.ndarray], max_tokens: int, rng: np.random.Generator,
    max_atoms: int | None = None, *, interface: bool = False,
    focus: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Sorted token indices of a spatial (``interface=True``: spatial interface) crop.

    ``focus``: the ``asym_id`` of the chain, or the two of the interface, that the sample was
    drawn for (AF3 supplement 2.5): the reference token is one of theirs (for an interface crop,
    one of the focus chains' tokens near another focus chain, or near any other chain when the
    focus is one chain); when they have no such token, as without a focus."""
    pos, resolved = _centres(raw)
    candidates = np.flatnonzero(resolved)
    if len(candidates) == 0:  # no structure (prediction input): nothing to measure from
        return contiguous_crop(raw, max_tokens, rng, max_atoms)
    asym = raw["asym_id"]
    if focus:
        own = np.isin(asym[candidates], focus)
        if own.any():
            near = own
            if interface:  # focus tokens at the focus interface (one chain: at any interface)
                near = own & _near_other_chain(pos[candidates], asym[candidates],
                                               tuple(focus) if len(focus) > 1 else None)
                interface = not near.any()  # none: focus tokens at any interface, below
            candidates = candidates[near if near.any() else own]
    if interface:
        near = _near_other_chain(pos[candidates], asym[candidates], None)
        if near.any():
            candidates = candidates[near]
    ref = int(rng.choice(candidates))
    dist = np.linalg.norm(pos - pos[ref], axis=-1)
    # Unresolved centres come last; a tiny index term breaks ties as AF-Multimer does.
    dist = np.where(resolved, dist, np.inf) + 1e-3 * np.arange(len(dist)) / max(len(dist), 1)
    units = crop_units(raw)
    unit_dist = np.full(units.max() + 1, np.inf)
    np.minimum.at(unit_dist, units, dist)
    order = np.argsort(unit_dist, kind="stable")
    return _take_in_order(order, units, _atoms_per_token(raw), max_tokens, max_atoms, skip=True)


def _near_other_chain(p: np.ndarray, asym: np.ndarray, among: tuple[int, ...] | None
                      ) -> np.ndarray:
    """[N] whether each centre ``p`` [N, 3] is within INTERFACE_DISTANCE of a centre of another
    chain (``among``: of another of these chains)."""
    sq = (p * p).sum(-1)
    d2 = sq[:, None] + sq[None] - 2.0 * p @ p.T  # [N, N] squared distances
    other = asym[:, None] != asym[None]
    if among is not None:
        other &= np.isin(asym, among)[None]
    return ((d2 < INTERFACE_DISTANCE**2) & other).any(axis=1)


_TOKEN_KEYS = ("residue_index", "token_index", "asym_id", "entity_id", "sym_id", "restype",
               "is_protein", "is_rna", "is_dna", "is_ligand", "is_atomized", "profile",
               "deletion_mean")
_ATOM_KEYS = ("ref_pos", "ref_mask", "ref_element", "ref_charge", "ref_atom_name_chars",
              "ref_space_uid", "ref_pos_source", "atom_positions", "atom_resolved")
_COLUMN_KEYS = ("msa", "deletion_matrix", "template_restype", "template_pseudo_beta",
                "template_pseudo_beta_mask", "template_backbone", "template_backbone_mask")


def crop_features(raw: dict[str, np.ndarray], tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Raw features restricted to ``tokens`` (sorted indices) and their atoms; indices remapped.
    Bonds are kept when both ends are kept."""
    tokens = np.sort(np.asarray(tokens, dtype=np.int64))
    n_token = len(raw["asym_id"])
    new_token = np.full(n_token, -1, dtype=np.int64)
    new_token[tokens] = np.arange(len(tokens))
    atoms = np.flatnonzero(new_token[raw["atom_to_token"]] >= 0)
    new_atom = np.full(len(raw["atom_to_token"]), -1, dtype=np.int64)
    new_atom[atoms] = np.arange(len(atoms))
    out = dict(raw)
    for k in _TOKEN_KEYS:
        out[k] = raw[k][tokens]
    for k in _ATOM_KEYS:
        out[k] = raw[k][atoms]
    for k in _COLUMN_KEYS:
        out[k] = raw[k][:, tokens]
    out["atom_to_token"] = new_token[raw["atom_to_token"][atoms]].astype(np.int32)
    for k in ("token_center_atom", "token_pseudo_beta_atom"):  # atom indices: remapped
        out[k] = new_atom[raw[k][tokens]].astype(np.int32)
    bonds = new_atom[raw["atom_bonds"]]
    keep = (bonds >= 0).all(axis=1)
    out["atom_bonds"] = bonds[keep].astype(np.int32).reshape(-1, 2)
    out["atom_bond_order"] = raw["atom_bond_order"][keep]
    tb = new_token[raw["token_bonds"]]
    out["token_bonds"] = tb[(tb >= 0).all(axis=1)].astype(np.int32).reshape(-1, 2)
    return out
