"""AlphaFold3 (supplement 3-4, Alg. 1): ``fold_model.af3.AlphaFold3`` and its own loss, samples
``{name: [...]}`` of fold-data's AF3 complex cache (:mod:`fold_train.af3_data`) without the
recycling dimension.

``N_cycle`` is drawn from ``1..no_cycles`` (section 3.4); the loss (diffusion on ``no_samples``
noised copies, distogram, confidence on the mini-rollout) is logged with its parts; evaluation is
the loss of the held-out samples on fixed noise draws (the diffusion loss needs no sampling, so
it is a cheap, deterministic score).

Presets (model from ``fold_model.af3``, samples from ``fold_data.af3``; AF3 supplement section
5.4 for the optimizer):

* ``af3``: Adam (beta1 0.9, beta2 0.95, eps 1e-8), learning rate 1.8e-3 linearly warmed up over
  1000 steps then x0.95 every 50 000 steps, gradients clipped to global norm 10, EMA 0.999, bf16;
  the ``af3`` model preset and the ``af3_initial`` data preset (crops of 384 tokens). The
  mini-batch of 256 is one sample per GPU on 256 GPUs; bf16 as MegaFold trains; ``steps``: a
  long run's default, set it to the compute budget.
* ``af3_tiny``: the CPU preset of the AF3 tests: fold-model's ``tiny`` AF3, crops of 72 tokens /
  192 atoms, fp32, lr 5e-3 with a 5-step warm-up, EMA 0.9.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from fold_train.families.base import Family

__all__ = ["AF3Family", "AF3_PRESETS"]

# Training preset -> (fold-model preset, fold-data preset).
AF3_PRESETS = {"af3": ("af3", "af3_initial"), "af3_tiny": ("tiny", "af3_tiny")}
# --autochunk: pair rows per block of the diffusion's pair conditioning and the confidence
# head's PAE / PDE reduction (not traced stacks; at 6144 tokens a block's temporaries ~2 GiB)
AUTOCHUNK_PAIR_ROWS = 128
_PAIRS = "loss_pairs"  # prefix of the loss's pair lists among the static graph inputs
_AF3_ADAM = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "clip_norm": 10.0}


class _AF3Loss(torch.nn.Module):
    """``AlphaFold3.loss`` as a module (so a run can wrap or replace it like AF2's loss)."""

    def __init__(self, model) -> None:
        super().__init__()
        self._model = [model]  # not a submodule: its parameters belong to the model

    def forward(self, out, batch, pairs=None):
        return self._model[0].loss(out, batch, pairs)


class AF3Family(Family):
    """AlphaFold3: ``fold_model.af3.AlphaFold3`` and its loss (``AlphaFold3.loss``)."""

    name = "af3"
    presets = {
        "af3": {"run": {"steps": 150_000, "batch_size": 1, "checkpoint_every": 1000,
                        "keep_checkpoints": 3, "log_every": 10},
                "system": {"precision": "bf16"}, "data": {"workers": 4, "prefetch": 8},
                "optim": {"lr": 1.8e-3, "warmup_steps": 1000, "decay_factor": 0.95,
                          "decay_every": 50_000, "ema_decay": 0.999, **_AF3_ADAM}},
        "af3_tiny": {"run": {"steps": 20, "checkpoint_every": 10},
                     "system": {"precision": "fp32"},
                     "optim": {"lr": 5e-3, "warmup_steps": 5, "ema_decay": 0.9, **_AF3_ADAM}},
    }
    seeded_noise = True  # forward_loss takes the step's noise generator (loop.noise_seed)
    eval_noise_seeds = (0, 1, 2, 3)  # the fixed noise draws of the evaluation loss
    input_hint = "an AlphaFold3 input JSON (--json)"
    unit = "complex"
    run_label = "AF3 preset"
    input_args = ("json",)
    table_columns = (("diffusion", "diffusion"), ("distogram", "distogram"),
                     ("confidence", "confidence"))
    extent_masks = {"N_token": "token_mask", "N_atom": "atom_mask", "N_msa": "msa_mask",
                    "N_templ": "template_mask"}

    # -- configuration --------------------------------------------------------------------------
    @classmethod
    def model_config_of(cls, cfg):
        from fold_model.af3 import config as af3_config

        overrides = {k.replace(".", "__"): v for k, v in cfg.model.overrides.items()}
        if isinstance(cfg.system.activation_checkpointing, bool):  # auto: preset's, planned
            overrides["checkpoint"] = cfg.system.activation_checkpointing
        if cfg.run.max_recycling_iters is not None:
            overrides["no_cycles"] = cfg.run.max_recycling_iters + 1
        return af3_config(AF3_PRESETS[cfg.run.preset][0], **overrides)

    @classmethod
    def data_preset_base(cls, cfg):
        from fold_train.af3_data import af3_data_preset

        return af3_data_preset(AF3_PRESETS[cfg.run.preset][1])

    @classmethod
    def data_preset(cls, cfg):
        base = cls.data_preset_base(cfg)
        return dataclasses.replace(base, **cfg.data.overrides) if cfg.data.overrides else base

    @classmethod
    def check_config(cls, cfg) -> None:
        from fold_train.errors import ConfigError

        if cfg.run.preset not in AF3_PRESETS:
            raise ConfigError(f"AF3 preset {cfg.run.preset!r} unknown; AF3 presets are "
                              f"{sorted(AF3_PRESETS)}")
        unsupported = [n for n, bad in (("bp", cfg.parallel.bp > 1),
                                        ("compile_structure_module",
                                         cfg.system.compile_structure_module)) if bad]
        if unsupported:
            raise ConfigError(f"{', '.join(unsupported)}: not supported for AF3 training "
                              "(AF2 only)")

    @classmethod
    def check_data(cls, cfg, data_preset) -> None:
        """Under DAP the padded crop's tokens and MSA rows are split over the ``dap`` ranks: both
        must be fixed (a cropping preset) and multiples of ``dap``."""
        from fold_train.errors import ConfigError

        dap = cfg.parallel.dap
        if dap == 1:
            return
        for name in ("n_token", "n_msa"):
            size = getattr(data_preset, name)
            if size is None or size % dap:
                raise ConfigError(f"dap={dap} for AF3 needs data.{name} to be a multiple of "
                                  f"{dap} (the crop is split over the DAP ranks), got {size}")

    def build_model(self, model_config) -> torch.nn.Module:
        from fold_model.af3 import AlphaFold3

        return AlphaFold3(model_config)

    def to_bf16_weights(self, model) -> None:
        """The Pairformer, MSA module, template embedder and diffusion transformer in bf16; the
        embedders, conditioning, atom encoder/decoder and heads keep fp32 weights, so the
        single/pair streams and every coordinate stay fp32."""
        for stack in (model.pairformer, model.msa_module, model.template_embedder,
                      model.diffusion.transformer):
            if stack is not None:
                stack.to(torch.bfloat16)

    def make_loss(self, model, model_config):
        return _AF3Loss(model)

    def n_cycle_max(self, batch: dict[str, torch.Tensor]) -> int:
        return int(self.model_config.no_cycles)

    def loss_inputs(self, batch: dict[str, torch.Tensor]):
        """The loss's atom-pair lists (``fold_model.af3.loss.LossPairs``): functions of the
        ground truth, built before a captured step (their length depends on the data)."""
        from fold_model.af3.loss import loss_pair_lists

        return loss_pair_lists(batch, self.model_config.loss)

    def static_loss_inputs(self, batch, capacities):
        """The pair lists padded to fixed capacities (one set per shape bucket); lists that
        outgrow them get new capacities (with 25% headroom, so this is rare)."""
        pairs = self.loss_inputs(batch)
        counts = (pairs.lddt.n_pairs, None if pairs.bond is None else pairs.bond.n_pairs)
        note = None
        if capacities is None or any(n is not None and n > c
                                     for n, c in zip(counts, capacities)):
            if capacities is not None:
                note = (f"the loss's pair lists ({pairs.lddt.n_pairs} lDDT pairs) outgrew the "
                        f"captured capacities {capacities}")
            capacities = pairs.capacities()
        return pairs.padded(*capacities).tensors(_PAIRS), capacities, note

    def split_static_inputs(self, static):
        from fold_model.af3.loss import LossPairs

        batch, pairs = LossPairs.split(static, _PAIRS)
        return batch, {"pairs": pairs}

    def forward_loss(self, model, loss_fn, batch, n_cycle: int, generator=None, pairs=None):
        out = model(batch, no_cycles=n_cycle, generator=generator)
        loss, parts = loss_fn(out, batch, pairs)
        terms = {k: v for k, v in parts.items() if k != "loss"}
        terms["loss"] = loss
        return loss, terms, {}

    def step_metrics(self, batch, n_cycle: int, aux) -> dict[str, float]:
        return {"n_token": float(batch["token_mask"].sum(-1).float().mean()),
                "n_atom": float(batch["atom_mask"].sum(-1).float().mean())}

    @torch.no_grad()
    def fixed_noise_loss(self, model, batch, *, n_cycle: int | None = None,
                         seeds: Sequence[int] | None = None) -> dict[str, float]:
        """The training loss (and its parts) of ``batch`` averaged over fixed noise draws: the
        model in training mode (so it returns the denoised copies), every random draw from a
        generator seeded by ``seed`` and the global RNG (dropout) forked and seeded too, so two
        calls with the same weights give the same number."""
        seeds = tuple(seeds or self.eval_noise_seeds)
        was_training = model.training
        model.train()
        total: dict[str, float] = {}
        devices = [batch["token_mask"].device] if batch["token_mask"].is_cuda else []
        try:
            for seed in seeds:
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    gen = torch.Generator(batch["token_mask"].device).manual_seed(seed)
                    out = model(batch, no_cycles=n_cycle or self.model_config.no_cycles,
                                generator=gen)
                    loss, parts = model.loss(out, batch)
                for k, v in {**parts, "loss": loss}.items():
                    total[k] = total.get(k, 0.0) + float(v) / len(seeds)
        finally:
            model.train(was_training)
        return total

    def evaluate(self, model, samples, device, precision: str) -> dict[str, float]:
        from fold_train.data import collate
        from fold_train.runtime import autocast

        per: dict[str, list[float]] = {}
        result: dict[str, float] = {}
        for name, sample in samples:
            batch = {k: v.to(device) for k, v in collate([sample]).items()}
            with autocast(torch.device(device), precision):
                scores = self.fixed_noise_loss(model, batch)
            for k, v in scores.items():
                per.setdefault(k, []).append(v)
                result[f"eval/{name}/{k}"] = v
        result.update({f"eval/{k}": float(np.mean(v)) for k, v in per.items()})
        return result

    # -- parallelize hooks ----------------------------------------------------------------------
    # the traceable stacks AutoChunk wraps (fold-train predict --autochunk); the template
    # embedder's pair stack is wrapped by enable_autochunk below (its forward reads a dict)
    autochunk_names = ("msa_module", "pairformer", "diffusion.transformer",
                       "confidence_head.pairformer")

    def set_sample_groups(self, model, group_size: int | None) -> None:
        model.set_sample_group_size(group_size)

    def enable_autochunk(self, model, memory_budget, min_chunk: int = 1) -> dict:
        """The stacks of ``autochunk_names`` and the template embedder's pair stack (as a
        ``fold_model.af3.template.TemplatePairStack`` of its blocks, run through the wrapper)."""
        from fold_model.af3.template import TemplatePairStack

        from fold_train.autochunk import AutoChunkedStack

        out = super().enable_autochunk(model, memory_budget, min_chunk)
        # The per-pair steps outside the traced stacks run in row blocks, as with --chunk-size:
        # whole, the diffusion's pair conditioning holds [N, N, 2 C_z] and [N, N, 4 C_z]
        # temporaries (at 6144 tokens in fp32 over 90 GiB) and the confidence head the PAE / PDE
        # logits [N, N, bins] of a sample. Rows of a pair are independent: exact.
        model.set_pair_row_blocks(AUTOCHUNK_PAIR_ROWS)
        embedder = model.template_embedder
        if embedder is not None:
            wrapper = AutoChunkedStack(TemplatePairStack(embedder), memory_budget,
                                       min_chunk=min_chunk)
            wrapper.train(False)  # not a submodule: model.eval() does not reach it
            embedder.use_pair_stack(wrapper)
            embedder.one_template_at_a_time = True  # as with --chunk-size
            out["template_embedder.pair_stack"] = wrapper
        return out

    def dap_stacks(self, model) -> list[torch.nn.Module]:
        """The MSA module, Pairformer and template embedder (each scatters its inputs and
        gathers its output itself, so N_token and the MSA rows must be multiples of the DAP
        degree: :meth:`check_data`)."""
        return [m for m in (model.msa_module, model.pairformer, model.template_embedder)
                if m is not None]

    def bp_stacks(self, model) -> list[torch.nn.Module]:
        raise ValueError("branch parallelism (bp=2) is for the AF2 Parallel Evoformer; AF3 takes "
                         "DAP and data parallelism")

    # -- data ------------------------------------------------------------------------------------
    @classmethod
    def open_cache(cls, data_dir, cache_dir, ctx, *, chains, workers, ccd, progress,
                   limits=None):
        """``open_af3_cache`` built by rank 0 only, for as long as it takes; the other ranks
        wait (:func:`fold_train.rank_sync.run_on_rank0`), then read its index. A failure on
        rank 0 is raised there and reported on every other rank; a stalled rank is named."""
        from fold_train.af3_data import make_ccd, open_af3_cache
        from fold_train.rank_sync import run_on_rank0

        return run_on_rank0(
            ctx, "build the AF3 cache",
            lambda: open_af3_cache(data_dir, cache_dir, names=chains,
                                   # the CCD (gemmi) only to build: --cache alone needs numpy
                                   ccd=make_ccd(ccd or []) if data_dir is not None else None,
                                   progress=progress, limits=limits),
            after=lambda: open_af3_cache(None, cache_dir, names=chains, verify=False))

    @classmethod
    def _cache(cls, cache_dir):
        from fold_data.af3 import af3_cache

        from fold_train.af3_data import af3_cache_dir

        return af3_cache(af3_cache_dir(cache_dir))

    @classmethod
    def load_sample(cls, cache_dir, name, key, preset, seed, focus=None):
        """``focus``: the chain or interface drawn by weighted sampling (crops start there)."""
        from fold_data.af3 import make_sample

        from fold_train.families.af2 import _load

        return make_sample(_load(cls._cache(cache_dir), name, key), preset, seed=seed,
                           focus=focus)

    @classmethod
    def training_units(cls, cache_dir, entries, preset):
        """AF3 supplement 2.5: the entries left by the preset's filters and, with
        ``sampling="weighted"``, weighted chains and interfaces
        (:func:`fold_train.af3_data.training_units`)."""
        from fold_train.af3_data import training_units

        return training_units(cache_dir, entries, preset)

    @classmethod
    def eval_samples(cls, cache_dir, entries, preset, ctx):
        """Rank 0 evaluates an EMA snapshot; under DAP every rank of the replica takes part."""
        from fold_data.af3 import make_sample

        if not (ctx.is_main or ctx.groups is not None):
            return []
        cache = cls._cache(cache_dir)
        return [(name, make_sample(cache.load(key), preset, seed=0)) for name, key in entries]

    # -- prediction ------------------------------------------------------------------------------
    @staticmethod
    def _refuse_af2_options(args) -> None:
        from fold_train.errors import ConfigError

        af2_only = [f for f in ("msa", "templates", "template_mmcif_dir", "chain",
                                "msa_offload") if getattr(args, f, None)]
        if af2_only:
            raise ConfigError(f"--{af2_only[0].replace('_', '-')} is for AF2 inputs; an AF3 JSON "
                              "names its MSAs and templates itself")
        if getattr(args, "autochunk", None) is not None and getattr(args, "chunk_size", None):
            raise ConfigError("--autochunk and --chunk-size are alternatives: give one of them")

    @classmethod
    def predict(cls, args, device: str) -> dict:
        """The complex of an AlphaFold3 input JSON (its MSAs and templates named in it)."""
        from fold_data.limits import limits_from_args

        from fold_train.predict_af3 import predict_af3_file

        cls._refuse_af2_options(args)
        return predict_af3_file(args.checkpoint, args.json, args.out, device=device,
                                use_ema=not args.no_ema, ccd_files=args.ccd or [],
                                no_samples=args.samples, no_steps=args.sampler_steps,
                                no_cycles=args.recycles,
                                cuda_graphs=False if getattr(args, "no_cuda_graphs", False)
                                else None,
                                allow_outside_paths=getattr(args, "allow_outside_paths", False),
                                memory_limit=getattr(args, "memory_limit", None),
                                limits=limits_from_args(args),
                                features=getattr(args, "search_features", None),  # --search
                                seeds=getattr(args, "seeds", None),
                                out_dir=getattr(args, "out_dir", None),
                                parallel=getattr(args, "parallel", None),  # DAP: predict_dap
                                cache_dir=getattr(args, "cache", None),
                                **cls._chunking(args))

    @staticmethod
    def _chunking(args) -> dict:
        """``--chunk-size``, ``--autochunk``, ``--autochunk-min-chunk``, ``--sample-group``."""
        return dict(chunk_size=getattr(args, "chunk_size", None),
                    autochunk=getattr(args, "autochunk", None),
                    autochunk_min_chunk=getattr(args, "autochunk_min_chunk", 1),
                    sample_group=getattr(args, "sample_group", None))

    @classmethod
    def predict_runner(cls, args, device: str):
        """The model loaded once for ``fold-train predict --input-dir`` (AF3 JSONs or mmCIF
        complexes): :class:`~fold_train.predict_af3.AF3Runner`."""
        from fold_data.limits import limits_from_args

        from fold_train.predict_af3 import AF3Runner

        cls._refuse_af2_options(args)
        return AF3Runner(args.checkpoint, device=device, use_ema=not args.no_ema,
                         ccd_files=args.ccd or [], no_samples=args.samples,
                         no_steps=args.sampler_steps, no_cycles=args.recycles,
                         cuda_graphs=False if getattr(args, "no_cuda_graphs", False) else None,
                         allow_outside_paths=getattr(args, "allow_outside_paths", False),
                         memory_limit=getattr(args, "memory_limit", None),
                         limits=limits_from_args(args),
                         parallel=getattr(args, "parallel", None),  # DAP: predict_dap
                         cache_dir=getattr(args, "cache", None),
                         **cls._chunking(args))

    # -- shape buckets ---------------------------------------------------------------------------
    @classmethod
    def bucket_schema(cls):
        from fold_data.af3.schema import SAMPLE_FEATURES
        from fold_data.af3.transforms import PAD_VALUES

        return SAMPLE_FEATURES, dict(PAD_VALUES), ()
