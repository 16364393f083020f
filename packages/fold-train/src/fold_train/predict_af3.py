"""AF3 prediction: an AlphaFold3 input JSON (or an mmCIF complex) in; an mmCIF of every chain,
ligands included, with per-atom pLDDT in the B-factor column, out.

Features come from fold-data's AF3 pipeline (``load_entry`` + ``make_features``: CCD or SMILES
reference conformers, bonds, the JSON's MSAs and templates), the inference sample from
``make_sample(raw, "af3_predict")`` (no crop, no padding), the model and its EMA weights from a
fold-train checkpoint of the AF3 family. The model samples ``no_samples`` structures with the EDM
sampler (AF3 Alg. 18) from a generator seeded by the JSON's first ``modelSeeds`` value; the
sample with the highest mean pLDDT is written (AF3 ranks by a confidence score; pLDDT is the part
of it this model's head always gives).

The mmCIF is built and written by fold-data (``fold_data.af3.write.af3_prediction_to_structure``:
ligands as ``HETATM`` named by their CCD code, chains named by the JSON ``id``;
``fold_data.write.write_mmcif``, atomically).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from fold_data.af3.write import AF3Prediction

__all__ = ["make_af3_inputs", "predict_af3"]


def make_af3_inputs(source: str | os.PathLike, ccd=None, *, allow_outside_paths: bool = False,
                    features: dict | None = None, limits=None, check=None):
    """``(entry, raw features)`` of an AF3 input JSON / mmCIF complex (fold-data AF3); the
    JSON's file paths must stay in its directory unless ``allow_outside_paths``. ``features``:
    extra arguments of ``make_features`` (searched MSAs, paired rows, template hits).
    ``check(entry, ccd)`` runs on the parsed entry before it is featurised (a size check), and
    ``limits`` (``fold_data.limits.SizeLimits``) apply while it is."""
    from fold_data.af3 import load_entry, make_features
    from fold_data.limits import use_limits

    from fold_train.af3_data import make_ccd

    ccd = ccd or make_ccd()
    entry = load_entry(source, ccd=ccd, allow_outside_paths=allow_outside_paths)
    if check is not None:
        check(entry, ccd)
    with use_limits(limits):
        return entry, make_features(entry, ccd=ccd, **(features or {}))


@torch.no_grad()
def predict_af3(
    model, raw: dict[str, np.ndarray], *, seed: int = 0, device: str | torch.device = "cpu",
    precision: str = "fp32", no_samples: int | None = None, no_steps: int | None = None,
    no_cycles: int | None = None, cuda_graphs: bool | None = None, predictor=None,
    parallel=None,
) -> AF3Prediction:
    """Sample structures of ``raw`` with ``model`` (eval mode) and keep the most confident one.

    ``cuda_graphs`` (None: on when ``device`` is CUDA): pad to the shape bucket and replay the
    captured trunk pass and sampler step (:mod:`fold_train.predict_graphs`); off, the same pieces
    run eagerly on the unpadded sample. ``predictor``: an
    :class:`~fold_train.predict_graphs.AF3Predictor` to reuse (its graphs) across calls.
    ``parallel``: this rank's :class:`~fold_train.predict_dap.PredictParallel` under DAP (tokens
    and MSA rows padded to its degree, the samples split over its ranks and gathered)."""
    from fold_data.af3 import make_sample

    from fold_train.data import collate
    from fold_train.predict_dap import single_process
    from fold_train.predict_graphs import AF3Predictor

    device = torch.device(device)
    sample = make_sample(raw, "af3_predict", seed=seed)
    parallel = parallel or single_process()  # DAP: fold_train.predict_dap
    batch = parallel.pad_af3(collate([sample]))
    model.eval()
    if predictor is None:
        predictor = AF3Predictor(model, device, precision=precision, cuda_graphs=cuda_graphs)
    gen = torch.Generator(device).manual_seed(seed)
    share = None
    if parallel.dap > 1:
        share = parallel.sample_share(no_samples or model.config.sampler.no_samples)
    out = predictor(batch, generator=gen, no_cycles=no_cycles, no_samples=no_samples,
                    no_steps=no_steps, sample_share=share)
    out = parallel.gather_samples({"x": out["x"], "plddt": out["plddt"]})
    plddt, x = out["plddt"][0], out["x"][0]  # [S, N_atom], [S, N_atom, 3]
    if not (torch.isfinite(x).all() and torch.isfinite(plddt).all()):
        raise FloatingPointError("the model produced non-finite coordinates or pLDDT")
    per_sample = plddt.mean(-1)  # [S]
    best = int(per_sample.argmax())
    return AF3Prediction(positions=x[best].cpu().numpy().astype(np.float64),
                         plddt=plddt[best].cpu().numpy().astype(np.float64),
                         sample_plddt=per_sample.cpu().numpy())


def predict_af3_file(
    checkpoint: str | os.PathLike, source: str | os.PathLike, out: str | os.PathLike | None, *,
    device: str | torch.device = "cpu", use_ema: bool = True, ccd_files=(),
    no_samples: int | None = None, no_steps: int | None = None, no_cycles: int | None = None,
    cuda_graphs: bool | None = None,
    allow_outside_paths: bool = False,
    memory_limit: int | None = None,
    limits=None, features: dict | None = None, parallel=None,
) -> dict:
    """The whole ``fold-train predict --json``: returns the printed JSON summary. Without
    ``out`` the JSON's ``name``, made one safe file name, is written in the current directory;
    a diverged checkpoint's non-finite or absurd structure is refused, not written. The entry is
    sized before it is featurised (:mod:`fold_train.predict_size`: ``limits``, a
    ``fold_data.limits.SizeLimits``, and ``memory_limit`` bytes, default the device's free
    memory): one too large is refused with the numbers and the options. ``parallel``: this
    rank's :class:`~fold_train.predict_dap.PredictParallel` (DAP; only its writer writes)."""
    from fold_data.af3.write import af3_prediction_to_structure
    from fold_data.errors import InputError
    from fold_data.write import write_mmcif

    from fold_train.af3_data import make_ccd
    from fold_train.families import make_family
    from fold_train.outputs import check_prediction, output_path
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model
    from fold_train.predict_dap import single_process
    from fold_train.predict_graphs import graphs_wanted
    from fold_train.predict_size import check_af3_input

    parallel = parallel or single_process()
    model, cfg = load_trained_model(checkpoint, device, use_ema=use_ema, family="af3")

    def check(entry, ccd) -> None:  # sized before it is featurised
        check_af3_input(entry, ccd, model_config=cfg.model_config(),
                        precision=cfg.system.precision, device=device, no_samples=no_samples,
                        memory_limit=memory_limit, limits=limits, dap=parallel.dap)

    # bad input: InputError; features: searched MSAs / paired rows / templates (--search)
    entry, raw = make_af3_inputs(source, make_ccd(ccd_files),
                                 allow_outside_paths=allow_outside_paths, features=features,
                                 limits=limits, check=check)
    done = parallelize(model, make_family(cfg.model.family, cfg.model_config()),
                       parallel.adjust(Techniques(cuda_graphs=graphs_wanted(cuda_graphs,
                                                                            device))))
    path = output_path(out, entry.name)  # checked before the model runs
    seed = int(entry.seeds[0]) if entry.seeds else 0
    try:
        pred = predict_af3(model, raw, seed=seed, device=device,
                           precision=cfg.system.precision, no_samples=no_samples,
                           no_steps=no_steps, no_cycles=no_cycles, cuda_graphs=done.cuda_graphs,
                           parallel=parallel)
    except FloatingPointError as e:
        raise InputError(checkpoint, "prediction", f"{e}; the checkpoint has probably "
                         "diverged: predict with an earlier checkpoint") from None
    check_prediction(pred.positions, pred.plddt, checkpoint)
    if parallel.writes:  # DAP: one rank writes
        write_mmcif(af3_prediction_to_structure(pred, raw, entry), path)
    ligands = [c.chain_id for c in entry.chains if not c.is_polymer]
    return {"name": entry.name, "out": str(path), "seed": seed,
            "n_token": int(len(raw["asym_id"])), "n_atom": int(len(raw["atom_to_token"])),
            "chains": [c.chain_id for c in entry.chains], "ligand_chains": ligands,
            "mean_plddt": float(pred.plddt.mean()),
            "cuda_graphs": done.cuda_graphs,
            "sample_mean_plddt": [float(v) for v in pred.sample_plddt]}
