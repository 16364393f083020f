"""Training configuration: :class:`TrainConfig` in six sections, the presets of the model
families, and ``key=value`` overrides with type checking.

Sections (``section.field=value`` on the command line):

* ``run``: the training preset, steps, batch size, seed, recycling, logging, checkpoints;
* ``optim``: the optimizer (:class:`~fold_train.optim.AdamConfig`: ``optim.lr=5e-4``);
* ``parallel``: DAP and BP degrees (data parallelism is the rest of the world size);
* ``system``: precision, weight dtype, activation checkpointing, op backends, tensor fusion,
  fused kernels, ScaleFold's switches, compile, CUDA graphs;
* ``model``: the model family (picked by the preset) and the fold-model overrides
  (``model.evoformer.no_blocks=2``, checked against the family's model config);
* ``data``: loader workers and prefetch, and the fold-data preset overrides (``data.n_res=48``).

Each value is parsed to the type the field declares; an unknown key or a value of the wrong type
is a :class:`ConfigError` that says what was expected. The flat keys of the configuration before
the sections (``steps=5``, ``dap=2``, ``precision=bf16``) are still accepted: :data:`FLAT_KEYS`
maps each to its section, and so does :meth:`TrainConfig.from_dict` for the ``config`` of a
checkpoint written before the change.

The presets belong to the model families (:mod:`fold_train.families`: ``af2_initial``,
``af2_finetune``, ``tiny`` in :mod:`~fold_train.families.af2`; ``af3``, ``af3_tiny`` in
:mod:`~fold_train.families.af3`); :func:`preset` builds one.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from fold_train.errors import ConfigError
from fold_train.families import family_class, family_of_preset, train_presets
from fold_train.optim import AdamConfig

__all__ = ["ConfigError", "DataConfig", "FLAT_KEYS", "ModelConfig", "ParallelConfig", "RunConfig",
           "SECTIONS", "SystemConfig", "TrainConfig", "apply_overrides", "parse_ops_backend",
           "parse_overrides", "preset", "presets"]

Precision = Literal["fp32", "bf16"]


def parse_ops_backend(text: str) -> dict[str, str]:
    """``ops_backend`` as ``{op or "*": backend}``: ``"auto"`` -> ``{"*": "auto"}``,
    ``"attention=triton,layer_norm=torch"`` -> per op. Unknown op names are a
    :class:`ConfigError` (whether a backend is installed is checked when the model runs)."""
    from fold_model.ops.registry import OPS

    mapping: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        op, sep, name = part.partition("=")
        op, name = (op.strip(), name.strip()) if sep else ("*", op.strip())
        if not name or (op != "*" and op not in OPS):
            raise ConfigError(f"ops_backend={text!r}: expected a backend (torch, auto, triton) or "
                              f"op=backend pairs with ops among {list(OPS)}")
        mapping[op] = name
    if not mapping:
        raise ConfigError(f"ops_backend={text!r}: expected a backend, e.g. auto")
    return mapping


@dataclass
class RunConfig:
    """What the run does: its preset, length, batches, seeds, logs and checkpoints."""

    preset: str = "tiny"  # the training preset (its family names the model and data presets)
    steps: int = 20  # optimizer updates
    batch_size: int = 1  # samples per step per data-parallel rank
    seed: int = 0
    max_recycling_iters: int | None = None  # N_cycle drawn from 1..this+1; None: the preset's
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    log_every: int = 1
    eval_every: int = 0  # 0: evaluate at the end only
    max_nonfinite_steps: int = 10  # skipped steps (NaN/inf loss or gradient) before giving up

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "max_nonfinite_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_recycling_iters is not None and self.max_recycling_iters < 0:
            raise ConfigError("max_recycling_iters must be >= 0")


@dataclass
class ParallelConfig:
    """Model parallelism inside each data-parallel replica (fold-parallel)."""

    dap: int = 1  # Dynamic Axial Parallelism degree (ranks per replica sharing a sample)
    bp: int = 1  # Branch Parallelism degree (1 or 2; needs model.block_order=parallel)
    # DAP's all-to-alls overlapped with compute (FastFold's Duality Async Operations); false:
    # synchronous DAP
    dao: bool = True

    def __post_init__(self) -> None:
        if self.dap < 1 or self.bp not in (1, 2):
            raise ConfigError(f"dap must be >= 1 and bp 1 or 2, got dap={self.dap}, bp={self.bp}")


@dataclass
class SystemConfig:
    """How the steps run: precision, memory, kernels and ScaleFold's system switches."""

    precision: Precision = "fp32"  # "bf16": autocast with fp32 master weights
    # the trunk's weights in bf16 (precision=bf16 only): FlatAdam keeps fp32 masters and rounds
    # them into the weights after each update; the AF2 structure module and heads (AF3: the
    # embedders, conditioning, atom encoder/decoder and heads) keep fp32 weights
    bf16_weights: bool = False
    # activation checkpointing of the model's blocks while training. None: the model preset's
    # choice; true/false: every block / none; "auto": the preset's checkpointing minus the
    # blocks that fit in ckpt_memory_fraction of the device's memory, planned from the first
    # batch (fold_train.ckpt_plan; on CPU the preset's checkpointing is kept). A fixed partial
    # plan is model.uncheckpointed_blocks=K (AF2 Evoformer; uncheckpointed_extra_msa_blocks)
    # or model.uncheckpointed_pairformer_blocks / uncheckpointed_diffusion_blocks (AF3).
    activation_checkpointing: bool | Literal["auto"] | None = None
    # with activation_checkpointing=auto: the fraction of the memory this process can use
    # (free + already cached) that a step may peak at; the rest is headroom for CUDA graphs'
    # private pools and fragmentation
    ckpt_memory_fraction: float = 0.6
    # fold-model's op backends: "torch" (the PyTorch references), "auto" (fold-kernels'
    # Triton ops where they support the call), "triton", or per op, e.g.
    # "attention=triton,layer_norm=torch"; None: the environment's FOLD_OPS_BACKEND, else auto
    ops_backend: str | None = None
    # parameters, gradients and Adam/EMA state in flat buffers (HelixFold's tensor fusion,
    # fold_train.optim); false: torch.optim.Adam over the parameter list with per-tensor
    # clipping and EMA (fold_train.param_adam: the eager baseline; one process, fp32 weights)
    tensor_fusion: bool = True
    use_kernels: bool | None = None  # fused optimizer: None = on CUDA when importable
    # ScaleFold system switches (section 3.3)
    gc_off: bool = True  # garbage collection off during steps, collected between them
    overlap_clip: bool = True  # global-norm partials computed while the all-reduce runs
    compile_structure_module: bool = False  # torch.compile of the memory-bound module
    async_eval: bool = False  # evaluate in a background thread while training goes on
    cuda_graphs: bool = False  # replay forward+loss+backward from one CUDA graph per N_cycle

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.bf16_weights and self.precision != "bf16":
            raise ConfigError("bf16_weights=true needs precision=bf16 (bf16 weights are used "
                              "under bf16 autocast, with fp32 masters in the optimizer)")
        if self.activation_checkpointing not in (None, True, False, "auto"):
            raise ConfigError("activation_checkpointing must be true, false or auto, got "
                              f"{self.activation_checkpointing!r}")
        if not 0 < self.ckpt_memory_fraction <= 1:
            raise ConfigError("ckpt_memory_fraction must be in (0, 1], got "
                              f"{self.ckpt_memory_fraction}")
        if self.ops_backend is not None:
            parse_ops_backend(self.ops_backend)


@dataclass
class ModelConfig:
    """The model family (set by the preset) and the fold-model config overrides."""

    family: str = "af2"  # a name of fold_train.families.FAMILIES
    # model.* overrides as {"evoformer.no_blocks": 2}; TrainConfig.model_config applies them
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """The sample loader and the fold-data preset overrides."""

    workers: int = 1  # NonBlockingLoader processes; 0: prepare in this process
    prefetch: int = 4
    # data.* overrides as {"n_res": 48}; TrainConfig.data_preset applies them
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ConfigError(f"loader workers must be >= 0, got {self.workers}")


SECTIONS: dict[str, type] = {"run": RunConfig, "optim": AdamConfig, "parallel": ParallelConfig,
                             "system": SystemConfig, "model": ModelConfig, "data": DataConfig}

# The flat keys of the configuration before the sections -> their nested keys (accepted as
# overrides and in the config of older checkpoints; fold-train README, "Configuration").
FLAT_KEYS: dict[str, str] = {
    **{k: f"run.{k}" for k in ("preset", "steps", "batch_size", "seed", "max_recycling_iters",
                               "checkpoint_every", "keep_checkpoints", "log_every",
                               "eval_every", "max_nonfinite_steps")},
    "dap": "parallel.dap", "bp": "parallel.bp", "dao": "parallel.dao",
    **{k: f"system.{k}" for k in ("precision", "bf16_weights", "activation_checkpointing",
                                  "ckpt_memory_fraction", "ops_backend", "tensor_fusion",
                                  "use_kernels", "gc_off", "overlap_clip",
                                  "compile_structure_module", "async_eval", "cuda_graphs")},
    "family": "model.family", "model_overrides": "model.overrides",
    "loader_workers": "data.workers", "prefetch": "data.prefetch",
    "data_overrides": "data.overrides",
}


@dataclass
class TrainConfig:
    """Everything a training run needs besides the data directory, in sections (module
    docstring). What depends on the model family (its model config, data preset and what it
    does not support) is asked of the family (:mod:`fold_train.families`)."""

    run: RunConfig = field(default_factory=RunConfig)
    optim: AdamConfig = field(default_factory=AdamConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        for name in SECTIONS:  # each section validates itself
            check = getattr(getattr(self, name), "__post_init__", None)
            if check is not None:
                check()
        s, p = self.system, self.parallel
        if s.activation_checkpointing == "auto" and (p.dap > 1 or p.bp > 1):
            raise ConfigError("activation_checkpointing=auto with dap/bp > 1 is not supported: "
                              "each rank would plan on its own, and the ranks of a replica must "
                              "recompute the same blocks (their collectives run again in "
                              "backward); set model.uncheckpointed_blocks explicitly")
        if not s.tensor_fusion:
            bad = [n for n, on in (("bf16_weights", s.bf16_weights),
                                   ("cuda_graphs", s.cuda_graphs),
                                   ("use_kernels", s.use_kernels is True),
                                   ("dap", p.dap > 1), ("bp", p.bp > 1)) if on]
            if bad:
                raise ConfigError(f"tensor_fusion=false does not go with {', '.join(bad)}: the "
                                  "per-tensor optimizer keeps fp32 weights, frees gradients "
                                  "between steps and runs in one process")
        try:
            family = family_class(self.model.family)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        family.check_config(self)

    @property
    def family(self):
        """The :class:`~fold_train.families.base.Family` class of the run."""
        return family_class(self.model.family)

    # -- the other packages' configs ----------------------------------------------------------
    def model_config(self):
        """The fold-model config of the family's preset with the ``model.*`` overrides."""
        return self.family.model_config_of(self)

    def data_preset_base(self):
        """The data preset without the ``data.*`` overrides."""
        return self.family.data_preset_base(self)

    def data_preset(self):
        """The fold-data preset of the family with the ``data.*`` overrides."""
        return self.family.data_preset(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the sections (the run directory's ``config.json``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """From :meth:`to_dict`'s sections, or from the flat dict of a config written before
        them (a checkpoint's ``config``): each flat key moves to its section (:data:`FLAT_KEYS`)."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for key, value in d.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"config section {key!r}: expected a mapping, got "
                                      f"{value!r}")
                sections[key].update(value)
            elif key in FLAT_KEYS:
                section, name = FLAT_KEYS[key].split(".")
                sections[section][name] = value
            else:
                raise ConfigError(f"unknown TrainConfig fields [{key!r}]; sections are "
                                  f"{list(SECTIONS)}")
        try:
            built = {name: SECTIONS[name](**values) for name, values in sections.items()}
        except TypeError as e:
            raise ConfigError(f"unknown TrainConfig fields: {e}") from None
        return cls(**built)


def presets() -> list[str]:
    """The training presets of every family."""
    return sorted(train_presets())


def preset(name: str) -> TrainConfig:
    """A fresh :class:`TrainConfig` of training preset ``name`` (its family's ``presets``)."""
    family = family_of_preset(name)
    if family is None:
        raise ConfigError(f"unknown preset {name!r}; presets are {presets()}")
    spec = family.presets[name]
    sections = {sec: SECTIONS[sec](**spec.get(sec, {})) for sec in ("optim", "parallel",
                                                                      "system", "data")}
    return TrainConfig(run=RunConfig(preset=name, **spec.get("run", {})),
                       model=ModelConfig(family=family.name), **sections)


# -- overrides --------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _describe(typ: Any) -> str:
    """A type as the error messages name it."""
    if typing.get_origin(typ) is Literal:
        return " / ".join(str(c) for c in typing.get_args(typ))
    return {bool: "true / false", int: "an integer", float: "a number", str: "a string",
            type(None): "none"}.get(typ, str(typ))


def _parse_value(key: str, text: str, typ: Any) -> Any:
    """``text`` parsed as ``typ`` (int, float, bool, str, Literal, X | None)."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(typ)
        if type(None) in args and text.lower() in ("none", "null"):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _parse_value(key, text, arg)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:  # X | None: X's reason (e.g. "expected a finite number")
            raise ConfigError(f"{errors[0]} (or none)")
        raise ConfigError(f"{key}={text!r}: expected {' or '.join(map(_describe, args))}")
    if origin is Literal:
        choices = typing.get_args(typ)
        for c in choices:
            if text == str(c):
                return c
        raise ConfigError(f"{key}={text!r}: expected one of {list(choices)}")
    if typ is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{key}={text!r}: expected a boolean (true/false)")
    if typ is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{key}={text!r}: expected an integer") from None
    if typ is float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: expected a number") from None
        if not math.isfinite(value):  # nan passes every '<= 0' check: refuse it here
            raise ConfigError(f"{key}={text!r}: expected a finite number")
        return value
    if typ is str:
        return text
    raise ConfigError(f"{key}: fields of type {typ} cannot be set from the command line")


def _field_type(obj: Any, name: str, key: str) -> Any:
    """The declared type of dataclass field ``name`` of ``obj``."""
    if not dataclasses.is_dataclass(obj):
        raise ConfigError(f"{key}: {type(obj).__name__} has no fields")
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    if name not in names:
        raise ConfigError(f"{key}: unknown field {name!r} of {type(obj).__name__}; fields are "
                          f"{names}")
    return hints[name]


def _resolve(root: Any, path: list[str], key: str) -> tuple[Any, str, Any]:
    """Walk ``path`` through nested dataclasses: (owner object, leaf name, leaf type)."""
    obj = root
    for part in path[:-1]:
        typ = _field_type(obj, part, key)
        obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            raise ConfigError(f"{key}: {part!r} is a {typ}, not a group of fields")
    return obj, path[-1], _field_type(obj, path[-1], key)


def parse_overrides(items: list[str]) -> list[tuple[str, str]]:
    """``["steps=5", ...]`` -> ``[("steps", "5"), ...]`` (error for an item without ``=``)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected key=value, e.g. optim.lr=5e-4")
        out.append((key.strip(), value.strip()))
    return out


def _nested_key(key: str) -> list[str]:
    """``key`` as a path of section and field names (a flat key goes to its section)."""
    path = key.split(".")
    if path[0] not in SECTIONS:
        if path[0] not in FLAT_KEYS:
            raise ConfigError(f"{key}: unknown field {path[0]!r}; keys are <section>.<field> "
                              f"with sections {list(SECTIONS)}, or a flat key of "
                              f"{sorted(FLAT_KEYS)}")
        path = FLAT_KEYS[path[0]].split(".") + path[1:]
    return path


def apply_overrides(cfg: TrainConfig, items: list[str]) -> TrainConfig:
    """A copy of ``cfg`` with ``key=value`` overrides applied and type-checked."""
    cfg = TrainConfig.from_dict(cfg.to_dict())  # a deep copy, sections and overrides included
    for key, text in parse_overrides(items):
        path = _nested_key(key)
        section, rest = path[0], path[1:]
        if not rest:
            raise ConfigError(f"{key}: expected {section}.<field>")
        if path in (["run", "preset"], ["model", "family"]):
            raise ConfigError(f"{rest[0]}: choose it with --preset, not as an override")
        if rest[0] == "overrides" and section in ("model", "data"):
            raise ConfigError(f"{key}: use {section}.<field>")
        if section == "model" and rest[0] not in _fields(ModelConfig):
            # fields and types of the model preset itself: the overrides are checked together
            # at the end (a width and its head count must divide only once both are set)
            model = _model_preset(cfg)
            _, _, typ = _resolve(model, rest, key)
            cfg.model.overrides[".".join(rest)] = _parse_value(key, text, typ)
        elif section == "data" and rest[0] not in _fields(DataConfig):
            if len(rest) != 1:
                raise ConfigError(f"{key}: expected data.<field>")
            # field types from the preset itself: the overrides are checked together at the end
            # (crop probabilities must sum to 1 only once all of them are set)
            _, _, typ = _resolve(cfg.data_preset_base(), rest, key)
            cfg.data.overrides[rest[0]] = _parse_value(key, text, typ)
        else:
            owner, leaf, typ = _resolve(cfg, path, key)
            setattr(owner, leaf, _parse_value(key, text, typ))
    try:  # re-run the validations of every dataclass touched
        cfg.__post_init__()
        cfg.model_config()
        cfg.data_preset()
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid configuration after overrides {items}: {e}") from e
    return cfg


def _model_preset(cfg: TrainConfig) -> Any:
    """The fold-model config of ``cfg``'s preset without its ``model.*`` overrides."""
    base = TrainConfig.from_dict(cfg.to_dict())
    base.model.overrides = {}
    return base.model_config()


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
