"""The :class:`Family` interface: everything that differs between training, evaluating and
predicting with AF2 and with AF3, so that the loop, the CLI and the config stay family-blind.

A family is a class with:

* class-level hooks of the configuration: its training ``presets`` (nested config dicts),
  :meth:`model_config_of` / :meth:`data_preset` from a :class:`~fold_train.config.TrainConfig`,
  :meth:`check_config` (what the family does not support) and :meth:`check_data`;
* per-run hooks on an instance made with the run's model config: :meth:`build_model`,
  :meth:`make_loss`, :meth:`forward_loss`, :meth:`n_cycle_max`, :meth:`step_metrics`,
  :meth:`evaluate`, :meth:`to_bf16_weights`, and the parallelize hooks (:meth:`dap_stacks`,
  :meth:`bp_stacks`, :meth:`compile`, :meth:`set_chunking`, ``autochunk_names``) that
  :func:`fold_train.parallelize.parallelize` calls, and the static loss inputs of a captured
  step (:meth:`static_loss_inputs`, :meth:`split_static_inputs`);
* data hooks: :meth:`open_cache` (build / read the feature cache of a data directory),
  :meth:`load_sample` (a loader worker's sample of one cache entry), :meth:`eval_samples`;
* prediction: :meth:`predict` (the ``fold-train predict`` of the family's input),
  :meth:`predict_runner` (the model loaded once for ``--input-dir``), the
  ``input_args`` that name such an input and ``input_hint`` (which input a checkpoint of the
  family needs);
* shape buckets: ``extent_masks`` and :meth:`bucket_schema` (:mod:`fold_train.buckets`).

:mod:`fold_train.families` registers the families by name (``af2``, ``af3``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

__all__ = ["Family"]


class Family(ABC):
    """Base of the model families; the abstract methods are the ones each family defines."""

    name: ClassVar[str]
    # training presets: name -> nested config sections ({"run": {...}, "optim": {...}, ...})
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    seeded_noise: ClassVar[bool] = False  # forward_loss takes the step's noise generator
    input_hint: ClassVar[str] = ""  # the prediction input of the family (error messages)
    unit: ClassVar[str] = "chain"  # what one training entry is ("chain", "complex")
    run_label: ClassVar[str] = "preset"  # how the CLI names a run's preset ("AF3 preset")
    branch_parallel: ClassVar[bool] = False  # whether bp=2 applies (the CLI's layout line)
    # the ``fold-train predict`` arguments that name an input of this family
    input_args: ClassVar[tuple[str, ...]] = ()
    # bucketed dimension -> the mask marking its real entries (fold_train.buckets)
    extent_masks: ClassVar[Mapping[str, str]] = {}
    # (record key, column title) of the step table that `fold-train train --no-progress` prints
    table_columns: ClassVar[tuple[tuple[str, str], ...]] = ()
    # attributes of the model naming the stacks AutoChunk may wrap (fold-train predict)
    autochunk_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model_config: Any = None) -> None:
        self.model_config = model_config

    # -- configuration (class level: no run yet) ------------------------------------------------
    @classmethod
    @abstractmethod
    def model_config_of(cls, cfg) -> Any:
        """The fold-model config of ``cfg`` (preset, ``model.*`` overrides, checkpointing)."""

    @classmethod
    @abstractmethod
    def data_preset_base(cls, cfg) -> Any:
        """The fold-data preset of ``cfg`` without its ``data.*`` overrides."""

    @classmethod
    @abstractmethod
    def data_preset(cls, cfg) -> Any:
        """The fold-data preset of ``cfg`` with its ``data.*`` overrides."""

    @classmethod
    def check_config(cls, cfg) -> None:
        """Raise :class:`~fold_train.config.ConfigError` for what the family cannot run."""
        return None  # default: every configuration runs

    @classmethod
    def check_data(cls, cfg, data_preset) -> None:
        """Raise :class:`~fold_train.config.ConfigError` when the data do not fit ``cfg``."""
        return None  # default: any data fits

    # -- model and loss -------------------------------------------------------------------------
    @abstractmethod
    def build_model(self, model_config) -> torch.nn.Module:
        ...

    @abstractmethod
    def make_loss(self, model, model_config) -> torch.nn.Module:
        ...

    @abstractmethod
    def to_bf16_weights(self, model) -> None:
        """Cast the modules whose weights may be bf16 (``system.bf16_weights``)."""

    @abstractmethod
    def n_cycle_max(self, batch: dict[str, torch.Tensor]) -> int:
        """The largest number of trunk passes a step may draw."""

    @abstractmethod
    def forward_loss(self, model, loss_fn, batch, n_cycle: int, **kwargs):
        """``(loss, {term: tensor}, aux)``; ``aux``: detached tensors for :meth:`step_metrics`."""

    def step_metrics(self, batch, n_cycle: int, aux) -> dict[str, float]:
        return {}

    @abstractmethod
    def evaluate(self, model, samples, device, precision: str) -> dict[str, float]:
        """``{"eval/...": float}`` of ``model`` on the held-out ``[(name, sample)]``."""

    # -- CUDA graphs: inputs of the loss built outside the captured step ------------------------
    def static_loss_inputs(self, batch, capacities) -> tuple[dict[str, torch.Tensor], Any,
                                                             str | None]:
        """``(tensors, capacities, note)``: the loss's data-dependent inputs of ``batch`` padded
        to ``capacities`` (grown when outgrown; ``note`` then says why), as static graph inputs.
        Default: none."""
        return {}, capacities, None

    def split_static_inputs(self, static: dict[str, torch.Tensor]
                            ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(batch, extra forward_loss keyword arguments)`` of the static graph inputs."""
        return static, {}

    # -- parallelize hooks (fold_train.parallelize) ---------------------------------------------
    def dap_stacks(self, model) -> list[torch.nn.Module]:
        """The stacks that ``fold_parallel.enable_dap`` puts under DAP."""
        return []

    def bp_stacks(self, model) -> list[torch.nn.Module]:
        """The stacks that ``fold_parallel.enable_bp`` splits (branch parallelism)."""
        return []

    def compile(self, model) -> None:
        """``torch.compile`` of the family's memory-bound module
        (``system.compile_structure_module``)."""
        raise NotImplementedError(f"{self.name}: no module to compile")

    def set_chunking(self, model, chunk_size: int | None) -> None:
        """Inference chunking of the stacks (``fold-train predict --chunk-size``)."""
        model.set_chunk_size(chunk_size)

    # -- data ------------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def open_cache(cls, data_dir, cache_dir, ctx, *, chains: Sequence[str] | None,
                   workers: int, ccd: Sequence[str], progress: bool,
                   limits=None) -> list[tuple[str, str]]:
        """``[(name, cache key)]`` of the training entries (the cache built by rank 0;
        ``limits``: fold-data's ``SizeLimits`` for the inputs)."""

    @classmethod
    @abstractmethod
    def load_sample(cls, cache_dir: str, name: str, key: str, preset, seed: int
                    ) -> dict[str, Any]:
        """A training sample of cache entry ``key`` (a loader worker's job)."""

    @classmethod
    def training_units(cls, cache_dir: str, entries: list[tuple[str, str]], preset
                       ) -> tuple[list[tuple[str, str]], Any]:
        """The training entries after the data preset's filters, and the weighted units to
        draw from them (a :class:`fold_train.data.WeightedUnits`); None: seeded epochs of the
        entries (the default: no filter, uniform)."""
        return entries, None

    @classmethod
    @abstractmethod
    def eval_samples(cls, cache_dir: str, entries: list[tuple[str, str]], preset, ctx
                     ) -> list[tuple[str, dict]]:
        """In-memory evaluation samples of the held-out ``entries`` (ScaleFold: no disk reads
        while training)."""

    # -- shape buckets ---------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def bucket_schema(cls) -> tuple[Mapping[str, Any], dict[str, float], tuple[str, ...]]:
        """``(SAMPLE_FEATURES, fill value per feature, features padded with 4x4 identity
        frames)`` of the family's samples (fold-data's contract and padding)."""

    # -- prediction ------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def predict(cls, args, device: str) -> dict:
        """``fold-train predict`` of the family's input (``args``: the parsed command line);
        writes the mmCIF (and with ``--out-dir`` the confidence files) and returns the JSON
        summary."""

    @classmethod
    @abstractmethod
    def predict_runner(cls, args, device: str):
        """The checkpoint's model loaded once, for ``fold-train predict --input-dir``: an object
        with ``family``, ``predictor`` (its CUDA-graph predictor), ``size(item) -> {dim: n}``
        and ``run(item, seeds=, out_dir=) -> summary`` (:mod:`fold_train.predict_batch`)."""
