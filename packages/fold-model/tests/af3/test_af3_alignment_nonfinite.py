"""A diverged sample's non-finite coordinates give a NaN rotation for that sample only (so the
loss is NaN and the trainer's non-finite guard skips the step), never a LinAlgError."""

from __future__ import annotations

import pytest
import torch
from fold_model.af3.alignment import weighted_rigid_transform


@pytest.mark.parametrize("method", ["svd", "quaternion"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_sample_gives_nan_not_an_exception(method, bad):
    gen = torch.Generator().manual_seed(0)
    moving = torch.randn(3, 6, 3, generator=gen)
    fixed = torch.randn(3, 6, 3, generator=gen)
    weights = torch.ones(3, 6)
    clean = weighted_rigid_transform(moving, fixed, weights, method=method)[0]
    moving[1, 2] = bad
    rot = weighted_rigid_transform(moving, fixed, weights, method=method)[0]
    assert torch.isnan(rot[1]).any()
    torch.testing.assert_close(rot[[0, 2]], clean[[0, 2]])


@pytest.mark.parametrize("method", ["svd", "quaternion"])
def test_huge_finite_coordinates_still_align(method):
    moving = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(1))
    moving[0] *= 1e30  # what an absurd learning rate leaves: finite, far too large
    rot = weighted_rigid_transform(moving, torch.randn(2, 6, 3), torch.ones(2, 6),
                                   method=method)[0]
    assert torch.isfinite(rot).all()
