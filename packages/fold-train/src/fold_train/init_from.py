"""Weights from elsewhere: AlphaFold2's released parameters, OpenFold checkpoints, Protenix's
AF3 checkpoints and other fold runs, as a fold checkpoint (``fold-train import-weights``) or as
the starting weights of a new training run (``fold-train train --init-from``).

``read_weights(path)`` tells the formats apart by their content: a fold checkpoint
(``FOLDCKPT1`` header; its averaged EMA weights when it has them, else the live ones), an AF2
``.npz`` (a zip of ``.npy`` arrays), a Protenix ``.pt`` (its ``model`` state dict has Protenix's
module names) or anything else, read as an OpenFold ``.pt``.
:func:`load_init_weights` copies them into a model built by the run's own configuration: only
the weights come along; the optimizer, its step, the learning-rate schedule, the data position
and the RNG streams start fresh (a resumed run is ``--resume``).
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fold_train.checkpoint import MAGIC, CheckpointError, save_checkpoint

__all__ = ["import_weights", "load_init_weights", "model_overrides", "read_weights"]


def _kind(path: Path) -> str:
    try:
        with path.open("rb") as f:
            head = f.read(len(MAGIC))
    except OSError as e:
        raise CheckpointError(path, f"cannot read weights: {e}") from e
    if head == MAGIC:
        return "fold"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
        if names and all(n.endswith(".npy") for n in names):
            return "alphafold"
        if _is_protenix(path):
            return "protenix"
    return "openfold"


def _is_protenix(path: Path) -> bool:
    """A torch checkpoint whose ``model`` state dict has Protenix's top-level module names
    (read memory-mapped: only the names are looked at)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 (not a torch zip checkpoint: not Protenix's)
        return False
    state = obj.get("model") if isinstance(obj, Mapping) else None
    if not isinstance(state, Mapping):
        return False
    names = {k.removeprefix("module.").split(".", 1)[0] for k in state}
    return {"pairformer_stack", "diffusion_module", "msa_module"} <= names


def model_overrides(model_config: Any, base: Any, prefix: str = "") -> dict[str, Any]:
    """The ``model.*`` overrides (dotted names) that turn ``base`` into ``model_config``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(model_config):
        mine, theirs = getattr(model_config, f.name), getattr(base, f.name)
        if dataclasses.is_dataclass(mine):
            out.update(model_overrides(mine, theirs, f"{prefix}{f.name}."))
        elif mine != theirs:
            out[f"{prefix}{f.name}"] = mine
    return out


def read_weights(
    path: str | os.PathLike, family: str = "af2",
) -> tuple[str, Any, dict[str, torch.Tensor]]:
    """``(kind, model config, state dict)`` of a fold checkpoint (``kind`` ``"fold"``), an AF2
    parameter file (``"alphafold"``) or an OpenFold checkpoint (``"openfold"``). Unreadable or
    wrong files are a :class:`CheckpointError` naming the file."""
    from fold_model.af2.params_af2 import ParamsError

    path = Path(path)
    kind = _kind(path)
    if kind == "fold":
        from fold_train.predict import load_trained_model

        model, cfg = load_trained_model(path, "cpu", use_ema=True, family=family)
        return kind, cfg.model_config(), {k: v.detach() for k, v in model.state_dict().items()}
    if kind == "protenix" or (family == "af3" and kind == "openfold"):
        return "protenix", *_read_protenix(path, family)
    if family != "af2":
        raise CheckpointError(path, f"is {'an AF2' if kind == 'alphafold' else 'an OpenFold'} "
                                    f"parameter file; this run trains an {family.upper()} model")
    try:
        if kind == "alphafold":
            from fold_model.af2.params_af2 import load_alphafold_params

            model_config, state = load_alphafold_params(path)
        else:
            from fold_model.af2.params_openfold import load_openfold_params

            model_config, state = load_openfold_params(path)
    except ParamsError as e:
        raise CheckpointError(path, str(e).removeprefix(f"{path}: ")) from e
    return kind, model_config, state


def _read_protenix(path: Path, family: str) -> tuple[Any, dict[str, torch.Tensor]]:
    from fold_model.af3.params_protenix import ProtenixParamsError, load_protenix_checkpoint

    if family != "af3":
        raise CheckpointError(path, f"is a Protenix (AF3) checkpoint; this run trains an "
                                    f"{family.upper()} model")
    try:
        return load_protenix_checkpoint(path)
    except ProtenixParamsError as e:
        raise CheckpointError(path, str(e).removeprefix(f"{path}: ")) from e


SOURCES = ("auto", "alphafold", "openfold", "protenix")


def import_weights(src: str | os.PathLike, out: str | os.PathLike, source: str = "auto"
                   ) -> dict[str, Any]:
    """Write the parameters of ``src`` as a fold checkpoint ``out`` that ``fold-train predict``
    reads (and ``train --init-from`` starts from). ``source``: ``alphafold`` / ``openfold`` (AF2:
    the training config ``af2_finetune``, the released weights being fine-tuned ones, with the
    ``model.*`` overrides the file needs: no templates in AF2 models 3-5, the pTM head of
    ``_ptm`` models), ``protenix`` (AF3: the ``af3`` training config with the overrides of the
    file's sizes and Protenix's switches), or ``auto`` (told by the content). fp32. Returns a
    summary."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    src_path = Path(src)
    if source == "protenix" or (source == "auto" and _kind(src_path) == "protenix"):
        return _import_protenix(src_path, out)
    kind, model_config, state = read_weights(src)
    if kind == "fold":
        raise CheckpointError(src, "is already a fold checkpoint")
    if source not in ("auto", kind):
        raise CheckpointError(src, f"is read as {kind} parameters, not {source}")
    from fold_model.af2 import config

    from fold_train.config import preset

    cfg = preset("af2_finetune")
    cfg = dataclasses.replace(
        cfg, system=dataclasses.replace(cfg.system, precision="fp32"),
        model=dataclasses.replace(cfg.model, overrides=model_overrides(model_config,
                                                                       config("af2_finetune"))))
    save_checkpoint(out, {"config": cfg.to_dict(), "model": state, "step": 0,
                          "imported_from": {"path": os.fspath(src), "format": kind}})
    return {"source": os.fspath(src), "format": kind, "out": os.fspath(out),
            "templates": model_config.template.enabled, "ptm": model_config.heads.tm_enabled,
            "parameters": sum(v.numel() for v in state.values()),
            "model_overrides": cfg.model.overrides}


def _import_protenix(src: Path, out: str | os.PathLike) -> dict[str, Any]:
    """:func:`import_weights` of a Protenix checkpoint."""
    from fold_model.af3 import config

    from fold_train.config import preset

    model_config, state = _read_protenix(src, "af3")
    cfg = preset("af3")
    overrides = model_overrides(model_config, config("af3"))
    cfg = dataclasses.replace(
        cfg, system=dataclasses.replace(cfg.system, precision="fp32"),
        model=dataclasses.replace(cfg.model, overrides=overrides))
    save_checkpoint(out, {"config": cfg.to_dict(), "model": state, "step": 0,
                          "imported_from": {"path": os.fspath(src), "format": "protenix"}})
    return {"source": os.fspath(src), "format": "protenix", "out": os.fspath(out),
            "templates": model_config.template.enabled,
            "confidence": model_config.confidence.enabled,
            "parameters": sum(v.numel() for v in state.values()),
            "model_overrides": overrides}


def load_init_weights(model: nn.Module, path: str | os.PathLike, family: str = "af2") -> str:
    """Copy the weights of ``path`` into ``model`` (same names and shapes required; a mismatch
    is a :class:`CheckpointError` listing the differences and the source's configuration).
    Returns the kind of file read."""
    kind, source_config, state = read_weights(path, family)
    mine = model.state_dict()
    missing = sorted(set(mine) - set(state))
    unexpected = sorted(set(state) - set(mine))
    shapes = sorted(k for k in set(mine) & set(state) if mine[k].shape != state[k].shape)
    if missing or unexpected or shapes:
        parts = [f"{len(v)} {what}, e.g. {v[:3]}" for what, v in (
            ("parameter(s) of this model not in it", missing),
            ("parameter(s) this model lacks", unexpected),
            ("parameter(s) of another shape", shapes)) if v]
        hints = _hints(source_config, mine)
        raise CheckpointError(path, "does not fit this run's model: " + "; ".join(parts)
                                    + (f" (the file's model needs {hints})" if hints else ""))
    with torch.no_grad():
        for k, v in mine.items():
            v.copy_(state[k])
    return kind


def _hints(source_config: Any, mine: Mapping[str, torch.Tensor]) -> str:
    """The switches of the file's model that usually explain a mismatch."""
    hints = []
    template = getattr(source_config, "template", None)
    if template is not None and template.enabled != any(k.startswith("template_embedder.")
                                                        for k in mine):
        hints.append(f"model.template.enabled={str(template.enabled).lower()}")
    heads = getattr(source_config, "heads", None)
    if heads is not None and getattr(heads, "tm_enabled", None) is not None and \
            heads.tm_enabled != any(k.startswith("aux_heads.tm.") for k in mine):
        hints.append(f"model.heads.tm_enabled={str(heads.tm_enabled).lower()}")
    return ", ".join(hints)

