"""The training cache build sizes each input first: with ``--max-tokens`` below a complex's size
the complex is skipped with the numbers (nothing featurised), and with nothing left the run stops
before training."""

from __future__ import annotations

import pytest
from _af3_helpers import AF3_DEMO, CCD, needs_af3_demo
from fold_data.af3 import Ccd
from fold_data.errors import InputError
from fold_data.limits import SizeLimits
from fold_train.af3_data import open_af3_cache
from fold_train.cli import main

SKIPPED = ("fold-train: skipping complex 3o5r: {cif} [whole file]: input too large to featurise: "
           "128 tokens/residues > the limit of 50 (--max-tokens)")


def test_af3_complex_over_the_limit_is_skipped_with_the_numbers(tmp_path, capsys):
    needs_af3_demo()
    with pytest.raises(InputError, match="expected at least one usable AF3 complex"):
        open_af3_cache(AF3_DEMO, tmp_path, ccd=Ccd([CCD], use_biotite=False),
                       limits=SizeLimits(max_tokens=50))
    assert SKIPPED.format(cif=AF3_DEMO / "mmcifs" / "3o5r.cif") in capsys.readouterr().out
    assert not list((tmp_path / "af3").glob("*.npz"))  # nothing featurised


def test_train_max_tokens_option_reaches_the_cache_build(tmp_path, capsys):
    needs_af3_demo()
    run = tmp_path / "run"
    code = main(["train", "--preset", "af3_tiny", "--data", str(AF3_DEMO), "--ccd", str(CCD),
                 "--run-dir", str(run), "--no-progress", "--max-tokens", "50", "steps=1"])
    captured = capsys.readouterr()
    assert code == 1
    assert SKIPPED.format(cif=AF3_DEMO / "mmcifs" / "3o5r.cif") in captured.out
    assert "expected at least one usable AF3 complex" in captured.err
    assert not (run / "checkpoints").exists()
