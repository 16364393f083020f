"""Training configuration: :class:`TrainConfig`, one preset per fold-model preset, and
``key=value`` overrides with type checking.

Overrides name a field of the training config (``steps=20``, ``precision=bf16``), of the
optimizer (``optim.lr=5e-4``), of the model config (``model.evoformer.no_blocks=2``, passed to
``fold_model.af2.config``) or of the data preset (``data.n_res=48``, ``fold_data.af2.DataPreset``).
Each value is parsed to the type the field declares; an unknown key or a value of the wrong type
is a :class:`ConfigError` that says what was expected.

Presets (AF2 supplement 1.11, Table 4):

* ``af2_initial``: Adam lr 1e-3 with 1000 warm-up steps, clipping 0.1, EMA 0.999, global batch
  128 (one sample per GPU on 128 GPUs), bf16, about 10 M samples (78 125 steps).
* ``af2_finetune``: lr 5e-4, no warm-up, crop 384, about 1.5 M samples (11 719 steps).
* ``tiny``: the CPU preset of the tests and the demo: few steps, fp32, a short warm-up and a fast
  EMA (0.9) so that a run of a few dozen steps has a meaningful average.

AlphaFold3 presets (``family="af3"``; model from ``fold_model.af3``, samples from
``fold_data.af3``; AF3 supplement section 5.4 for the optimizer):

* ``af3``: Adam (beta1 0.9, beta2 0.95, eps 1e-8), learning rate 1.8e-3 linearly warmed up over
  1000 steps then x0.95 every 50 000 steps, gradients clipped to global norm 10, EMA 0.999, bf16;
  the ``af3`` model preset and the ``af3_initial`` data preset (crops of 384 tokens).
* ``af3_tiny``: the CPU preset of the AF3 tests: fold-model's ``tiny`` AF3, crops of 72 tokens /
  192 atoms, fp32, lr 5e-3 with a 5-step warm-up, EMA 0.9.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from fold_train.optim import AdamConfig

__all__ = ["ConfigError", "PRESETS", "TrainConfig", "apply_overrides", "parse_ops_backend",
           "parse_overrides", "preset"]

Precision = Literal["fp32", "bf16"]
Family = Literal["af2", "af3"]

# Training preset -> (fold-model preset, fold-data preset) of the AF3 family.
AF3_PRESETS = {"af3": ("af3", "af3_initial"), "af3_tiny": ("tiny", "af3_tiny")}


class ConfigError(ValueError):
    """A bad configuration key or value (the message names the key and the expected type)."""


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
class TrainConfig:
    """Everything a training run needs besides the data directory.

    ``model_overrides`` / ``data_overrides`` hold the ``model.*`` / ``data.*`` overrides as
    ``{"evoformer.no_blocks": 2}``; :meth:`model_config` and :meth:`data_preset` apply them.
    """

    preset: str = "tiny"  # AF2: fold-model and fold-data preset name; AF3: key of AF3_PRESETS
    family: Family = "af2"  # the model family: AlphaFold2 or AlphaFold3
    steps: int = 20  # optimizer updates
    batch_size: int = 1  # samples per step per data-parallel rank
    seed: int = 0
    precision: Precision = "fp32"  # "bf16": autocast with fp32 master weights
    # the trunk's weights in bf16 (precision=bf16 only): FlatAdam keeps fp32 masters and rounds
    # them into the weights after each update; the AF2 structure module and heads (AF3: the
    # embedders, conditioning, atom encoder/decoder and heads) keep fp32 weights
    bf16_weights: bool = False
    max_recycling_iters: int | None = None  # N_cycle drawn from 1..this+1; None: data preset's
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    log_every: int = 1
    eval_every: int = 0  # 0: evaluate at the end only
    max_nonfinite_steps: int = 10  # skipped steps (NaN/inf loss or gradient) before giving up
    loader_workers: int = 1  # NonBlockingLoader processes; 0: prepare in this process
    prefetch: int = 4
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
    dap: int = 1  # Dynamic Axial Parallelism degree (ranks per replica sharing a sample)
    bp: int = 1  # Branch Parallelism degree (1 or 2; needs model.block_order=parallel)
    # DAP's all-to-alls overlapped with compute (FastFold's Duality Async Operations); false:
    # synchronous DAP
    dao: bool = True
    # ScaleFold system switches (section 3.3)
    gc_off: bool = True  # garbage collection off during steps, collected between them
    overlap_clip: bool = True  # global-norm partials computed while the all-reduce runs
    compile_structure_module: bool = False  # torch.compile of the memory-bound module
    async_eval: bool = False  # evaluate in a background thread while training goes on
    cuda_graphs: bool = False  # replay forward+loss+backward from one CUDA graph per N_cycle
    optim: AdamConfig = field(default_factory=AdamConfig)
    model_overrides: dict[str, Any] = field(default_factory=dict)
    data_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "max_nonfinite_steps", "loader_workers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.dap < 1 or self.bp not in (1, 2):
            raise ConfigError(f"dap must be >= 1 and bp 1 or 2, got dap={self.dap}, bp={self.bp}")
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
        if self.activation_checkpointing == "auto" and (self.dap > 1 or self.bp > 1):
            raise ConfigError("activation_checkpointing=auto with dap/bp > 1 is not supported: "
                              "each rank would plan on its own, and the ranks of a replica must "
                              "recompute the same blocks (their collectives run again in "
                              "backward); set model.uncheckpointed_blocks explicitly")
        if self.ops_backend is not None:
            parse_ops_backend(self.ops_backend)
        if not self.tensor_fusion:
            bad = [n for n, on in (("bf16_weights", self.bf16_weights),
                                   ("cuda_graphs", self.cuda_graphs),
                                   ("use_kernels", self.use_kernels is True),
                                   ("dap", self.dap > 1), ("bp", self.bp > 1)) if on]
            if bad:
                raise ConfigError(f"tensor_fusion=false does not go with {', '.join(bad)}: the "
                                  "per-tensor optimizer keeps fp32 weights, frees gradients "
                                  "between steps and runs in one process")
        if self.max_recycling_iters is not None and self.max_recycling_iters < 0:
            raise ConfigError("max_recycling_iters must be >= 0")
        if self.family not in ("af2", "af3"):
            raise ConfigError(f"family must be 'af2' or 'af3', got {self.family!r}")
        if self.family == "af3":
            if self.preset not in AF3_PRESETS:
                raise ConfigError(f"AF3 preset {self.preset!r} unknown; AF3 presets are "
                                  f"{sorted(AF3_PRESETS)}")
            unsupported = [n for n, bad in (("bp", self.bp > 1),
                                            ("compile_structure_module",
                                             self.compile_structure_module)) if bad]
            if unsupported:
                raise ConfigError(f"{', '.join(unsupported)}: not supported for AF3 training "
                                  "(AF2 only)")

    # -- the other packages' configs ----------------------------------------------------------
    def model_config(self):
        """The fold-model ``AlphaFold2Config`` (AF3: ``AlphaFold3Config``) of the preset with the
        ``model.*`` overrides."""
        overrides = {k.replace(".", "__"): v for k, v in self.model_overrides.items()}
        if self.family == "af3":
            from fold_model.af3 import config as af3_config

            if isinstance(self.activation_checkpointing, bool):  # auto: the preset's, planned
                overrides["checkpoint"] = self.activation_checkpointing
            if self.max_recycling_iters is not None:
                overrides["no_cycles"] = self.max_recycling_iters + 1
            return af3_config(AF3_PRESETS[self.preset][0], **overrides)
        from fold_model.af2 import config

        if isinstance(self.activation_checkpointing, bool):  # auto: the preset's, planned
            overrides["checkpoint_blocks"] = self.activation_checkpointing
        return config(self.preset, **overrides)

    def data_preset_base(self):
        """The data preset without the ``data.*`` overrides."""
        if self.family == "af3":
            from fold_train.af3_data import af3_data_preset

            return af3_data_preset(AF3_PRESETS[self.preset][1])
        from fold_data.af2 import get_preset

        return get_preset(self.preset)

    def data_preset(self):
        """The fold-data ``DataPreset`` (AF3: ``AF3DataPreset``) of the preset with the
        ``data.*`` overrides; AF2: its ``max_recycling_iters`` is this config's when set (AF3:
        the model's ``no_cycles``)."""
        if self.family == "af3":
            from fold_train.af3_data import af3_data_preset

            base = af3_data_preset(AF3_PRESETS[self.preset][1])
            return dataclasses.replace(base, **self.data_overrides) if self.data_overrides \
                else base
        from fold_data.af2 import get_preset

        base = get_preset(self.preset)
        changes = dict(self.data_overrides)
        if self.max_recycling_iters is not None:
            changes["max_recycling_iters"] = self.max_recycling_iters
        return dataclasses.replace(base, **changes) if changes else base

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (the run directory's ``config.json``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        optim = AdamConfig(**d.pop("optim", {}))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown TrainConfig fields {unknown}")
        return cls(optim=optim, **d)


def _af2_initial() -> TrainConfig:
    # Table 4: 10 M samples at batch 128; bf16 (as HelixFold / ScaleFold train).
    return TrainConfig(preset="af2_initial", steps=78_125, batch_size=1, precision="bf16",
                       checkpoint_every=1000, keep_checkpoints=3, log_every=10,
                       eval_every=1000, loader_workers=4, prefetch=8, optim=AdamConfig())


def _af2_finetune() -> TrainConfig:
    # Table 4 fine-tuning: lr halved to 5e-4, no warm-up; 1.5 M samples at batch 128.
    return TrainConfig(preset="af2_finetune", steps=11_719, batch_size=1, precision="bf16",
                       checkpoint_every=1000, keep_checkpoints=3, log_every=10,
                       eval_every=1000, loader_workers=4, prefetch=8,
                       optim=AdamConfig(lr=5e-4, warmup_steps=0))


def _tiny() -> TrainConfig:
    return TrainConfig(preset="tiny", steps=20, precision="fp32", checkpoint_every=10,
                       optim=AdamConfig(lr=1e-3, warmup_steps=5, ema_decay=0.9))


def _af3() -> TrainConfig:
    # AF3 supplement 5.4: Adam b1 0.9, b2 0.95, eps 1e-8; lr 1.8e-3 after a 1000-step linear
    # warm-up, x0.95 every 5e4 steps; clipping to global norm 10; EMA 0.999. The mini-batch of
    # 256 is one sample per GPU on 256 GPUs. bf16 as MegaFold trains. steps: a long run's
    # default; set steps= to the compute budget.
    return TrainConfig(preset="af3", family="af3", steps=150_000, batch_size=1,
                       precision="bf16", checkpoint_every=1000, keep_checkpoints=3,
                       log_every=10, loader_workers=4, prefetch=8,
                       optim=AdamConfig(lr=1.8e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                                        warmup_steps=1000, decay_factor=0.95,
                                        decay_every=50_000, clip_norm=10.0, ema_decay=0.999))


def _af3_tiny() -> TrainConfig:
    return TrainConfig(preset="af3_tiny", family="af3", steps=20, precision="fp32",
                       checkpoint_every=10,
                       optim=AdamConfig(lr=5e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                                        warmup_steps=5, clip_norm=10.0, ema_decay=0.9))


PRESETS = {"af2_initial": _af2_initial, "af2_finetune": _af2_finetune, "tiny": _tiny,
           "af3": _af3, "af3_tiny": _af3_tiny}


def preset(name: str) -> TrainConfig:
    """A fresh :class:`TrainConfig` of preset ``name``."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets are {sorted(PRESETS)}")
    return PRESETS[name]()


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


def apply_overrides(cfg: TrainConfig, items: list[str]) -> TrainConfig:
    """A copy of ``cfg`` with ``key=value`` overrides applied and type-checked."""
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim),
                              model_overrides=dict(cfg.model_overrides),
                              data_overrides=dict(cfg.data_overrides))
    for key, text in parse_overrides(items):
        path = key.split(".")
        if path[0] in ("preset", "family"):
            raise ConfigError(f"{path[0]}: choose it with --preset, not as an override")
        if path[0] == "model":
            if len(path) < 2:
                raise ConfigError(f"{key}: expected model.<field>[.<field>]")
            model = cfg.model_config()  # fields and types of the model preset
            _, _, typ = _resolve(model, path[1:], key)
            cfg.model_overrides[".".join(path[1:])] = _parse_value(key, text, typ)
        elif path[0] == "data":
            if len(path) != 2:
                raise ConfigError(f"{key}: expected data.<field>")
            # field types from the preset itself: the overrides are checked together at the end
            # (crop probabilities must sum to 1 only once all of them are set)
            _, _, typ = _resolve(cfg.data_preset_base(), path[1:], key)
            cfg.data_overrides[path[1]] = _parse_value(key, text, typ)
        else:
            owner, leaf, typ = _resolve(cfg, path, key)
            if leaf in ("model_overrides", "data_overrides", "optim"):
                raise ConfigError(f"{key}: use model.<field>, data.<field> or optim.<field>")
            setattr(owner, leaf, _parse_value(key, text, typ))
    try:  # re-run the validations of every dataclass touched
        cfg.optim.__post_init__()
        cfg.__post_init__()
        cfg.model_config()
        cfg.data_preset()
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid configuration after overrides {items}: {e}") from e
    return cfg
