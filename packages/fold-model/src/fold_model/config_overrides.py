"""Preset lookup with ``key=value`` overrides, shared by the AF2 and AF3 configs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["build_config"]

C = TypeVar("C")


def build_config(kind: str, presets: Mapping[str, Callable[[], C]], name: str,
                 overrides: Mapping[str, Any]) -> C:
    """``presets[name]()`` with ``overrides`` applied; nested fields use a double underscore
    (``evoformer__no_blocks=2``). Unknown presets and fields raise ``ValueError``."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; presets are {sorted(presets)}")
    cfg = presets[name]()
    for key, value in overrides.items():
        target: Any = cfg
        *path, leaf = key.split("__")
        for part in path:
            if not hasattr(target, part):
                raise ValueError(f"config override {key!r}: no field {part!r}")
            target = getattr(target, part)
        if not hasattr(target, leaf):
            raise ValueError(f"config override {key!r}: {type(target).__name__} has no {leaf!r}")
        setattr(target, leaf, value)
    post_init = getattr(cfg, "__post_init__", None)
    if post_init is not None:
        post_init()  # re-validate after the overrides
    return cfg
