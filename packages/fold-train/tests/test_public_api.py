"""fold_train's public API and its seams: ``__all__`` resolves, the families implement the whole
``Family`` interface, and the generic modules load no model family's code."""

from __future__ import annotations

import subprocess
import sys

import fold_train
import pytest
from fold_train.families import FAMILIES, Family


def test_every_public_name_resolves():
    for name in fold_train.__all__:
        assert getattr(fold_train, name) is not None, name
    with pytest.raises(AttributeError):
        fold_train.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_families_implement_the_interface(name):
    cls = FAMILIES[name]
    required = ["model_config_of", "data_preset_base", "data_preset", "build_model", "make_loss",
                "to_bf16_weights", "n_cycle_max", "forward_loss", "evaluate", "open_cache",
                "load_sample", "eval_samples", "predict", "predict_runner", "bucket_schema"]
    missing = [m for m in required if getattr(cls, m) is getattr(Family, m)]
    assert not missing, f"{name} lacks {missing}"
    assert cls.presets and cls.extent_masks and cls.input_args


def test_generic_modules_load_no_family_code():
    """The loop, the CLI, the config and parallelize import no fold_model.af2 / af3 module (the
    families import theirs when a run uses them)."""
    code = ("import sys; import fold_train.loop, fold_train.cli, fold_train.config, "
            "fold_train.parallelize, fold_train.data, fold_train.distributed; "
            "print([m for m in sys.modules if m.startswith(('fold_model.af2', "
            "'fold_model.af3'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
