"""Options and inputs that used to pass as garbage or end in a traceback: non-finite floats,
--templates without its mmCIF directory, evaluation of a NaN prediction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _train_helpers import DEMO
from fold_data.af2.write import Prediction, prediction_to_structure
from fold_data.errors import InputError
from fold_data.mmcif import parse_mmcif
from fold_data.write import write_mmcif
from fold_train.cli import main
from fold_train.evaluate import evaluate_pair
from fold_train.optim import AdamConfig

TRUE = DEMO / "mmcifs" / "4zey.cif"


@pytest.mark.parametrize("override", ["optim.lr=nan", "optim.lr=inf", "optim.eps=-inf",
                                      "optim.clip_norm=nan", "optim.ema_decay=nan",
                                      "data.p_spatial=nan"])
def test_non_finite_float_options_are_refused(override, capsys):
    preset = "af3_tiny" if override.startswith("data.") else "tiny"
    assert main(["train", "--preset", preset, "--print-config", override]) == 2
    key, value = override.split("=")
    assert f"{key}={value!r}: expected a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["lr", "eps", "beta1", "beta2", "clip_norm", "ema_decay"])
def test_optim_config_refuses_nan_in_every_float(field):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        AdamConfig(**{field: math.nan})


def test_templates_without_their_mmcif_directory(tmp_path, capsys):
    fasta = tmp_path / "q.fasta"
    fasta.write_text(">q\nMKV\n")
    code = main(["predict", "--checkpoint", str(tmp_path / "none.ckpt"), "--fasta", str(fasta),
                 "--templates", str(tmp_path / "hits.hhr")])
    assert code == 2
    assert "hits.hhr needs --template-mmcif-dir" in capsys.readouterr().err


def test_evaluating_a_nan_prediction_names_the_file(tmp_path):
    if not TRUE.exists():
        pytest.skip("bundled demo data not found")
    chain = parse_mmcif(TRUE).get_chain("A")
    positions = chain.atom37_positions.astype(np.float32).copy()
    positions[5] = np.nan
    pred = Prediction(aatype=chain.aatype.astype(np.int64), positions=positions,
                      atom_mask=chain.atom37_mask.astype(np.float32),
                      plddt=np.full(chain.num_res, 50.0, np.float32))
    path = write_mmcif(prediction_to_structure(pred, "nan"), tmp_path / "nan.cif")
    with pytest.raises(InputError) as err:
        evaluate_pair(path, TRUE, true_chain="A")
    assert err.value.path == str(path) and "non-finite coordinates" in err.value.reason
