"""The AF2 feature contract (fold_data.af2.schema): the validator and the pipeline against it."""

from __future__ import annotations

import numpy as np
import pytest
from fold_data.af2 import PRESETS, make_sample
from fold_data.af2.schema import RAW_FEATURES, SAMPLE_FEATURES
from fold_data.schema import SchemaError, validate

SAMPLE_DIMS = {"R", "N_res", "N_clust", "N_extra", "N_templ"}
RAW_DIMS = {"N_res", "N_msa", "N_templ"}


def _synthetic_raw(n_res: int, n_msa: int) -> dict[str, np.ndarray]:
    # Shared with the transform tests: random but valid raw features.
    from test_af2_transforms import synthetic_raw

    return synthetic_raw(n_res, n_msa, n_templ=2, seed=n_res)


def test_specs_are_documented_and_consistent() -> None:
    for schema, dims in ((RAW_FEATURES, RAW_DIMS), (SAMPLE_FEATURES, SAMPLE_DIMS)):
        for name, spec in schema.items():
            assert spec.name == name and spec.doc
            assert spec.dtype in {"float32", "int32", "bytes"}
            assert {d for d in spec.shape if isinstance(d, str)} <= dims, name
    for name, spec in SAMPLE_FEATURES.items():
        assert spec.shape[0] == "R", name  # every sample array carries the recycling dim
        assert spec.dtype != "bytes", name  # samples are numeric only (they become tensors)
    # Ground truth and per-template arrays keep their raw dtype and gain only R.
    for name, spec in RAW_FEATURES.items():
        if name in SAMPLE_FEATURES and name != "aatype" and name != "residue_index":
            assert SAMPLE_FEATURES[name].dtype == spec.dtype
            assert SAMPLE_FEATURES[name].shape == ("R", *spec.shape), name


def _valid_sample(r: int = 2, n_res: int = 7, n_clust: int = 3, n_extra: int = 5, n_templ: int = 2):
    rng = np.random.default_rng(0)
    sizes = {"R": r, "N_res": n_res, "N_clust": n_clust, "N_extra": n_extra, "N_templ": n_templ}
    out = {}
    for name, spec in SAMPLE_FEATURES.items():
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in spec.shape)
        out[name] = (
            rng.integers(0, 20, shape).astype(np.int32)
            if spec.dtype == "int32"
            else rng.normal(size=shape).astype(np.float32)
        )
    return out, sizes


def test_validate_accepts_and_binds_sizes() -> None:
    sample, sizes = _valid_sample()
    assert validate(sample, SAMPLE_FEATURES) == sizes
    batch = {k: np.stack([v, v]) for k, v in sample.items()}
    assert validate(batch, SAMPLE_FEATURES, batched=True) == sizes


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.pop("msa_feat"), "missing feature 'msa_feat'"),
        (lambda s: s.__setitem__("aatype", s["aatype"].astype(np.int64)), "dtype int64"),
        (lambda s: s.__setitem__("msa_feat", s["msa_feat"][..., :48]), "'msa_feat' has shape"),
        (lambda s: s.__setitem__("msa_mask", s["msa_mask"][:, :, :6]), "'msa_mask' has shape"),
        (lambda s: s.__setitem__("seq_mask", s["seq_mask"][None]), "'seq_mask' has shape"),
    ],
)
def test_validate_rejects(mutate, message: str) -> None:
    sample, _ = _valid_sample()
    mutate(sample)
    with pytest.raises(SchemaError, match=message):
        validate(sample, SAMPLE_FEATURES, where="my sample")


def test_validate_rejects_non_finite_presized_and_extra() -> None:
    sample, _ = _valid_sample()
    sample["msa_feat"][0, 1, 2, 3] = np.nan
    with pytest.raises(SchemaError, match="my sample: feature 'msa_feat' has non-finite"):
        validate(sample, SAMPLE_FEATURES, where="my sample")
    sample, _ = _valid_sample()
    with pytest.raises(SchemaError, match="'aatype' has shape"):
        validate(sample, SAMPLE_FEATURES, sizes={"N_res": 8})
    sample["surprise"] = np.zeros(3)
    validate(sample, SAMPLE_FEATURES)
    with pytest.raises(SchemaError, match="unexpected features"):
        validate(sample, SAMPLE_FEATURES, allow_extra=False)


@pytest.mark.parametrize("preset_name", sorted(PRESETS))
def test_pipeline_output_holds_to_the_schema(preset_name: str) -> None:
    preset = PRESETS[preset_name]
    for n_res in (preset.n_res - 13, preset.n_res + 7):  # odd lengths around the crop size
        raw = _synthetic_raw(n_res, n_msa=23)
        validate(raw, RAW_FEATURES, allow_extra=False)
        sample = make_sample(raw, preset, seed=n_res)
        expected = {
            "R": preset.n_cycle,
            "N_res": preset.n_res,
            "N_clust": preset.n_clust,
            "N_extra": preset.n_extra,
            "N_templ": preset.n_templ,
        }
        assert validate(sample, SAMPLE_FEATURES, allow_extra=False) == expected


def test_samples_batch_by_stacking() -> None:
    """Fixed shapes: samples of different chains stack into the batch fold-model consumes."""
    preset = PRESETS["tiny"]
    samples = [make_sample(_synthetic_raw(n, n_msa=9), preset, seed=n) for n in (11, 64, 97)]
    batch = {k: np.stack([s[k] for s in samples]) for k in SAMPLE_FEATURES}
    sizes = validate(batch, SAMPLE_FEATURES, batched=True, allow_extra=False)
    assert sizes["N_res"] == 64 and batch["msa_feat"].shape[:2] == (3, preset.n_cycle)


def test_af2_pipeline_does_not_import_torch() -> None:
    """fold-data builds features without torch (DESIGN.md: dependencies point one way)."""
    import subprocess
    import sys

    code = (
        "import sys, fold_data.af2, fold_data.af2.transforms, fold_data.af2.features; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
