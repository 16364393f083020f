"""The feature-spec validator that both families' schemas use (``fold_data.af2.schema``,
``fold_data.af3.schema``): a schema is a dict of named :class:`FeatureSpec` (dtype, symbolic
shape, meaning) and :func:`validate` checks a feature dict against one, binding each symbolic
dimension to the size it first meets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FeatureSpec", "SchemaError", "feature_specs", "validate"]

_F32 = "float32"


class SchemaError(ValueError):
    """A feature dict that breaks the schema (missing name, wrong dtype, wrong shape)."""


@dataclass(frozen=True)
class FeatureSpec:
    """One named array: dtype, shape (symbolic dims as str, fixed sizes as int), meaning."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]
    doc: str


def feature_specs(*rows: tuple) -> dict[str, FeatureSpec]:
    """A schema from ``(name, dtype, shape, doc)`` rows."""
    return {r[0]: FeatureSpec(*r) for r in rows}


def _dim_ok(expected: str | int, actual: int, sizes: dict[str, int]) -> bool:
    if isinstance(expected, int):
        return expected == actual
    if expected in sizes:
        return sizes[expected] == actual
    sizes[expected] = actual
    return True


def validate(
    features: dict[str, np.ndarray],
    schema: dict[str, FeatureSpec],
    *,
    where: str = "features",
    sizes: dict[str, int] | None = None,
    batched: bool = False,
    allow_extra: bool = True,
) -> dict[str, int]:
    """Check ``features`` against ``schema``; return the sizes bound to each symbolic dim.

    ``sizes`` pre-binds dims (e.g. ``{"N_res": 256}``). ``batched`` allows one extra leading dim.
    Works on numpy arrays and on torch tensors (anything with ``.shape`` and ``.dtype``).
    Raises :class:`SchemaError` naming ``where`` and the feature.
    """
    sizes = dict(sizes or {})
    for name, spec in schema.items():
        if name not in features:
            raise SchemaError(f"{where}: missing feature {name!r} ({spec.doc})")
        arr = features[name]
        shape = tuple(arr.shape)
        if batched:
            shape = shape[1:]
        dtype = str(arr.dtype).replace("torch.", "")
        if spec.dtype == "bytes":
            ok_dtype = dtype.startswith("|S") or dtype.startswith("bytes") or dtype == "object"
        else:
            ok_dtype = dtype == spec.dtype
        if not ok_dtype:
            raise SchemaError(f"{where}: feature {name!r} has dtype {dtype}, expected {spec.dtype}")
        if len(shape) != len(spec.shape) or not all(
            _dim_ok(e, a, sizes) for e, a in zip(spec.shape, shape)
        ):
            raise SchemaError(
                f"{where}: feature {name!r} has shape {shape}, expected {spec.shape} with {sizes}"
            )
        if spec.dtype == _F32:
            a = arr.detach().cpu().numpy() if hasattr(arr, "detach") else np.asarray(arr)
            if not np.all(np.isfinite(a)):
                raise SchemaError(f"{where}: feature {name!r} has non-finite values")
    if not allow_extra:
        extra = sorted(set(features) - set(schema))
        if extra:
            raise SchemaError(f"{where}: unexpected features {extra}")
    return sizes
