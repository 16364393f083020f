"""Shape buckets: a batch padded to one of a few sizes, so that CUDA graphs are captured per bucket,
not per exact shape (prediction of any length, training with variable crops and MSA depths).

A captured graph replays fixed kernels on fixed addresses, so it serves only inputs of its exact
shape. Rounding each size up to a bucket (:class:`BucketPolicy`) and padding with masks makes
inputs of many lengths share one graph; the masks make the padded result equal the unpadded one
on the real positions (tests compare both, pair-derived outputs included).

The policy (:class:`BucketPolicy`, defaults):

* ``N_res`` / ``N_token``: up to 512 a multiple of 64, above a multiple of 128 (at most 12.5%
  extra pair work above 512, one graph per 64 / 128 residues);
* ``N_atom``: a multiple of 256 (a multiple of the 32-atom query windows of atom attention);
* MSA depths (``N_clust``, ``N_extra``, ``N_msa``) and ``N_templ``: the next power of two up to
  1024, above a multiple of 1024 (AF2 fine-tuning's 5120 extra sequences stay 5120);
* every other dimension (``R``, the batch, feature channels) is kept.

The sizes of the published presets (AF2 256/384 residues, 128/512 clusters, 1024/5120 extra
rows, 4 templates; AF3 384/640/768 tokens with 12 atoms per token, 1024 MSA rows) are buckets
themselves, so fixed-size training pads nothing.

Before padding, a batch is trimmed to its real extent (the last position any mask marks + 1;
fold-data pads only at the end; template slots are kept), so a 100-residue chain that
fold-data padded to a 256-residue preset runs in the 128 bucket. Padded entries take the values
fold-data's own padding uses (``fold_data.af2.transforms.PAD_VALUES`` / ``FRAME_FEATURES``,
``fold_data.af3.transforms.PAD_VALUES``; masks 0), and each feature's dimensions come from the
feature contract (``SAMPLE_FEATURES`` of each family), so each is padded along the right axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Bucket", "BucketPolicy", "fit_to_bucket", "real_extent", "resize_batch"]

# Bucket: the padded sizes of the bucketed dims, as a sorted tuple (hashable: the graph key).
Bucket = tuple[tuple[str, int], ...]

_RESIDUE_DIMS = ("N_res", "N_token")
_DEPTH_DIMS = ("N_clust", "N_extra", "N_msa", "N_templ")


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass(frozen=True)
class BucketPolicy:
    """How sizes round up to buckets (module docstring). Residues / tokens: a multiple of
    ``residue_step`` up to ``large_from``, of ``large_residue_step`` above; atoms: a multiple of
    ``atom_step``; MSA depths and templates: the next power of two up to ``depth_pow2_max``, a
    multiple of it above."""

    residue_step: int = 64
    large_from: int = 512
    large_residue_step: int = 128
    atom_step: int = 256
    depth_pow2_max: int = 1024

    def __post_init__(self) -> None:
        for name in ("residue_step", "large_from", "large_residue_step", "atom_step",
                     "depth_pow2_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"BucketPolicy.{name} must be >= 1, got {getattr(self, name)}")

    def size(self, dim: str, n: int) -> int:
        """The bucket of size ``n`` along the schema dimension ``dim`` (``N_res``, ...)."""
        if n < 0:
            raise ValueError(f"{dim} = {n}: sizes are >= 0")
        if dim in _RESIDUE_DIMS:
            step = self.residue_step if n <= self.large_from else self.large_residue_step
            return max(step, _round_up(n, step))
        if dim == "N_atom":
            return max(self.atom_step, _round_up(n, self.atom_step))
        if dim in _DEPTH_DIMS:
            if n == 0:
                return 0  # no templates: the template stack is skipped, another graph
            if n > self.depth_pow2_max:
                return _round_up(n, self.depth_pow2_max)
            return 1 << (n - 1).bit_length()
        return n

    def bucket(self, sizes: dict[str, int]) -> Bucket:
        """The bucket (sorted ``(dim, padded size)`` pairs) of the real ``sizes``."""
        return tuple(sorted((d, self.size(d, n)) for d, n in sizes.items()))


def _layout(family: str):
    """``(extent masks, SAMPLE_FEATURES, fill values, identity-frame features)`` of a family."""
    from fold_train.families import family_class

    cls = family_class(family)
    schema, fill, frames = cls.bucket_schema()
    return cls.extent_masks, schema, fill, frames


def _axes(spec_shape: tuple, batch_ndim_extra: int) -> dict[str, list[int]]:
    """Tensor axes of each named dimension of a feature (the batch dim adds ``extra``)."""
    out: dict[str, list[int]] = {}
    for i, d in enumerate(spec_shape):
        if isinstance(d, str):
            out.setdefault(d, []).append(i + batch_ndim_extra)
    return out


def real_extent(batch: dict[str, torch.Tensor], family: str) -> dict[str, int]:
    """The real size of each bucketed dimension of a collated batch (``[B, ...]``): the last
    position its mask marks (over the batch and every other axis) + 1, at least 1 (``N_templ``:
    0 allowed). Reads the masks on the host (once per batch, outside any graph)."""
    masks, schema, _, _ = _layout(family)
    sizes = {}
    for dim, name in masks.items():
        if name not in batch:
            raise KeyError(f"{family.upper()} batch has no {name!r} (the mask of {dim})")
        mask = batch[name]
        axis = _axes(schema[name].shape, 1)[dim][0]
        marked = (mask != 0).movedim(axis, -1).reshape(-1, mask.shape[axis]).any(0)
        idx = torch.nonzero(marked).flatten()
        n = int(idx[-1]) + 1 if idx.numel() else 0
        sizes[dim] = n if dim == "N_templ" else max(n, 1)
    return sizes


def resize_batch(batch: dict[str, torch.Tensor], family: str,
                 sizes: dict[str, int]) -> dict[str, torch.Tensor]:
    """``batch`` (collated, ``[B, ...]`` per the family's ``SAMPLE_FEATURES``) with each
    dimension of ``sizes`` cut or padded to that size, at the end, with fold-data's fill values.
    Cutting drops only padding: a mask that marks an entry beyond a new size is a
    ``ValueError`` naming the feature. Features outside the schema are returned unchanged."""
    masks, schema, fill, frames = _layout(family)
    extent = real_extent(batch, family)
    for dim, n in sizes.items():
        if dim in extent and n < extent[dim]:
            mask = masks[dim]
            raise ValueError(f"cannot cut {dim} of the {family.upper()} batch to {n}: "
                             f"{mask!r} marks real entries up to {extent[dim]}")
    out = {}
    for name, t in batch.items():
        spec = schema.get(name)
        if spec is None or not isinstance(t, torch.Tensor):
            out[name] = t
            continue
        axes = _axes(spec.shape, 1)
        for dim, n in sizes.items():
            for axis in axes.get(dim, ()):
                t = _resize_axis(t, axis, n, fill.get(name, 0), identity=name in frames)
        out[name] = t
    return out


def _resize_axis(t: torch.Tensor, axis: int, n: int, fill: float, *, identity: bool
                 ) -> torch.Tensor:
    """``t`` cut or padded to ``n`` along ``axis``; 4x4 frames (last two dims) pad with I."""
    cur = t.shape[axis]
    if n <= cur:
        return t.narrow(axis, 0, n)
    pad_shape = list(t.shape)
    pad_shape[axis] = n - cur
    pad = t.new_full(pad_shape, fill)
    if identity:
        pad[...] = torch.eye(4, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=axis)


def fit_to_bucket(batch: dict[str, torch.Tensor], family: str,
                  policy: BucketPolicy | None = None
                  ) -> tuple[dict[str, torch.Tensor], Bucket]:
    """``(batch trimmed to its real extent and padded to its bucket, the bucket)``. Templates are
    not trimmed (a batch's template slots are its preset's; all-masked slots stay, so the
    template stack runs as it does unpadded), only rounded up."""
    policy = policy or BucketPolicy()
    sizes = real_extent(batch, family)
    sizes["N_templ"] = int(batch["template_mask"].shape[-1])
    bucket = policy.bucket(sizes)
    return resize_batch(batch, family, dict(bucket)), bucket
