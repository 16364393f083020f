"""A synthetic AF3 training batch in fold-data's ``SAMPLE_FEATURES`` layout (names, dtypes,
shapes), synthesized directly because fold-data's AF3 featurisation imports RDKit, which the GPU
image lacks: two protein chains (residue atoms and names from ``fold_data.residue_constants``, OXT
on the C-terminus), a DNA duplex (C1'/C3'/C4' present, so the confidence frames are found), a
ligand of one-atom tokens bonded in a chain, padded to ``ATOMS_PER_TOKEN`` atoms per token; a
random walk of residues as the ground truth with ~3% unresolved atoms; MSA rows that mutate the
query with gaps and deletions; templates are the ground truth with noise. For train/af3.py,
model/loss_af3_pairs.py and tools/profile_af3_step.py."""

from __future__ import annotations

import numpy as np
import torch
from fold_data.residue_constants import residue_atoms, restype_1to3, restypes

GAP = 31  # fold-data's AF3 gap / padding restype
DNA_CODES = {"A": 26, "G": 27, "C": 28, "T": 29}
DNA_ATOMS = {  # heavy atoms of the DNA nucleotides (CCD DA/DG/DC/DT, no OP3)
    "A": "P OP1 OP2 O5' C5' C4' O4' C3' O3' C2' C1' N9 C8 N7 C5 C6 N6 N1 C2 N3 C4",
    "G": "P OP1 OP2 O5' C5' C4' O4' C3' O3' C2' C1' N9 C8 N7 C5 C6 O6 N1 C2 N2 N3 C4",
    "C": "P OP1 OP2 O5' C5' C4' O4' C3' O3' C2' C1' N1 C2 O2 N3 C4 N4 C5 C6",
    "T": "P OP1 OP2 O5' C5' C4' O4' C3' O3' C2' C1' N1 C2 O2 N3 C4 O4 C5 C7 C6",
}
ELEMENT = {"C": 6, "N": 7, "O": 8, "P": 15, "S": 16}

ATOMS_PER_TOKEN = 12


def _composition(n_token: int) -> tuple[int, int, int]:
    """(protein tokens, DNA tokens per strand, ligand atoms) of an ``n_token`` crop."""
    n_lig = max(1, min(16, n_token // 12))
    strand = min(8, n_token // 24)
    return n_token - n_lig - 2 * strand, strand, n_lig


def synthetic_sample(n_token: int, n_atom: int, n_msa: int, n_templ: int, seed: int = 0
                     ) -> dict[str, np.ndarray]:
    """One AF3 training sample in fold-data's ``SAMPLE_FEATURES`` layout (no batch dim): two
    protein chains, a DNA duplex, a ligand of one-atom tokens, padded to ``n_atom`` atoms."""
    rng = np.random.default_rng(seed)
    n_prot, strand, n_lig = _composition(n_token)
    if n_prot < 2:
        raise ValueError(f"synthetic_sample: {n_token} tokens leave no room for two chains")
    len_a = n_prot // 2
    chains = [("protein", len_a), ("protein", n_prot - len_a)]
    if strand:
        chains += [("dna", strand), ("dna", strand)]
    chains.append(("ligand", n_lig))
    homodimer = chains[0][1] == chains[1][1]
    seq_a = rng.integers(0, 20, len_a)

    tok: dict[str, list] = {k: [] for k in (
        "residue_index", "token_index", "asym_id", "entity_id", "sym_id", "restype",
        "is_protein", "is_rna", "is_dna", "is_ligand", "is_atomized", "token_center_atom",
        "token_pseudo_beta_atom")}
    atom_names: list[str] = []
    atom_tok: list[int] = []
    uid: list[int] = []  # ref_space_uid: one per residue / nucleotide, one for the ligand
    next_uid = 0
    lig_bonds: list[tuple[int, int]] = []
    t = 0
    for asym, (kind, length) in enumerate(chains):
        entity = 0 if (asym == 1 and homodimer) else asym
        sym = 1 if (asym == 1 and homodimer) else 0
        if kind == "protein":
            seq = seq_a if asym == 0 or homodimer else rng.integers(0, 20, length)
        for i in range(length):
            first = len(atom_names)
            if kind == "protein":
                names = list(residue_atoms[restype_1to3[restypes[seq[i]]]])
                names += ["OXT"] if i == length - 1 else []
                code, centre = int(seq[i]), first + 1  # CA
                rep = first + names.index("CB" if "CB" in names else "CA")
            elif kind == "dna":
                base = "ACGT"[rng.integers(4)]
                names, code = DNA_ATOMS[base].split(), DNA_CODES[base]
                centre = first + names.index("C1'")
                rep = first + names.index("C4" if base in "AG" else "C2")  # purine / pyrimidine
            else:
                names, code, centre = [("C", "N", "O")[rng.integers(3)] + str(i + 1)], 20, first
                rep = first
                if i:
                    lig_bonds.append((t - 1, t))
            atom_names += names
            atom_tok += [t] * len(names)
            uid += [next_uid] * len(names)
            next_uid += kind != "ligand" or i == length - 1
            for k, v in (("residue_index", i if kind != "ligand" else 0), ("token_index", t),
                         ("asym_id", asym), ("entity_id", entity), ("sym_id", sym),
                         ("restype", code), ("is_protein", kind == "protein"), ("is_rna", 0),
                         ("is_dna", kind == "dna"), ("is_ligand", kind == "ligand"),
                         ("is_atomized", kind == "ligand"), ("token_center_atom", centre),
                         ("token_pseudo_beta_atom", rep)):
                tok[k].append(int(v))
            t += 1
    a_real = len(atom_names)
    if a_real > n_atom:
        raise ValueError(f"synthetic_sample: {a_real} atoms exceed the budget of {n_atom}")
    atom_tok_a = np.asarray(atom_tok)

    # Ground truth: a random walk of token centres (3.8 A steps), atoms around their centre.
    steps = rng.normal(size=(n_token, 3))
    walk = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0)
    pos = walk[atom_tok_a] + rng.normal(scale=1.2, size=(a_real, 3))
    resolved = (rng.random(a_real) > 0.03).astype(np.float32)
    resolved[np.asarray(tok["token_center_atom"])] = 1.0
    resolved[np.asarray(tok["token_pseudo_beta_atom"])] = 1.0
    ref = rng.normal(scale=1.5, size=(a_real, 3))  # conformer-like, each centred near 0
    chars = np.array([[ord(c) - 32 for c in n.ljust(4)[:4]] for n in atom_names], np.int32)

    def pad(x: np.ndarray, n: int, fill: float = 0) -> np.ndarray:
        out = np.full((n, *x.shape[1:]), fill, dtype=x.dtype)
        out[: len(x)] = x
        return out

    f: dict[str, np.ndarray] = {k: np.asarray(v, np.int32) for k, v in tok.items()}
    f["token_mask"] = np.ones(n_token, np.float32)
    f["ref_pos"] = pad(ref.astype(np.float32), n_atom)
    f["ref_mask"] = pad(np.ones(a_real, np.float32), n_atom)
    f["ref_element"] = pad(np.array([ELEMENT[n[0]] for n in atom_names], np.int32), n_atom)
    f["ref_charge"] = np.zeros(n_atom, np.float32)
    f["ref_atom_name_chars"] = pad(chars, n_atom)
    f["ref_space_uid"] = pad(np.asarray(uid, np.int32), n_atom)
    f["ref_pos_source"] = pad(np.where(f["is_ligand"][atom_tok_a] > 0, 0, 1).astype(np.int32),
                              n_atom)
    f["atom_to_token"] = pad(atom_tok_a.astype(np.int32), n_atom)
    f["atom_positions"] = pad((pos * resolved[:, None]).astype(np.float32), n_atom)
    f["atom_resolved"] = pad(resolved, n_atom)
    f["atom_mask"] = pad(np.ones(a_real, np.float32), n_atom)
    bonds = np.zeros((n_token, n_token), np.float32)
    for i, j in lig_bonds:
        bonds[i, j] = bonds[j, i] = 1.0
    f["token_bonds"] = bonds

    # MSA: the query, then rows mutating 30% of the protein columns (gaps included); other
    # chains' columns are gaps beyond the query (no MSA for DNA and ligands here).
    query = f["restype"]
    msa = np.repeat(query[None], n_msa, 0)
    prot = f["is_protein"].astype(bool)
    mutate = (rng.random((n_msa, n_token)) < 0.3) & prot
    mutate[0] = False
    msa[mutate] = rng.integers(0, 21, int(mutate.sum()))
    msa[mutate & (msa == 20)] = GAP
    msa[1:, ~prot] = GAP
    dels = np.where(rng.random((n_msa, n_token)) < 0.05, rng.integers(1, 6, (n_msa, n_token)), 0)
    dels[0] = 0
    f["msa"] = msa.astype(np.int32)
    f["has_deletion"] = (dels > 0).astype(np.float32)
    f["deletion_value"] = ((2 / np.pi) * np.arctan(dels / 3.0)).astype(np.float32)
    f["msa_mask"] = np.ones((n_msa, n_token), np.float32)
    f["profile"] = np.stack([(msa == c).mean(0) for c in range(32)], -1).astype(np.float32)
    f["deletion_mean"] = dels.mean(0).astype(np.float32)

    # Templates: the protein ground truth with 1 A noise, 10% of the residues missing.
    centre = f["token_center_atom"]
    ca = pos[centre]
    cover = (rng.random((n_templ, n_token)) > 0.1) & prot
    bb_idx = np.stack([centre - 1, centre, centre + 1], -1)  # N, CA, C for protein tokens
    bb = pos[np.clip(bb_idx, 0, a_real - 1)]  # [N, 3, 3]
    noise = rng.normal(size=(n_templ, n_token, 4, 3))
    f["template_restype"] = np.where(cover, query, GAP).astype(np.int32)
    f["template_pseudo_beta"] = ((ca + noise[:, :, 0]) * cover[..., None]).astype(np.float32)
    f["template_pseudo_beta_mask"] = cover.astype(np.float32)
    f["template_backbone"] = ((bb + noise[:, :, 1:]) * cover[..., None, None]).astype(np.float32)
    f["template_backbone_mask"] = cover.astype(np.float32)
    f["template_mask"] = np.ones(n_templ, np.float32)
    f["resolution"] = np.asarray(2.0, np.float32)
    return f


def to_batch(sample: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Torch tensors with a leading batch dim of 1 on ``device``."""
    return {k: torch.as_tensor(np.array(v))[None].to(device)
            for k, v in sample.items()}


def make_batch(n_token: int, sizes: dict, device: torch.device, seed: int = 0
               ) -> dict[str, torch.Tensor]:
    """The batch of an ``n_token`` crop (``ATOMS_PER_TOKEN`` atoms per token) with the MSA and
    template counts of ``sizes``."""
    return to_batch(synthetic_sample(n_token, ATOMS_PER_TOKEN * n_token, sizes["n_msa"],
                                     sizes["n_templ"], seed), device)
