"""``fold-train train --dap N --bp B``: documented in --help, folded into the configuration."""

from __future__ import annotations

import json

import pytest
from fold_train.cli import build_parser, main


def test_help_documents_dap_and_bp(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--dap N" in text and "Dynamic Axial Parallelism" in text
    assert "--bp {1,2}" in text and "Branch Parallelism" in text
    assert "model.block_order=parallel" in text


def test_dap_and_bp_flags_set_the_config(capsys):
    assert main(["train", "--preset", "af2_initial", "--print-config", "--dap", "4", "--bp",
                 "2", "model.block_order=parallel"]) == 0
    cfg = json.loads(capsys.readouterr().out)["train"]
    assert (cfg["parallel"]["dap"], cfg["parallel"]["bp"]) == (4, 2)
    # an explicit override given after the flags wins
    assert main(["train", "--print-config", "--dap", "4", "dap=2"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["parallel"]["dap"] == 2
    with pytest.raises(SystemExit) as info:
        main(["train", "--print-config", "--bp", "3"])
    assert info.value.code == 2
    assert main(["train", "--print-config", "--dap", "0"]) == 2
    assert "dap must be >= 1" in capsys.readouterr().err
