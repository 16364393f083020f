"""AlphaFold2 (supplement 1.11): ``fold_model.af2.AlphaFold2`` and ``AlphaFold2Loss``, samples
``{name: [R, ...]}`` of fold-data's chain cache with the recycling dimension, the loss on the last
pass's ground truth, lDDT-Ca of each step and structure metrics on evaluation.

Presets (AF2 supplement 1.11, Table 4):

* ``af2_initial``: Adam lr 1e-3 with 1000 warm-up steps, clipping 0.1, EMA 0.999, global batch
  128 (one sample per GPU on 128 GPUs), bf16, about 10 M samples (78 125 steps).
* ``af2_finetune``: lr 5e-4, no warm-up, crop 384, about 1.5 M samples (11 719 steps).
* ``tiny``: the CPU preset of the tests and the demo: few steps, fp32, a short warm-up and a fast
  EMA (0.9) so that a run of a few dozen steps has a meaningful average.

The training preset's name is also the fold-model and fold-data preset's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fold_train.families.base import Family

__all__ = ["AF2Family", "evaluate_model"]

_CA = 1  # atom37 index
# Table 4: 10 M samples at batch 128 (initial), 1.5 M at lr 5e-4 without warm-up (fine-tuning);
# bf16 (as HelixFold / ScaleFold train).
_LONG_RUN = {"run": {"batch_size": 1, "checkpoint_every": 1000, "keep_checkpoints": 3,
                     "log_every": 10, "eval_every": 1000},
             "system": {"precision": "bf16"}, "data": {"workers": 4, "prefetch": 8}}


def _last_pass(batch: dict[str, torch.Tensor], n_cycle: int) -> dict[str, torch.Tensor]:
    """Ground truth and features of pass ``n_cycle`` (``[B, R, ...]`` -> ``[B, ...]``)."""
    return {k: v[:, n_cycle - 1] for k, v in batch.items()}


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, samples: Sequence[tuple[str, dict[str, np.ndarray]]],
    device: torch.device, *, precision: str = "fp32",
) -> dict[str, float]:
    """Structure metrics of ``model`` (in eval mode, all recycling passes) on inference samples
    ``[(name, sample)]``: per chain and averaged lDDT-Ca, TM-score, GDT-TS, GDT-HA, RMSD (CA)."""
    from fold_train import metrics
    from fold_train.data import collate
    from fold_train.runtime import autocast

    was_training = model.training
    model.eval()
    out: dict[str, list[float]] = {}
    per_chain: dict[str, float] = {}
    try:
        for name, sample in samples:
            batch = {k: v.to(device, non_blocking=True) for k, v in collate([sample]).items()}
            with autocast(device, precision):
                pred = model(batch)["final_atom_positions"][0, :, _CA].float().cpu().numpy()
            last = _last_pass(batch, batch["aatype"].shape[1])
            true = last["all_atom_positions"][0, :, _CA].float().cpu().numpy()
            mask = (last["all_atom_mask"][0, :, _CA] * last["seq_mask"][0]).cpu().numpy()
            if mask.sum() < 3:
                continue
            scores = {
                "lddt_ca": metrics.lddt_ca(pred, true, mask),
                "tm_score": metrics.tm_score(pred, true, mask),
                "gdt_ts": metrics.gdt_ts(pred, true, mask),
                "gdt_ha": metrics.gdt_ha(pred, true, mask),
                "rmsd": metrics.rmsd(pred, true, mask),
            }
            for k, v in scores.items():
                out.setdefault(k, []).append(float(v))
                per_chain[f"{name}/{k}"] = float(v)
    finally:
        model.train(was_training)
    result = {f"eval/{k}": float(np.mean(v)) for k, v in out.items()}
    result.update({f"eval/{k}": v for k, v in per_chain.items()})
    return result


class AF2Family(Family):
    """AlphaFold2: ``fold_model.af2.AlphaFold2`` and ``AlphaFold2Loss``."""

    name = "af2"
    presets = {
        "af2_initial": {**_LONG_RUN, "run": {**_LONG_RUN["run"], "steps": 78_125}},
        "af2_finetune": {**_LONG_RUN, "run": {**_LONG_RUN["run"], "steps": 11_719},
                         "optim": {"lr": 5e-4, "warmup_steps": 0}},
        "tiny": {"run": {"steps": 20, "checkpoint_every": 10},
                 "system": {"precision": "fp32"},
                 "optim": {"lr": 1e-3, "warmup_steps": 5, "ema_decay": 0.9}},
    }
    seeded_noise = False  # no diffusion noise: the loop passes no generator
    input_hint = "a FASTA or an mmCIF chain (--fasta / --mmcif)"
    unit = "chain"
    branch_parallel = True
    input_args = ("fasta", "mmcif")
    extent_masks = {"N_res": "seq_mask", "N_clust": "msa_mask", "N_extra": "extra_msa_mask",
                    "N_templ": "template_mask"}
    autochunk_names = ("evoformer", "extra_msa_stack")

    @staticmethod
    def _templates_one_at_a_time(model) -> None:
        """Long-input modes also run the templates through their pair stack one at a time
        (``--chunk-size`` sets it through the model's chunking)."""
        if model.template_embedder is not None:
            model.template_embedder.one_template_at_a_time = True

    def set_msa_offload(self, model, offload: bool) -> None:
        model.set_msa_offload(offload)
        if offload:
            self._templates_one_at_a_time(model)

    def enable_autochunk(self, model, memory_budget, min_chunk: int = 1) -> dict:
        out = super().enable_autochunk(model, memory_budget, min_chunk)
        self._templates_one_at_a_time(model)
        return out
    table_columns = (("fape", "fape"), ("aux", "aux"), ("distogram", "distogram"),
                     ("masked_msa", "masked_msa"), ("plddt", "plddt"), ("lddt_ca", "lDDT-Ca"))

    # -- configuration --------------------------------------------------------------------------
    @classmethod
    def model_config_of(cls, cfg):
        from fold_model.af2 import config

        overrides = {k.replace(".", "__"): v for k, v in cfg.model.overrides.items()}
        if isinstance(cfg.system.activation_checkpointing, bool):  # auto: preset's, planned
            overrides["checkpoint_blocks"] = cfg.system.activation_checkpointing
        return config(cfg.run.preset, **overrides)

    @classmethod
    def data_preset_base(cls, cfg):
        from fold_data.af2 import get_preset

        return get_preset(cfg.run.preset)

    @classmethod
    def data_preset(cls, cfg):
        """Its ``max_recycling_iters`` is the run's when set."""
        base = cls.data_preset_base(cfg)
        changes = dict(cfg.data.overrides)
        if cfg.run.max_recycling_iters is not None:
            changes["max_recycling_iters"] = cfg.run.max_recycling_iters
        return dataclasses.replace(base, **changes) if changes else base

    # -- model and loss -------------------------------------------------------------------------
    def build_model(self, model_config) -> torch.nn.Module:
        from fold_model.af2 import AlphaFold2

        return AlphaFold2(model_config)

    def to_bf16_weights(self, model) -> None:
        """Embedders and the Evoformer / extra MSA / template stacks in bf16; the structure
        module and the heads stay fp32 (fold-model runs the structure module in fp32 and feeds
        its fp32 single to the pLDDT head)."""
        model.to(torch.bfloat16)
        model.structure_module.float()
        model.aux_heads.float()

    def make_loss(self, model, model_config):
        from fold_model.af2.loss import AlphaFold2Loss

        return AlphaFold2Loss(model_config.loss)

    def n_cycle_max(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["aatype"].shape[1])  # R recycling feature sets

    def forward_loss(self, model, loss_fn, batch, n_cycle: int):
        out = model(batch, num_recycles=n_cycle)
        loss, terms = loss_fn(out, _last_pass(batch, n_cycle))
        return loss, terms, {"final_atom_positions": out["final_atom_positions"].detach()}

    def step_metrics(self, batch, n_cycle: int, aux: dict[str, torch.Tensor]) -> dict[str, float]:
        from fold_model.af2.metrics import lddt_ca

        last = _last_pass(batch, n_cycle)
        with torch.no_grad():
            lddt = lddt_ca(aux["final_atom_positions"].float(),
                           last["all_atom_positions"].float(),
                           last["all_atom_mask"].float() * last["seq_mask"][..., None],
                           per_residue=False)
        return {"lddt_ca": float(lddt.mean())}

    def evaluate(self, model, samples, device, precision: str) -> dict[str, float]:
        return evaluate_model(model, samples, device, precision=precision)

    # -- parallelize hooks ----------------------------------------------------------------------
    def _msa_stacks(self, model) -> list[torch.nn.Module]:
        stacks = [model.evoformer]
        if model.config.extra_msa.enabled:
            stacks.append(model.extra_msa_stack)
        return stacks

    def dap_stacks(self, model) -> list[torch.nn.Module]:
        """The Evoformer, extra MSA and template pair stacks."""
        stacks = self._msa_stacks(model)
        if model.template_embedder is not None:
            stacks.append(model.template_embedder.pair_stack)
        return stacks

    def bp_stacks(self, model) -> list[torch.nn.Module]:
        """The Evoformer and extra MSA stacks (the Parallel Evoformer's two branches)."""
        if model.config.block_order != "parallel":
            raise ValueError("branch parallelism (bp=2) needs the Parallel Evoformer: set "
                             "model.block_order=parallel")
        return self._msa_stacks(model)

    def compile(self, model) -> None:
        # memory-bound: many small elementwise ops that fuse well (ScaleFold 3.3)
        model.structure_module.compile()

    # -- data ------------------------------------------------------------------------------------
    @classmethod
    def open_cache(cls, data_dir, cache_dir, ctx, *, chains, workers, ccd, progress,
                   limits=None):
        """fold-data's chain cache, built by rank 0 for as long as it takes; the others wait
        (:func:`fold_train.rank_sync.run_on_rank0`: a failure on rank 0 is reported on every
        rank, a stalled rank is named), then read its index."""
        from fold_train.data import open_cache
        from fold_train.rank_sync import run_on_rank0

        return run_on_rank0(
            ctx, "build the feature cache",
            lambda: open_cache(data_dir, cache_dir, chains=chains, workers=workers,
                               progress=progress, limits=limits),
            after=lambda: open_cache(None, cache_dir, chains=chains, verify=False))

    @classmethod
    def load_sample(cls, cache_dir, name, key, preset, seed):
        from fold_data.af2 import make_sample
        from fold_data.cache import FeatureCache

        raw = _load(FeatureCache(cache_dir), name, key)
        return make_sample(raw, preset, seed=seed, training=True)

    @classmethod
    def eval_samples(cls, cache_dir, entries, preset, ctx):
        from fold_data.af2 import make_sample
        from fold_data.cache import FeatureCache
        from fold_data.errors import InputError

        cache = FeatureCache(cache_dir)
        out = []
        for name, key in entries:
            raw = cache.load(key)
            if raw is None:
                raise InputError(Path(cache_dir) / f"{key}.npz", name,
                                 "expected a valid cache entry")
            out.append((name, make_sample(raw, preset, seed=0, training=False)))
        return out

    # -- prediction ------------------------------------------------------------------------------
    @classmethod
    def _check_predict_args(cls, args) -> None:
        from fold_train.errors import ConfigError

        if getattr(args, "autochunk", None) is not None and args.chunk_size:
            raise ConfigError("--autochunk and --chunk-size are alternatives: give one of them")
        if args.templates and not args.template_mmcif_dir:
            raise ConfigError(f"--templates {args.templates} needs --template-mmcif-dir (the "
                              "directory of the hits' <pdb>.cif files)")
        if (getattr(args, "samples", None) or 1) > 1:
            raise ConfigError("--samples is for AF3 (diffusion samples); an AF2 model gives one "
                              "prediction per seed: use --seeds 1,2,3")
        if getattr(args, "sample_group", None):
            raise ConfigError("--sample-group is for AF3 (diffusion samples)")

    @classmethod
    def predict_runner(cls, args, device: str):
        """The model loaded once (``fold-train predict --input-dir``, and one input):
        :class:`~fold_train.predict_af2.AF2Runner`."""
        from fold_data.limits import limits_from_args

        from fold_train.predict_af2 import AF2Runner

        cls._check_predict_args(args)
        return AF2Runner(
            args.checkpoint, device=device, use_ema=not args.no_ema, chunk_size=args.chunk_size,
            autochunk=getattr(args, "autochunk", None),
            autochunk_min_chunk=getattr(args, "autochunk_min_chunk", 1),
            cuda_graphs=False if getattr(args, "no_cuda_graphs", False) else None,
            limits=limits_from_args(args), memory_limit=getattr(args, "memory_limit", None),
            recycles=args.recycles, template_mmcif_dir=args.template_mmcif_dir,
            cache_dir=getattr(args, "cache", None),
            msa_offload=getattr(args, "msa_offload", False),
            parallel=getattr(args, "parallel", None))  # DAP / BP: fold_train.predict_dap

    @classmethod
    def predict(cls, args, device: str) -> dict:
        """One chain from a FASTA or an mmCIF chain (scored against it), with its MSAs and
        template hits, for each of ``--seeds``; chunking, AutoChunk and CUDA graphs through
        ``parallelize``."""
        runner = cls.predict_runner(args, device)
        name, raw, has_truth = runner.prepare(fasta=args.fasta, mmcif=args.mmcif,
                                              chain=args.chain, msas=args.msa or [],
                                              templates=args.templates)
        inputs = [p for p in (args.fasta, args.mmcif, *(args.msa or []), args.templates) if p]
        return runner.predict(name, raw, has_truth, inputs, seeds=getattr(args, "seeds", None),
                              out=args.out, out_dir=getattr(args, "out_dir", None))

    # -- shape buckets ---------------------------------------------------------------------------
    @classmethod
    def bucket_schema(cls):
        """``(SAMPLE_FEATURES, fill value per feature, features padded with identity frames)``."""
        from fold_data.af2.schema import SAMPLE_FEATURES
        from fold_data.af2.transforms import FRAME_FEATURES, PAD_VALUES

        return SAMPLE_FEATURES, dict(PAD_VALUES), tuple(FRAME_FEATURES)


def _load(cache, name: str, key: str):
    """A cache entry's raw features, or an :class:`InputError` naming it."""
    from fold_data.errors import InputError

    raw = cache.load(key)
    if raw is None:
        raise InputError(cache.path(key), name,
                         "expected a valid cache entry (missing or corrupt: rebuild the cache)")
    return raw
