"""An AF2 prediction as an mmCIF structure: one chain, residues numbered 1..N, pLDDT in the
B-factor column.

:class:`Prediction` holds what the model predicted for one chain (atom37 coordinates);
:func:`prediction_to_structure` builds the ``gemmi.Structure`` (``_atom_site`` with label and
author numbering 1..N, one entity whose ``_entity_poly_seq`` is the query), which
:func:`fold_data.write.write_mmcif` writes and gemmi and :func:`fold_data.mmcif.parse_mmcif`
read back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fold_data import residue_constants as rc

__all__ = ["Prediction", "prediction_to_structure"]


@dataclass
class Prediction:
    """One predicted chain: ``aatype [N]``, ``positions [N, 37, 3]`` (A), ``atom_mask [N, 37]``
    (atoms that exist for the residue type), ``plddt [N]`` (0-100); from models with the pTM
    head (AF2's ``_ptm`` models) also ``pae [N, N]`` (expected aligned error of residue j in
    the frame of residue i, A), ``max_pae`` (the largest value it can take) and ``ptm``;
    ``contact_probs [N, N]`` (distogram probability of CB-CB within 8 A) when computed."""

    aatype: np.ndarray
    positions: np.ndarray
    atom_mask: np.ndarray
    plddt: np.ndarray
    pae: np.ndarray | None = None
    max_pae: float | None = None
    ptm: float | None = None
    contact_probs: np.ndarray | None = None

    @property
    def sequence(self) -> str:
        return "".join(rc.restypes_with_x[a] for a in self.aatype)


def prediction_to_structure(pred: Prediction, name: str, chain_id: str = "A"):
    """A ``gemmi.Structure`` of the prediction: residues numbered 1..N, pLDDT as B-factor."""
    import gemmi

    resnames = [rc.restype_1to3.get(rc.restypes_with_x[a], "UNK") for a in pred.aatype]
    st = gemmi.Structure()
    st.name = name
    model = gemmi.Model(1)
    chain = gemmi.Chain(chain_id)
    for i, resname in enumerate(resnames):
        res = gemmi.Residue()
        res.name = resname
        res.seqid = gemmi.SeqId(i + 1, " ")
        res.subchain = chain_id
        res.label_seq = i + 1
        res.entity_id = "1"
        res.entity_type = gemmi.EntityType.Polymer
        for j in np.nonzero(pred.atom_mask[i] > 0.5)[0]:
            atom = gemmi.Atom()
            atom.name = rc.atom_types[j]
            atom.element = gemmi.Element(rc.atom_types[j][0])  # C, N, O, S
            atom.pos = gemmi.Position(*(float(x) for x in pred.positions[i, j]))
            atom.occ = 1.0
            atom.b_iso = float(pred.plddt[i])
            res.add_atom(atom)
        chain.add_residue(res)
    model.add_chain(chain)
    st.add_model(model)
    entity = gemmi.Entity("1")
    entity.entity_type = gemmi.EntityType.Polymer
    entity.polymer_type = gemmi.PolymerType.PeptideL
    entity.full_sequence = resnames
    entity.subchains = [chain_id]
    st.entities.append(entity)
    return st
