"""AF3 prediction: an AlphaFold3 input JSON (or an mmCIF complex) in; an mmCIF of every chain,
ligands included, with per-atom pLDDT in the B-factor column, out.

Features come from fold-data's AF3 pipeline (``load_entry`` + ``make_features``: CCD or SMILES
reference conformers, bonds, the JSON's MSAs and templates), the inference sample from
``make_sample(raw, "af3_predict")`` (no crop, no padding), the model and its EMA weights from a
fold-train checkpoint of the AF3 family. For each seed (``--seeds``, else the JSON's
``modelSeeds``) the model samples ``no_samples`` structures with the EDM sampler (AF3 Alg. 18)
from a generator seeded by it; the confidence head scores each sample (pLDDT, PAE, PDE), and
:mod:`fold_train.confidence` turns those into pTM, ipTM and AF3's ranking score, by which the
samples are ranked (:mod:`fold_train.confidence_outputs` writes them all with ``--out-dir``).

The mmCIF is built and written by fold-data (``fold_data.af3.write.af3_prediction_to_structure``:
ligands as ``HETATM`` named by their CCD code, chains named by the JSON ``id``;
``fold_data.write.write_mmcif``, atomically).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from fold_data.af3.write import AF3Prediction

__all__ = ["AF3Runner", "AF3Samples", "af3_results", "cache_inputs", "cache_params",
           "input_files", "make_af3_inputs", "predict_af3", "sample_af3"]


def make_af3_inputs(source: str | os.PathLike, ccd=None, *, allow_outside_paths: bool = False,
                    features: dict | None = None, limits=None, check=None, cache=None,
                    ccd_files=(), cache_status: dict | None = None):
    """``(entry, raw features)`` of an AF3 input JSON / mmCIF complex (fold-data AF3); the
    JSON's file paths must stay in its directory unless ``allow_outside_paths``. ``features``:
    extra arguments of ``make_features`` (searched MSAs, paired rows, template hits).
    ``check(entry, ccd)`` runs on the parsed entry before it is featurised (a size check), and
    ``limits`` (``fold_data.limits.SizeLimits``) apply while it is.

    ``cache`` (a ``fold_data.cache.FeatureCache``): the features are read from it when an entry
    of the same inputs is there, else made and stored (:func:`cache_inputs` says what the key
    covers: ``ccd_files`` are the ``--ccd`` files ``ccd`` was made from). Not with
    ``features`` (a search's results are not files the key could cover): those are made.
    ``cache_status``: gets ``{"cache": "reused" | "built" | "rebuilt-corrupt"}``."""
    from fold_data.af3 import load_entry, make_features
    from fold_data.limits import use_limits

    from fold_train.af3_data import make_ccd

    ccd = ccd or make_ccd()
    entry = load_entry(source, ccd=ccd, allow_outside_paths=allow_outside_paths)
    if check is not None:
        check(entry, ccd)

    def build() -> dict:
        with use_limits(limits):
            return make_features(entry, ccd=ccd, **(features or {}))

    if cache is None or features:
        return entry, build()
    result = cache.fetch(Path(source).stem, cache_inputs(source, ccd_files),
                         cache_params(ccd), build)
    if cache_status is not None:
        cache_status["cache"] = result.status
    return entry, result.features


def cache_inputs(source: str | os.PathLike, ccd_files=()) -> list[Path]:
    """The files whose bytes key an AF3 prediction's features in the cache: the JSON (or
    mmCIF) itself, the MSA / template / user CCD files it names (:func:`input_files`) and the
    ``--ccd`` files, in that order. ``fold_data.cache.FeatureCache.key`` hashes each one's name,
    size and bytes, so a changed file, or a JSON naming another, is another key."""
    return [*input_files(source), *(Path(f) for f in ccd_files)]


def cache_params(ccd) -> dict:
    """The key's parameters besides the files: what the features are for, and whether the CCD
    falls back to biotite's (that file by its size, as fold-data's AF3 cache keys it: hashing
    its 63 MB per input would cost more than the cache saves)."""
    from fold_data.af3.ccd import biotite_ccd_path

    biotite = None
    if ccd.use_biotite:
        path = biotite_ccd_path()
        biotite = path.stat().st_size if path else "absent"
    return {"use": "predict-af3", "biotite_ccd": biotite}


@dataclass
class AF3Samples:
    """The ``S`` samples of one seed, at the real sizes (``A`` atoms, ``N`` tokens):
    ``positions [S, A, 3]`` (A), ``plddt [S, A]`` (0-100), ``pae``, ``pde`` ``[S, N, N]`` (A),
    ``tm_global``, ``tm_interface`` ``[S, N, N]`` (TM-adjusted PAE, :mod:`fold_train.confidence`),
    ``contact_probs [N, N]``, ``frame_mask [S, N]`` (tokens with a valid frame in the sample)."""

    seed: int
    positions: np.ndarray
    plddt: np.ndarray
    pae: np.ndarray
    pde: np.ndarray
    tm_global: np.ndarray
    tm_interface: np.ndarray
    contact_probs: np.ndarray
    frame_mask: np.ndarray


@torch.no_grad()
def sample_af3(
    model, raw: dict[str, np.ndarray], *, seed: int = 0, device: str | torch.device = "cpu",
    precision: str = "fp32", no_samples: int | None = None, no_steps: int | None = None,
    no_cycles: int | None = None, cuda_graphs: bool | None = None, predictor=None,
    parallel=None,
) -> AF3Samples:
    """Sample structures of ``raw`` with ``model`` (eval mode) from a generator seeded by
    ``seed``, with their confidences.

    ``cuda_graphs`` (None: on when ``device`` is CUDA): pad to the shape bucket and replay the
    captured trunk pass and sampler step (:mod:`fold_train.predict_graphs`); off, the same pieces
    run eagerly on the unpadded sample. ``predictor``: an
    :class:`~fold_train.predict_graphs.AF3Predictor` to reuse (its graphs) across calls.
    A non-finite coordinate or pLDDT is a :class:`FloatingPointError`. ``parallel``: this rank's
    :class:`~fold_train.predict_dap.PredictParallel` under DAP (tokens and MSA rows padded to
    its degree, the samples split over its ranks and gathered)."""
    from fold_data.af3 import make_sample
    from fold_model.af3.confidence import token_frame_atoms

    from fold_train.data import collate
    from fold_train.predict_dap import single_process
    from fold_train.predict_graphs import AF3Predictor

    device = torch.device(device)
    sample = make_sample(raw, "af3_predict", seed=seed)
    batch = collate([sample])
    model.eval()
    if predictor is None:
        predictor = AF3Predictor(model, device, precision=precision, cuda_graphs=cuda_graphs)
    gen = torch.Generator(device).manual_seed(seed)
    parallel = parallel or single_process()  # DAP: fold_train.predict_dap
    share = None
    if parallel.dap > 1:
        share = parallel.sample_share(no_samples or model.config.sampler.no_samples)
    out = predictor(parallel.pad_af3(batch), generator=gen, no_cycles=no_cycles,
                    no_samples=no_samples, no_steps=no_steps, sample_share=share)
    out = parallel.gather_samples(out, AF3Predictor.PER_SAMPLE)
    plddt, x = out["plddt"][0].cpu(), out["x"][0].cpu()  # [S, N_atom], [S, N_atom, 3]
    if not (torch.isfinite(x).all() and torch.isfinite(plddt).all()):
        raise FloatingPointError("the model produced non-finite coordinates or pLDDT")
    # A token's frame (AF3 4.3.2) is valid when its three atoms exist and, for a ligand atom,
    # are not collinear; at inference the predicted sample stands in for the ground truth.
    feats = {**batch, "atom_resolved": batch["atom_mask"]}
    frames = [token_frame_atoms(feats, x[s][None])[1][0] for s in range(x.shape[0])]  # [N]
    n = int(len(raw["asym_id"]))

    def host(key: str) -> np.ndarray:
        return out[key][0].cpu().numpy().astype(np.float64)

    return AF3Samples(seed=seed, positions=x.numpy().astype(np.float64),
                      plddt=plddt.numpy().astype(np.float64), pae=host("pae"), pde=host("pde"),
                      tm_global=host("tm_global"), tm_interface=host("tm_interface"),
                      contact_probs=host("contact_probs"),
                      frame_mask=torch.stack(frames)[:, :n].numpy().astype(bool))


def predict_af3(model, raw: dict[str, np.ndarray], *, seed: int = 0, **kwargs) -> AF3Prediction:
    """The sample of :func:`sample_af3` (same arguments) with the highest ranking score, as an
    ``AF3Prediction`` (``sample_plddt``: every sample's mean pLDDT)."""
    samples = sample_af3(model, raw, seed=seed, **kwargs)
    scores = [_sample_scores(samples, s, raw, device=kwargs.get("device"))["ranking_score"]
              for s in range(len(samples.positions))]
    best = int(np.nanargmax(scores)) if not np.isnan(scores).all() else 0
    return AF3Prediction(positions=samples.positions[best], plddt=samples.plddt[best],
                         sample_plddt=samples.plddt.mean(-1))


def _sample_scores(samples: AF3Samples, s: int, raw, atoms: dict | None = None, *,
                   device=None) -> dict:
    """pTM, ipTM, chain-pair ipTM, chain-pair minimum PAE and the ranking score of sample
    ``s`` (chains in the order of their ``asym_id``; ``atoms``: the written structure's atoms
    for the clash and disorder terms, else built here; ``device``: where the samples were
    predicted, as for :func:`~fold_train.confidence_outputs.structure_scores`)."""
    from fold_train.confidence import (
        chain_iptm,
        chain_pair_iptm,
        chain_pair_pae_min,
        predicted_tm,
        ranking_score,
    )
    from fold_train.confidence_outputs import structure_scores

    asym = np.asarray(raw["asym_id"])
    fm = samples.frame_mask[s]
    ptm = predicted_tm(samples.tm_global[s], fm)
    iptm = predicted_tm(samples.tm_global[s], fm, asym, interface=True)
    pair = chain_pair_iptm(samples.tm_interface[s], fm, asym)
    if atoms is None:
        atoms = _atoms_of_raw(samples.positions[s], samples.plddt[s], raw)
    scores = structure_scores(atoms, device)
    return {"ptm": ptm, "iptm": iptm, "chain_pair_iptm": pair,
            "chain_ptm": np.diagonal(pair).copy(), "chain_iptm": chain_iptm(pair),
            "chain_pair_pae_min": chain_pair_pae_min(samples.pae[s], fm, asym),
            **scores,
            "ranking_score": ranking_score(ptm, iptm, scores["fraction_disordered"],
                                           bool(scores["has_clash"]))}


def _atoms_of_raw(positions: np.ndarray, plddt: np.ndarray, raw) -> dict:
    """The atoms of a sample for :func:`~fold_train.confidence_outputs.structure_scores`
    without building its structure (residue names as the tokens' restype)."""
    from fold_data import residue_constants as rc

    tok = np.asarray(raw["atom_to_token"])
    chain = np.asarray(raw["asym_id"])[tok]
    residue = np.asarray(raw["residue_index"])[tok]
    protein = np.asarray(raw["is_protein"])[tok].astype(bool)
    polymer = protein | (np.asarray(raw["is_rna"]) + np.asarray(raw["is_dna"]))[tok].astype(bool)
    polymer &= ~np.asarray(raw["is_atomized"])[tok].astype(bool)
    names = np.array(["".join(chr(int(c) + 32) for c in row).strip()
                      for row in raw["ref_atom_name_chars"]])
    res_names = {}
    for c in np.unique(chain):
        sel = chain == c
        n_res = int(residue[sel].max()) + 1
        codes = ["UNK"] * n_res
        for r, a in zip(residue[sel], np.asarray(raw["restype"])[tok][sel], strict=True):
            if a < 20:  # amino acids in AF2 order (fold_data.af3.schema); others not protein
                codes[r] = rc.restype_1to3[rc.restypes[int(a)]]
        res_names[int(c)] = codes
    return {"positions": positions, "plddt": plddt, "chain": chain, "residue": residue,
            "atom_names": names, "polymer": polymer, "protein": protein,
            "res_names": res_names}


def af3_results(samples: AF3Samples, raw, entry, prov: dict, *, device=None) -> list:
    """One :class:`~fold_train.confidence_outputs.SampleResult` per sample: its structure,
    ``summary_confidences.json`` and ``confidences.json`` (AF3's keys; ``prov``: the
    provenance keys of :func:`~fold_train.confidence_outputs.provenance`; ``device``: as for
    :func:`_sample_scores`)."""
    from fold_data.af3.write import af3_prediction_to_structure

    from fold_train.confidence_outputs import (
        SampleResult,
        chain_keyed,
        json_number,
        rounded,
        structure_atoms,
    )

    asym = np.asarray(raw["asym_id"])
    _, first = np.unique(asym, return_index=True)
    chain_ids = [entry.chains[int(a)].chain_id for a in asym[np.sort(first)]]
    token_chain = [entry.chains[int(a)].chain_id for a in asym]
    tok = np.asarray(raw["atom_to_token"])
    results = []
    for s in range(len(samples.positions)):
        pred = AF3Prediction(positions=samples.positions[s], plddt=samples.plddt[s],
                             sample_plddt=samples.plddt.mean(-1))
        st = af3_prediction_to_structure(pred, raw, entry)
        atoms = structure_atoms(st)
        sc = _sample_scores(samples, s, raw, atoms, device=device)
        summary = {
            "ptm": json_number(sc["ptm"]), "iptm": json_number(sc["iptm"]),
            "ranking_score": json_number(sc["ranking_score"]),
            "fraction_disordered": json_number(sc["fraction_disordered"]),
            "has_clash": sc["has_clash"],
            "chain_ptm": chain_keyed(sc["chain_ptm"], chain_ids),
            "chain_iptm": chain_keyed(sc["chain_iptm"], chain_ids),
            "chain_pair_iptm": chain_keyed(sc["chain_pair_iptm"], chain_ids),
            "chain_pair_pae_min": chain_keyed(sc["chain_pair_pae_min"], chain_ids),
            "mean_plddt": json_number(samples.plddt[s].mean()),
            "seed": samples.seed, "sample": s, "model_family": "af3",
            "ranking_formula": "0.8 iptm + 0.2 ptm + 0.5 fraction_disordered - 100 has_clash "
                               "(ptm alone for one chain)",
            **prov}
        token_plddt = (np.bincount(tok, weights=samples.plddt[s], minlength=len(asym))
                       / np.maximum(np.bincount(tok, minlength=len(asym)), 1))
        full = {
            "atom_chain_ids": [chain_ids[c] for c in atoms["chain"]],
            "atom_plddts": rounded(np.clip(atoms["plddt"], 0.0, 99.99), 2),
            "contact_probs": rounded(np.clip(samples.contact_probs, 0.0, 1.0), 2),
            "pae": rounded(samples.pae[s], 1),
            "pde": rounded(samples.pde[s], 1),
            "token_chain_ids": token_chain,
            "token_plddts": rounded(token_plddt, 2),
            "token_res_ids": [int(r) + 1 for r in np.asarray(raw["residue_index"])],
        }
        # the structure's atoms are the raw atoms in raw order (af3_prediction_to_structure)
        results.append(SampleResult(samples.seed, s, st, summary, full,
                                    score=float(sc["ranking_score"])))
    return results



class AF3Runner:
    """AF3 prediction with one model, loaded once, for any number of inputs (``fold-train
    predict --json`` and ``--input-dir``): the checkpoint's model with its EMA weights, CUDA
    graphs through ``parallelize``, and one :class:`~fold_train.predict_graphs.AF3Predictor` whose
    graphs serve every input of a shape bucket.

    ``limits`` (``fold_data.limits.SizeLimits``) and ``memory_limit`` (bytes, default the
    device's free memory) size each entry before it is featurised: one too large is refused
    with the numbers and the options. ``cache_dir`` (``--cache``): each input's features kept
    in fold-data's feature cache under ``cache_dir/af3``, keyed by the bytes of the JSON, the
    files it names and the ``--ccd`` files (:func:`cache_inputs`)."""

    family = "af3"

    def __init__(self, checkpoint: str | os.PathLike, *, device: str | torch.device = "cpu",
                 use_ema: bool = True, ccd_files=(), no_samples: int | None = None,
                 no_steps: int | None = None, no_cycles: int | None = None,
                 cuda_graphs: bool | None = None, allow_outside_paths: bool = False,
                 memory_limit: int | None = None, limits=None, chunk_size: int | None = None,
                 autochunk=None, autochunk_min_chunk: int = 1,
                 sample_group: int | None = None, parallel=None,
                 cache_dir: str | os.PathLike | None = None) -> None:
        from fold_train.af3_data import af3_cache_dir, make_ccd
        from fold_train.families import make_family
        from fold_train.parallelize import Techniques, parallelize
        from fold_train.predict import load_trained_model
        from fold_train.predict_dap import single_process
        from fold_train.predict_graphs import AF3Predictor, graphs_wanted
        from fold_train.stage_timer import StageTimer

        self.checkpoint, self.device = checkpoint, torch.device(device)
        self.parallel = parallel or single_process()  # DAP: fold_train.predict_dap
        self.timer = StageTimer()  # the summary's "seconds"
        with self.timer("load"):
            self.model, self.cfg = load_trained_model(checkpoint, device, use_ema=use_ema,
                                                      family="af3")
        self.ccd, self.ccd_files = make_ccd(ccd_files), list(ccd_files)
        self.cache = None
        if cache_dir is not None:  # fold-data's content-addressed feature cache
            from fold_data.af3 import af3_cache

            self.cache = af3_cache(af3_cache_dir(cache_dir))
        self.cache_status: dict = {}  # the last prepare's {"cache": status}
        self.no_samples, self.no_steps, self.no_cycles = no_samples, no_steps, no_cycles
        self.allow_outside_paths, self.memory_limit, self.limits = (
            allow_outside_paths, memory_limit, limits)
        # chunking, AutoChunk and the samples in groups (docs/memory.md)
        done = parallelize(self.model, make_family("af3", self.cfg.model_config()),
                           self.parallel.adjust(Techniques(
                               cuda_graphs=graphs_wanted(cuda_graphs, device),
                               chunk_size=chunk_size, autochunk=autochunk,
                               autochunk_min_chunk=autochunk_min_chunk,
                               sample_group_size=sample_group)))
        self.done = done
        self.chunk_size, self.sample_group = chunk_size, sample_group
        # what the size check assumes: AutoChunk may go down to its smallest chunk
        self.check_chunk = chunk_size or (autochunk_min_chunk if autochunk is not None else None)
        self.cuda_graphs = done.cuda_graphs
        self.predictor = AF3Predictor(self.model, self.device, precision=self.cfg.system.precision,
                                      cuda_graphs=done.cuda_graphs)

    def _check(self, entry, ccd) -> None:  # sized before it is featurised
        from fold_train.predict_size import check_af3_input

        check_af3_input(entry, ccd, model_config=self.cfg.model_config(),
                        precision=self.cfg.system.precision, device=self.device,
                        no_samples=self.no_samples, memory_limit=self.memory_limit,
                        limits=self.limits, chunk_size=self.check_chunk,
                        sample_group=self.sample_group, dap=self.parallel.dap)

    def size(self, item) -> dict[str, int]:
        """``{"N_token": n}`` of an input of ``--input-dir``, parsed but not featurised (the
        batch's ordering by shape bucket)."""
        from fold_data.af3 import load_entry
        from fold_data.limits import entry_size

        entry = load_entry(item.path, ccd=self.ccd,
                           allow_outside_paths=self.allow_outside_paths)
        return {"N_token": int(entry_size(entry, self.ccd).n_tokens)}

    def prepare(self, source: str | os.PathLike, features: dict | None = None):
        """``(entry, raw features)`` of an AF3 JSON / mmCIF complex, sized first; bad input is
        an ``InputError`` naming the file and the record."""
        self.cache_status = {}
        with self.timer("features"):
            return make_af3_inputs(source, self.ccd,
                                   allow_outside_paths=self.allow_outside_paths,
                                   features=features, limits=self.limits, check=self._check,
                                   cache=self.cache, ccd_files=self.ccd_files,
                                   cache_status=self.cache_status)

    def run(self, item, *, seeds=None, out_dir=None) -> dict:
        """Predict one input of ``--input-dir`` (a :class:`~fold_train.predict_batch.BatchInput`)
        into ``out_dir``."""
        return self.predict_item(self.prepare_item(item), seeds=seeds, out_dir=out_dir)

    def prepare_item(self, item):
        """:meth:`run`'s first half: the entry parsed, sized and featurised (no collective:
        under DAP the ranks agree on this outcome before the model runs)."""
        entry, raw = self.prepare(item.path)
        return entry, raw, input_files(item.path)

    def predict_item(self, prepared, *, seeds=None, out_dir=None) -> dict:
        """:meth:`run`'s second half: the model on :meth:`prepare_item`'s result."""
        entry, raw, inputs = prepared
        return self.predict(entry, raw, inputs, seeds=seeds, out_dir=out_dir)

    def estimate(self, item):
        """``({"N_token": n}, one-device MemoryEstimate)`` of an input of ``--input-dir``,
        parsed but not featurised, with this runner's samples and chunking (what
        ``plan_batch`` shares out over the ranks: :mod:`fold_train.predict_batch_dap`)."""
        from fold_data.af3 import load_entry

        from fold_train.memory_estimate import fused_attention
        from fold_train.predict_size import af3_input_estimate

        entry = load_entry(item.path, ccd=self.ccd,
                           allow_outside_paths=self.allow_outside_paths)
        size, whole = af3_input_estimate(
            entry, self.ccd, model_config=self.cfg.model_config(),
            precision=self.cfg.system.precision, no_samples=self.no_samples,
            limits=self.limits, chunk_size=self.check_chunk, sample_group=self.sample_group,
            fused=fused_attention(self.device, self.cfg.system.precision))
        return {"N_token": int(size.n_tokens)}, whole

    def predict(self, entry, raw, inputs: list, *, seeds=None, out=None, out_dir=None) -> dict:
        """Every sample of every seed (``seeds``, else the JSON's ``modelSeeds``, else 0),
        ranked; the top one written to ``out`` (a file; the default ``<name>.cif`` in the
        current directory unless ``out_dir``) and all of them under ``out_dir/<name>/``
        (:mod:`fold_train.confidence_outputs`). ``inputs``: the input files (their sha256 go
        in the summaries). Returns the printed JSON summary."""
        from fold_data.errors import InputError

        from fold_train.confidence_outputs import (
            output_targets,
            provenance,
            rank,
            write_prediction,
        )
        from fold_train.outputs import check_prediction

        seeds = list(seeds) if seeds else ([int(s) for s in entry.seeds] or [0])
        path, target = output_targets(out, out_dir, entry.name)  # checked before the model runs
        prov = provenance(self.checkpoint, inputs)
        results = []
        for seed in seeds:
            try:
                with self.timer("model"):
                    samples = sample_af3(self.model, raw, seed=seed, device=self.device,
                                         precision=self.cfg.system.precision,
                                         no_samples=self.no_samples, no_steps=self.no_steps,
                                         no_cycles=self.no_cycles, predictor=self.predictor,
                                         parallel=self.parallel)
            except FloatingPointError as e:
                raise InputError(self.checkpoint, "prediction", f"{e}; the checkpoint has "
                                 "probably diverged: predict with an earlier checkpoint") from None
            for s in range(len(samples.positions)):
                check_prediction(samples.positions[s], samples.plddt[s], self.checkpoint)
            with self.timer("confidence"):  # ipTM, PAE, has_clash, fraction_disordered
                results += af3_results(samples, raw, entry, prov, device=self.device)
        ranked = rank(results)
        if self.parallel.writes:  # DAP: one rank writes
            with self.timer("write"):
                write_prediction(ranked, path, target)
        top = ranked[0]
        ligands = [c.chain_id for c in entry.chains if not c.is_polymer]
        return {"name": entry.name, "out": None if path is None else str(path),
                "out_dir": None if target is None else str(target),
                "seed": top.seed, "sample": top.sample, "seeds": seeds,
                "n_token": int(len(raw["asym_id"])), "n_atom": int(len(raw["atom_to_token"])),
                "chains": [c.chain_id for c in entry.chains], "ligand_chains": ligands,
                "mean_plddt": top.summary["mean_plddt"],
                "ptm": top.summary["ptm"], "iptm": top.summary["iptm"],
                "ranking_score": top.summary["ranking_score"],
                "cuda_graphs": self.cuda_graphs,
                "sample_mean_plddt": [r.summary["mean_plddt"] for r in results],
                "ranking": [[r.seed, r.sample, r.summary["ranking_score"]] for r in ranked],
                "chunking": self.chunking(), **self.cache_status,
                "seconds": self.timer.take()}

    def chunking(self) -> dict:
        """The summary's chunking: chunk size, sample group and each AutoChunk plan (made on
        the stack's first call)."""
        out: dict = {"chunk_size": self.chunk_size, "sample_group": self.sample_group}
        if self.done.autochunked:
            from fold_train.autochunk import autochunk_summary

            out["autochunk"] = autochunk_summary(self.done.autochunked)
        return out


def predict_af3_file(
    checkpoint: str | os.PathLike, source: str | os.PathLike, out: str | os.PathLike | None, *,
    device: str | torch.device = "cpu", use_ema: bool = True, ccd_files=(),
    no_samples: int | None = None, no_steps: int | None = None, no_cycles: int | None = None,
    cuda_graphs: bool | None = None,
    allow_outside_paths: bool = False,
    memory_limit: int | None = None,
    limits=None, features: dict | None = None, seeds=None, out_dir=None,
    chunk_size: int | None = None, autochunk=None, autochunk_min_chunk: int = 1,
    sample_group: int | None = None, parallel=None, cache_dir=None,
) -> dict:
    """The whole ``fold-train predict --json``: returns the printed JSON summary
    (:meth:`AF3Runner.predict`). Without ``out`` or ``out_dir`` the JSON's ``name``, made one
    safe file name, is written in the current directory; a diverged checkpoint's non-finite or
    absurd structure is refused, not written. ``chunk_size`` / ``autochunk`` (bytes or "auto")
    / ``sample_group``: see :class:`AF3Runner` and docs/memory.md. ``parallel``: this rank's
    :class:`~fold_train.predict_dap.PredictParallel` (DAP; only its writer writes).
    ``cache_dir``: ``--cache`` (:class:`AF3Runner`)."""
    runner = AF3Runner(checkpoint, device=device, use_ema=use_ema, ccd_files=ccd_files,
                       no_samples=no_samples, no_steps=no_steps, no_cycles=no_cycles,
                       cuda_graphs=cuda_graphs, allow_outside_paths=allow_outside_paths,
                       memory_limit=memory_limit, limits=limits, chunk_size=chunk_size,
                       autochunk=autochunk, autochunk_min_chunk=autochunk_min_chunk,
                       sample_group=sample_group, parallel=parallel, cache_dir=cache_dir)
    # bad input: InputError; features: searched MSAs / paired rows / templates (--search)
    entry, raw = runner.prepare(source, features=features)
    return runner.predict(entry, raw, input_files(source), seeds=seeds, out=out,
                          out_dir=out_dir)


def input_files(source: str | os.PathLike) -> list:
    """The files a prediction of ``source`` reads: the AF3 JSON (or mmCIF) and the files its
    ``...Path`` fields name (MSAs, templates, user CCD; relative to the JSON's directory), for
    the summary's sha256 of the inputs."""
    import json
    from pathlib import Path

    source = Path(source)
    files = [source]
    if source.suffix.lower() != ".json":
        return files
    try:
        doc = json.loads(source.read_text())
    except (OSError, ValueError):
        return files  # parsed (and refused) by load_entry before this is asked

    def walk(node) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(
            node if isinstance(node, list) else [])
        for key, value in items:
            if isinstance(key, str) and key.endswith("Path") and isinstance(value, str):
                path = source.parent / value
                if path.is_file() and path not in files:
                    files.append(path)
            else:
                walk(value)

    walk(doc)
    return files
