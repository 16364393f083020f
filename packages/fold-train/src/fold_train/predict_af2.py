"""AF2 prediction with confidences, one model for many inputs and seeds.

Each seed draws the inference sample's MSA clustering (``make_sample(seed=...)``); the model is
deterministic given it (no dropout in eval), so AF2 has one sample per seed. The confidences are
those of AF2's heads: per-residue pLDDT (supplement 1.9.6) and, for models with the pTM head
(AF2's ``_ptm`` models, 1.9.7), PAE and pTM. AF2 ranks a monomer's predictions by mean pLDDT
(AlphaFold2's ``ranking_confidence``), and so does fold: the summary's ``ranking_score`` is the
mean pLDDT (0-100), and ``ranking_formula`` says so. The output files and keys are AF3's
(:mod:`fold_train.confidence_outputs`); ``iptm`` is null (one chain).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

__all__ = ["AF2Runner", "af2_result"]


def af2_result(pred, name: str, seed: int, prov: dict, *, device=None):
    """The :class:`~fold_train.confidence_outputs.SampleResult` of one AF2 prediction (a
    ``fold_data.af2.write.Prediction``; ``device``: where it ran, as for
    :func:`~fold_train.confidence_outputs.structure_scores`)."""
    from fold_data.af2.write import prediction_to_structure

    from fold_train.confidence_outputs import (
        SampleResult,
        chain_keyed,
        json_number,
        rounded,
        structure_atoms,
        structure_scores,
    )

    st = prediction_to_structure(pred, name)
    atoms = structure_atoms(st)
    n = len(pred.aatype)
    ptm = np.nan if pred.ptm is None else float(pred.ptm)
    pae_min = np.nan if pred.pae is None else float(pred.pae.min())
    chains = ["A"]
    summary = {
        "ptm": json_number(ptm), "iptm": None,
        "ranking_score": json_number(float(pred.plddt.mean())),
        **{k: json_number(v) for k, v in structure_scores(atoms, device).items()},
        "chain_ptm": chain_keyed(np.array([ptm]), chains),
        "chain_iptm": {"A": None},
        "chain_pair_iptm": chain_keyed(np.array([[ptm]]), chains),
        "chain_pair_pae_min": chain_keyed(np.array([[pae_min]]), chains),
        "mean_plddt": json_number(float(pred.plddt.mean())),
        "seed": seed, "sample": 0, "model_family": "af2",
        "ranking_formula": "mean_plddt (AlphaFold2's ranking of monomers)",
        **prov}
    full = {
        "atom_chain_ids": ["A"] * len(atoms["plddt"]),
        "atom_plddts": rounded(np.clip(atoms["plddt"], 0.0, 99.99), 2),
        "contact_probs": (None if pred.contact_probs is None
                          else rounded(np.clip(pred.contact_probs, 0.0, 1.0), 2)),
        "pae": None if pred.pae is None else rounded(pred.pae, 1),
        "token_chain_ids": ["A"] * n,
        "token_plddts": rounded(pred.plddt, 2),
        "token_res_ids": list(range(1, n + 1)),
    }
    return SampleResult(seed, 0, st, summary, full, score=float(pred.plddt.mean()))


def _query_name(fasta, mmcif, chain) -> str:
    """The name ``make_raw_features`` gives a query (a cache hit skips it)."""
    if fasta is not None:
        from fold_train.predict import read_query

        return read_query(fasta)[0]
    return f"{Path(mmcif).stem}_{chain}"



class AF2Runner:
    """The AF2 model of a checkpoint, loaded once (EMA weights; chunking, AutoChunk and CUDA
    graphs through ``parallelize``) with one :class:`~fold_train.predict_graphs.AF2Predictor`
    whose graphs serve every input of a shape bucket."""

    family = "af2"

    def __init__(self, checkpoint: str | os.PathLike, *, device: str | torch.device = "cpu",
                 use_ema: bool = True, chunk_size: int | None = None, autochunk=None,
                 autochunk_min_chunk: int = 1, cuda_graphs: bool | None = None,
                 limits=None, memory_limit: int | None = None, recycles: int | None = None,
                 template_mmcif_dir: str | os.PathLike | None = None,
                 cache_dir: str | os.PathLike | None = None, msa_offload: bool = False,
                 parallel=None) -> None:
        from fold_train.families import make_family
        from fold_train.parallelize import Techniques, parallelize
        from fold_train.predict import load_trained_model
        from fold_train.predict_dap import single_process
        from fold_train.predict_graphs import AF2Predictor, graphs_wanted
        from fold_train.stage_timer import StageTimer

        self.checkpoint, self.device = checkpoint, torch.device(device)
        self.parallel = parallel or single_process()  # DAP / BP: fold_train.predict_dap
        self.timer = StageTimer()  # the summary's "seconds"
        with self.timer("load"):
            self.model, self.cfg = load_trained_model(checkpoint, device, use_ema=use_ema,
                                                      family="af2")
        self.done = parallelize(self.model, make_family("af2", self.cfg.model_config()),
                                self.parallel.adjust(Techniques(
                                    chunk_size=chunk_size, autochunk=autochunk,
                                    autochunk_min_chunk=autochunk_min_chunk,
                                    cuda_graphs=graphs_wanted(cuda_graphs, device),
                                    msa_offload=msa_offload)))
        self.msa_offload = msa_offload
        self.chunk_size = chunk_size or (autochunk_min_chunk if autochunk is not None else None)
        self.limits, self.memory_limit, self.recycles = limits, memory_limit, recycles
        self.template_mmcif_dir = template_mmcif_dir
        self.cache = None
        if cache_dir is not None:  # fold-data's content-addressed feature cache
            from fold_data.cache import FeatureCache

            self.cache = FeatureCache(cache_dir)
        self.predictor = AF2Predictor(self.model, self.device,
                                      precision=self.cfg.system.precision,
                                      cuda_graphs=self.done.cuda_graphs)

    def prepare(self, *, fasta=None, mmcif=None, chain=None, msas=(), templates=None):
        """``(name, raw features, has ground truth)``, sized first (data limits, device
        memory): one too large is refused before any feature is made."""
        from fold_data.limits import use_limits

        from fold_train.predict import make_raw_features
        from fold_train.predict_size import check_af2_input

        check_af2_input(fasta=fasta, mmcif=mmcif, chain=chain, msas=list(msas),
                        model_config=self.cfg.model_config(), data_preset=self.cfg.data_preset(),
                        precision=self.cfg.system.precision, device=self.device,
                        limits=self.limits, memory_limit=self.memory_limit,
                        chunk_size=self.chunk_size, msa_offload=self.msa_offload,
                        dap=self.parallel.dap)
        def build():
            with use_limits(self.limits):
                return make_raw_features(fasta=fasta, mmcif=mmcif, chain=chain, msas=list(msas),
                                         template_hits=templates,
                                         template_mmcif_dir=self.template_mmcif_dir)

        if self.cache is None:
            with self.timer("features"):
                return build()
        # keyed by the bytes of the query, MSA and hit files (fold_data.cache); the template
        # mmCIFs the hits point to by the directory's path
        inputs = [p for p in (fasta, mmcif, *msas, templates) if p is not None]
        params = {"use": "predict-af2", "chain": chain,
                  "template_mmcif_dir": None if self.template_mmcif_dir is None
                  else os.path.abspath(self.template_mmcif_dir)}
        made = {}

        def build_raw():
            made["name"], raw, _ = build()
            return raw

        with self.timer("features"):
            result = self.cache.fetch(str(Path(inputs[0]).stem), inputs, params, build_raw)
        name = made.get("name") or _query_name(fasta, mmcif, chain)
        return name, result.features, mmcif is not None

    def predict(self, name: str, raw, has_truth: bool, inputs: list, *, seeds=None, out=None,
                out_dir=None) -> dict:
        """One prediction per seed (default 0), ranked by mean pLDDT; the top one written to
        ``out`` (default ``<name>.cif`` in the current directory unless ``out_dir``), all under
        ``out_dir/<name>/``. Returns the printed JSON summary."""
        from fold_train.confidence_outputs import (
            output_targets,
            provenance,
            rank,
            write_prediction,
        )
        from fold_train.outputs import check_prediction
        from fold_train.predict import predict_structure, score_against_truth

        seeds = list(seeds) if seeds else [0]
        path, target = output_targets(out, out_dir, name)  # checked before the model runs
        prov = provenance(self.checkpoint, inputs)
        results, preds = [], {}
        for seed in seeds:
            with self.timer("model"):
                pred = predict_structure(self.model, raw, self.cfg.data_preset(),
                                         device=self.device,
                                         precision=self.cfg.system.precision,
                                         num_recycles=self.recycles, seed=seed,
                                         predictor=self.predictor)
            check_prediction(pred.positions, pred.plddt, self.checkpoint, pred.atom_mask > 0.5)
            preds[seed] = pred
            with self.timer("confidence"):  # pTM, PAE, has_clash, fraction_disordered
                results.append(af2_result(pred, name, seed, prov, device=self.device))
        ranked = rank(results)
        if self.parallel.writes:  # DAP: one rank writes
            with self.timer("write"):
                write_prediction(ranked, path, target)
        top = preds[ranked[0].seed]
        summary: dict = {"name": name, "out": None if path is None else str(path),
                         "out_dir": None if target is None else str(target),
                         "seed": ranked[0].seed, "seeds": seeds, "n_res": len(top.aatype),
                         "mean_plddt": float(top.plddt.mean()),
                         "ranking_score": ranked[0].summary["ranking_score"],
                         "cuda_graphs": self.done.cuda_graphs,
                         "ranking": [[r.seed, r.sample, r.summary["ranking_score"]]
                                     for r in ranked]}
        if top.ptm is not None:  # pTM models (AF2's _ptm)
            summary.update(ptm=top.ptm, mean_pae=float(top.pae.mean()), max_pae=top.max_pae)
        if self.done.autochunked:
            from fold_train.autochunk import autochunk_summary

            summary["autochunk"] = autochunk_summary(self.done.autochunked)
        if has_truth:
            summary.update(score_against_truth(top, raw))
        summary["seconds"] = self.timer.take()
        return summary

    # -- fold-train predict --input-dir ----------------------------------------------------------
    def size(self, item) -> dict[str, int]:
        """``{"N_res": n}`` of an input of ``--input-dir`` (the FASTA's first record, or the
        mmCIF chain), read but not featurised."""
        from fold_train.predict_size import _af2_size

        _, size = _af2_size(item.fasta, item.mmcif, item.chain, item.msas)
        return {"N_res": int(size.n_tokens)}

    def estimate(self, item):
        """``({"N_res": n}, one-device MemoryEstimate)`` of an input of ``--input-dir``, read
        but not featurised, with this runner's chunking (what ``plan_batch`` shares out over
        the ranks of a torchrun job: :mod:`fold_train.predict_batch_dap`)."""
        from fold_train.memory_estimate import fused_attention
        from fold_train.predict_size import af2_input_estimate

        _, size, whole = af2_input_estimate(
            fasta=item.fasta, mmcif=item.mmcif, chain=item.chain, msas=item.msas,
            model_config=self.cfg.model_config(), data_preset=self.cfg.data_preset(),
            precision=self.cfg.system.precision, chunk_size=self.chunk_size,
            msa_offload=self.msa_offload, limits=self.limits,
            fused=fused_attention(self.device, self.cfg.system.precision))
        return {"N_res": int(size.n_tokens)}, whole

    def run(self, item, *, seeds=None, out_dir=None) -> dict:
        """Predict one input of ``--input-dir`` (a :class:`~fold_train.predict_batch.BatchInput`)
        into ``out_dir``."""
        return self.predict_item(self.prepare_item(item), seeds=seeds, out_dir=out_dir)

    def prepare_item(self, item):
        """:meth:`run`'s first half: the input read, sized and featurised (no collective: under
        DAP the ranks agree on this outcome before the model runs)."""
        name, raw, has_truth = self.prepare(fasta=item.fasta, mmcif=item.mmcif,
                                            chain=item.chain, msas=item.msas,
                                            templates=item.templates)
        del name  # a FASTA header may repeat across files: the batch names inputs by file
        inputs = [item.path, *item.msas, *([item.templates] if item.templates else [])]
        return item.name, raw, has_truth, inputs

    def predict_item(self, prepared, *, seeds=None, out_dir=None) -> dict:
        """:meth:`run`'s second half: the model on :meth:`prepare_item`'s result."""
        name, raw, has_truth, inputs = prepared
        return self.predict(name, raw, has_truth, inputs, seeds=seeds, out_dir=out_dir)
