"""The model families by name: :class:`~fold_train.families.base.Family` and its AF2 and AF3
implementations. A training preset belongs to the family that lists it in its ``presets``; a new
family is one module here and one line in :data:`FAMILIES`."""

from __future__ import annotations

from typing import Any

from fold_train.families.af2 import AF2Family
from fold_train.families.af3 import AF3Family
from fold_train.families.base import Family

__all__ = ["AF2Family", "AF3Family", "FAMILIES", "Family", "family_class", "family_of_preset",
           "make_family", "train_presets"]

FAMILIES: dict[str, type[Family]] = {f.name: f for f in (AF2Family, AF3Family)}


def family_class(name: str) -> type[Family]:
    """The family registered as ``name``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; families are {sorted(FAMILIES)}")
    return FAMILIES[name]


def make_family(name: str, model_config: Any = None) -> Family:
    """The family ``name`` of a run with fold-model config ``model_config``."""
    return family_class(name)(model_config)


def train_presets() -> dict[str, type[Family]]:
    """Every training preset name -> its family."""
    return {p: f for f in FAMILIES.values() for p in f.presets}


def family_of_preset(preset: str) -> type[Family] | None:
    """The family of training preset ``preset`` (None: no family has it)."""
    return train_presets().get(preset)
