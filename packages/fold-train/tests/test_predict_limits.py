"""``fold-train predict`` sizes its input before making any feature: a 100 000-residue protein
and an AF3 JSON of 2000 chains are refused in seconds with the numbers (residues / tokens, the
bytes of the pair representation, the device's free memory) and the options; an input that fits
only chunked is told to chunk; one close to the budget warns; ``--memory-limit`` and
``--max-tokens`` change the limits. The budget is injected (``--memory-limit`` or ``memory=``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _af3_helpers import CCD, needs_af3_demo
from fold_data.limits import InputTooLarge, SizeWarning
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.memory_estimate import af2_estimate
from fold_train.predict_size import check_af2_input
from test_predict_safety import _checkpoint

MIB = 2**20


def _fasta(tmp_path: Path, n_res: int) -> Path:
    path = tmp_path / "q.fasta"
    path.write_text(">q\n" + ("MKTAYIAKQR" * (n_res // 10 + 1))[:n_res] + "\n")
    return path


def test_a_100000_residue_protein_is_refused_before_any_work(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.ckpt")
    fasta = _fasta(tmp_path, 100_000)
    out = tmp_path / "out.cif"
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu", "--fasta", str(fasta),
                 "--out", str(out), "--memory-limit", "80GiB"])
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert err.startswith(f"fold-train predict: {fasta} [size]: input too large for this "
                          "device: AF2 prediction (N_res=100000, N_seq=7, N_extra=8, fp32) "
                          "needs about ")
    # 2 x 100000^2 x c_z=12 x 4 bytes = 894.1 GiB for the pair representation and its update
    assert "but 80.0 GiB is available on cpu; what stays resident through the trunk alone is " \
           "894.2 GiB (pair representation [N_res, N_res, c_z=12] and its update: 894.1 GiB; " \
           "MSA representation [N_seq=7, N_res, c_m=16] and its update: 85.4 MiB" in err
    assert "which no chunking reduces. Options: a device with more free memory" in err
    assert "crop the query" in err


def _tiny():
    cfg = apply_overrides(preset("tiny"), ["data.n_res=24", "data.n_clust=6", "data.n_extra=8",
                                           "data.n_templ=1"])
    return cfg.model_config(), cfg.data_preset()


def test_an_input_that_fits_only_chunked_is_told_to_chunk(tmp_path):
    model_config, data_preset = _tiny()
    fasta = _fasta(tmp_path, 300)
    kw = {"fasta": fasta, "model_config": model_config, "data_preset": data_preset,
          "precision": "fp32", "device": "cpu", "memory": lambda device: 100 * MIB}
    with pytest.raises(InputTooLarge) as err:
        check_af2_input(**kw)
    reason = err.value.reason
    assert "its largest intermediate is triangle attention logits [N_res, H=3, N_res, N_res], " \
           "309.0 MiB, on top of 8.6 MiB resident" in reason
    assert "Options: chunk it: --autochunk auto (or --chunk-size 64" in reason
    assert check_af2_input(**kw, chunk_size=8).n_tokens == 300  # 8/300 of it fits
    with pytest.raises(InputTooLarge, match="with this chunking.*Options: a smaller --chunk-size"):
        check_af2_input(**{**kw, "memory": lambda device: 10 * MIB}, chunk_size=64)


def test_close_to_the_budget_warns(tmp_path):
    model_config, data_preset = _tiny()
    peak = af2_estimate(300, model_config, data_preset, chunk_size=8).peak_bytes
    with pytest.warns(SizeWarning, match=r"q\.fasta: AF2 prediction \(N_res=300.*, and .* is "
                                         r"available on cpu: it may not fit"):
        check_af2_input(fasta=_fasta(tmp_path, 300), model_config=model_config,
                        data_preset=data_preset, precision="fp32", device="cpu", chunk_size=8,
                        memory_limit=int(peak / 0.9))


def test_max_tokens_refuses_and_names_the_option(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model.ckpt")
    fasta = _fasta(tmp_path, 40)
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu", "--fasta", str(fasta),
                 "--out", str(tmp_path / "o.cif"), "--max-tokens", "30"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{fasta} [query]: input too large to featurise: 40 tokens/residues > the limit of " \
           "30 (--max-tokens)" in err


def test_an_af3_json_of_2000_chains_is_refused_before_featurisation(tmp_path, capsys):
    needs_af3_demo()
    ckpt = _checkpoint(tmp_path / "af3.ckpt", "af3_tiny")
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    ids = [a + b + c for a in letters for b in letters for c in letters][:2000]
    doc = {"name": "crowd", "dialect": "alphafold3", "version": 4, "modelSeeds": [1],
           "sequences": [{"protein": {"id": ids, "sequence": "GAPATVTEQGEDITSKKDRG"}}]}
    path = tmp_path / "crowd.json"
    path.write_text(json.dumps(doc))
    code = main(["predict", "--checkpoint", str(ckpt), "--device", "cpu", "--json", str(path),
                 "--ccd", str(CCD), "--out", str(tmp_path / "crowd.cif"),
                 "--memory-limit", "80GiB"])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "crowd.cif").exists()
    assert err.startswith(f"fold-train predict: {path} [size]: input too large for this "
                          "device: AF3 prediction (N_token=40000, N_atom=")
    assert "but 80.0 GiB is available on cpu" in err
    assert "pair representation [N_token, N_token, c_z=" in err
    assert ("Options: samples in smaller groups (--sample-group 1) or fewer diffusion samples "
            "(--samples 1); a device with more free memory") in err
    assert "crop the input (fewer chains or residues: 2000 chains, 40000 tokens" in err
