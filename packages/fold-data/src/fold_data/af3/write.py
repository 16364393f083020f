"""An AF3 prediction as an mmCIF structure: every chain of the entry, ligands included,
per-atom pLDDT in the B-factor column.

:class:`AF3Prediction` holds the sampled atom positions; :func:`af3_prediction_to_structure`
builds the ``gemmi.Structure`` from them and the entry's raw features: one ``_atom_site`` row per
atom (``ATOM`` for polymer residues, ``HETATM`` for ligands, named by their CCD code,
:data:`SMILES_LIGAND_NAME` for a SMILES ligand), atom names decoded from
``ref_atom_name_chars``, chains named by the JSON ``id``, residues numbered 1..N per chain, one
``_entity`` per distinct JSON entity (polymers with their ``_entity_poly_seq``).
:func:`fold_data.write.write_mmcif` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tokenizer import atom_name_from_chars

__all__ = ["AF3Prediction", "SMILES_LIGAND_NAME", "af3_prediction_to_structure"]

SMILES_LIGAND_NAME = "LIG"  # residue name of a ligand given by SMILES (it has no CCD code)


@dataclass
class AF3Prediction:
    """One predicted complex: ``positions [N_atom, 3]`` (Angstrom), ``plddt [N_atom]`` (0-100),
    ``sample_plddt [S]`` (mean pLDDT of each diffusion sample; the best one is ``positions``)."""

    positions: np.ndarray
    plddt: np.ndarray
    sample_plddt: np.ndarray


_POLYMER_TYPES = {"protein": "PeptideL", "rna": "Rna", "dna": "Dna"}


def af3_prediction_to_structure(pred: AF3Prediction, raw: dict[str, np.ndarray], entry):
    """A ``gemmi.Structure`` of the prediction: every chain of ``entry``, pLDDT as B-factor."""
    import gemmi

    n_atom = len(raw["atom_to_token"])
    if pred.positions.shape != (n_atom, 3) or pred.plddt.shape != (n_atom,):
        raise ValueError(f"prediction has {pred.positions.shape} positions / {pred.plddt.shape} "
                         f"pLDDT for {n_atom} atoms")
    token = raw["atom_to_token"]
    asym = raw["asym_id"][token]
    res_index = raw["residue_index"][token]
    st = gemmi.Structure()
    st.name = entry.name
    model = gemmi.Model(1)
    entities: dict[int, gemmi.Entity] = {}
    for a_id, chain_def in enumerate(entry.chains):
        atoms = np.flatnonzero(asym == a_id)
        if len(atoms) == 0:
            continue
        is_ligand = not chain_def.is_polymer
        chain = gemmi.Chain(chain_def.chain_id)
        for r in np.unique(res_index[atoms]):
            r = int(r)
            res = gemmi.Residue()
            res.name = (SMILES_LIGAND_NAME if chain_def.smiles is not None
                        else chain_def.residues[r])
            res.seqid = gemmi.SeqId(r + 1, " ")
            res.subchain = chain_def.chain_id
            res.entity_id = str(chain_def.entity_id)
            res.het_flag = "H" if is_ligand else "A"
            res.entity_type = (gemmi.EntityType.NonPolymer if is_ligand
                               else gemmi.EntityType.Polymer)
            if not is_ligand:
                res.label_seq = r + 1
            for i in atoms[res_index[atoms] == r]:
                atom = gemmi.Atom()
                atom.name = atom_name_from_chars(raw["ref_atom_name_chars"][i])
                atom.element = gemmi.Element(int(raw["ref_element"][i]))
                atom.pos = gemmi.Position(*(float(v) for v in pred.positions[i]))
                atom.occ = 1.0
                atom.b_iso = float(np.clip(pred.plddt[i], 0.0, 100.0))
                res.add_atom(atom)
            chain.add_residue(res)
        model.add_chain(chain)
        ent = entities.get(chain_def.entity_id)
        if ent is None:
            ent = gemmi.Entity(str(chain_def.entity_id))
            if is_ligand:
                ent.entity_type = gemmi.EntityType.NonPolymer
            else:
                ent.entity_type = gemmi.EntityType.Polymer
                ent.polymer_type = getattr(gemmi.PolymerType, _POLYMER_TYPES[chain_def.mol_type])
                ent.full_sequence = list(chain_def.residues)
            entities[chain_def.entity_id] = ent
        ent.subchains = [*ent.subchains, chain_def.chain_id]
    st.add_model(model)
    for key in sorted(entities):
        st.entities.append(entities[key])
    return st
