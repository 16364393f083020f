"""AF3 prediction: an AlphaFold3 input JSON (or an mmCIF complex) in; an mmCIF of every chain,
ligands included, with per-atom pLDDT in the B-factor column, out.

Features come from fold-data's AF3 pipeline (``load_entry`` + ``make_features``: CCD or SMILES
reference conformers, bonds, the JSON's MSAs and templates), the inference sample from
``make_sample(raw, "af3_predict")`` (no crop, no padding), the model and its EMA weights from a
fold-train checkpoint of the AF3 family. The model samples ``no_samples`` structures with the EDM
sampler (AF3 Alg. 18) from a generator seeded by the JSON's first ``modelSeeds`` value; the
sample with the highest mean pLDDT is written (AF3 ranks by a confidence score; pLDDT is the part
of it this model's head always gives).

The mmCIF is written with gemmi: one ``_atom_site`` row per atom (``ATOM`` for polymer residues,
``HETATM`` for ligands, named by their CCD code, ``LIG`` for a SMILES ligand), chains named by the
JSON ``id``, residues numbered 1..N per chain, one ``_entity`` per distinct JSON entity (polymers
with their ``_entity_poly_seq``); written atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["AF3Prediction", "SMILES_LIGAND_NAME", "af3_prediction_to_structure",
           "make_af3_inputs", "predict_af3"]

SMILES_LIGAND_NAME = "LIG"  # residue name of a ligand given by SMILES (it has no CCD code)


@dataclass
class AF3Prediction:
    """One predicted complex: ``positions [N_atom, 3]`` (Angstrom), ``plddt [N_atom]`` (0-100),
    ``sample_plddt [S]`` (mean pLDDT of each diffusion sample; the best one is ``positions``)."""

    positions: np.ndarray
    plddt: np.ndarray
    sample_plddt: np.ndarray


def make_af3_inputs(source: str | os.PathLike, ccd=None, *, allow_outside_paths: bool = False,
                    features: dict | None = None):
    """``(entry, raw features)`` of an AF3 input JSON / mmCIF complex (fold-data AF3); the
    JSON's file paths must stay in its directory unless ``allow_outside_paths``. ``features``:
    extra arguments of ``make_features`` (searched MSAs, paired rows, template hits)."""
    from fold_data.af3 import load_entry, make_features

    from fold_train.af3_data import make_ccd

    ccd = ccd or make_ccd()
    entry = load_entry(source, ccd=ccd, allow_outside_paths=allow_outside_paths)
    return entry, make_features(entry, ccd=ccd, **(features or {}))


@torch.no_grad()
def predict_af3(
    model, raw: dict[str, np.ndarray], *, seed: int = 0, device: str | torch.device = "cpu",
    precision: str = "fp32", no_samples: int | None = None, no_steps: int | None = None,
    no_cycles: int | None = None, cuda_graphs: bool | None = None, predictor=None,
) -> AF3Prediction:
    """Sample structures of ``raw`` with ``model`` (eval mode) and keep the most confident one.

    ``cuda_graphs`` (None: on when ``device`` is CUDA): pad to the shape bucket and replay the
    captured trunk pass and sampler step (:mod:`fold_train.predict_graphs`); off, the same pieces
    run eagerly on the unpadded sample. ``predictor``: an
    :class:`~fold_train.predict_graphs.AF3Predictor` to reuse (its graphs) across calls."""
    from fold_data.af3 import make_sample

    from fold_train.data import collate
    from fold_train.predict_graphs import AF3Predictor

    device = torch.device(device)
    sample = make_sample(raw, "af3_predict", seed=seed)
    batch = collate([sample])
    model.eval()
    if predictor is None:
        predictor = AF3Predictor(model, device, precision=precision, cuda_graphs=cuda_graphs)
    gen = torch.Generator(device).manual_seed(seed)
    out = predictor(batch, generator=gen, no_cycles=no_cycles, no_samples=no_samples,
                    no_steps=no_steps)
    plddt, x = out["plddt"][0], out["x"][0]  # [S, N_atom], [S, N_atom, 3]
    if not (torch.isfinite(x).all() and torch.isfinite(plddt).all()):
        raise FloatingPointError("the model produced non-finite coordinates or pLDDT")
    per_sample = plddt.mean(-1)  # [S]
    best = int(per_sample.argmax())
    return AF3Prediction(positions=x[best].cpu().numpy().astype(np.float64),
                         plddt=plddt[best].cpu().numpy().astype(np.float64),
                         sample_plddt=per_sample.cpu().numpy())


def _atom_name(chars: np.ndarray) -> str:
    """Inverse of fold-data's ``ref_atom_name_chars`` (``ord(c) - 32``, space padded)."""
    return "".join(chr(int(c) + 32) for c in chars).strip()


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
                atom.name = _atom_name(raw["ref_atom_name_chars"][i])
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


def predict_af3_file(
    checkpoint: str | os.PathLike, source: str | os.PathLike, out: str | os.PathLike | None, *,
    device: str | torch.device = "cpu", use_ema: bool = True, ccd_files=(),
    no_samples: int | None = None, no_steps: int | None = None, no_cycles: int | None = None,
    cuda_graphs: bool | None = None,
    allow_outside_paths: bool = False, features: dict | None = None,
) -> dict:
    """The whole ``fold-train predict --json``: returns the printed JSON summary. Without
    ``out`` the JSON's ``name``, made one safe file name, is written in the current directory;
    a diverged checkpoint's non-finite or absurd structure is refused, not written."""
    from fold_data.errors import InputError

    from fold_train.af3_data import make_ccd
    from fold_train.outputs import check_prediction, output_path
    from fold_train.predict import load_trained_model, write_mmcif
    from fold_train.predict_graphs import graphs_wanted

    model, cfg = load_trained_model(checkpoint, device, use_ema=use_ema, family="af3")
    entry, raw = make_af3_inputs(source, make_ccd(ccd_files),  # bad input: InputError
                                 allow_outside_paths=allow_outside_paths, features=features)
    path = output_path(out, entry.name)  # checked before the model runs
    seed = int(entry.seeds[0]) if entry.seeds else 0
    try:
        pred = predict_af3(model, raw, seed=seed, device=device, precision=cfg.precision,
                           no_samples=no_samples, no_steps=no_steps, no_cycles=no_cycles,
                           cuda_graphs=cuda_graphs)
    except FloatingPointError as e:
        raise InputError(checkpoint, "prediction", f"{e}; the checkpoint has probably "
                         "diverged: predict with an earlier checkpoint") from None
    check_prediction(pred.positions, pred.plddt, checkpoint)
    st = af3_prediction_to_structure(pred, raw, entry)
    write_mmcif(st, path)
    ligands = [c.chain_id for c in entry.chains if not c.is_polymer]
    return {"name": entry.name, "out": str(path), "seed": seed,
            "n_token": int(len(raw["asym_id"])), "n_atom": int(len(raw["atom_to_token"])),
            "chains": [c.chain_id for c in entry.chains], "ligand_chains": ligands,
            "mean_plddt": float(pred.plddt.mean()),
            "cuda_graphs": graphs_wanted(cuda_graphs, device),
            "sample_mean_plddt": [float(v) for v in pred.sample_plddt]}
