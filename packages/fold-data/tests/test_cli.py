"""The fold-data CLI: cache (build, reuse, failures), inspect (validity), argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fold_data.cache import CacheWarning
from fold_data.cli import main
from fold_data.errors import InputError

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"
pytestmark = pytest.mark.skipif(not DEMO.is_dir(), reason="data/demo is absent")


def fake_featurize(mmcif_path, chain_id, msa_paths=(), template_hits=None, **kwargs):
    """A small stand-in featurizer (module-level: the cache command may run it in a worker)."""
    if Path(mmcif_path).stem == "2q2k":
        raise InputError(mmcif_path, chain_id, "expected a protein-only entry")
    text = Path(mmcif_path).read_bytes()
    return {
        "n_atoms": np.array(text.count(b"\nATOM"), dtype=np.int32),
        "msa_bytes": np.array([Path(p).stat().st_size for p in msa_paths], dtype=np.int64),
        "chain": np.array(chain_id.encode()),
    }


FEATURIZER = f"{__name__}:fake_featurize"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cache_then_reuse_then_inspect(tmp_path, capsys):
    out = tmp_path / "cache"
    args = ("cache", DEMO, "--out", out, "--workers", 1, "--no-progress",
            "--featurizer", FEATURIZER, "--chains", "4zey_A,1psm_A")
    code, text, _ = run(capsys, *args)
    assert code == 0, text
    assert "2 built, 0 reused, 0 rebuilt-corrupt, 0 failed" in text
    code, text, _ = run(capsys, *args)
    assert code == 0 and "0 built, 2 reused" in text

    code, text, _ = run(capsys, "inspect", out)
    assert code == 0, text
    assert "4zey_A" in text and "n_atoms" in text and "<i4" in text and "2/2 valid" in text
    files = sorted(out.glob("*.npz"))
    code, text, _ = run(capsys, "inspect", files[0])
    assert code == 0 and "1/1 valid" in text

    data = bytearray(files[0].read_bytes())
    data[len(data) // 3] ^= 0xFF
    files[0].write_bytes(bytes(data))
    code, text, _ = run(capsys, "inspect", out)
    assert code == 1 and "INVALID" in text and "1/2 valid" in text
    with pytest.warns(CacheWarning, match="corrupt"):
        code, text, _ = run(capsys, *args)
    assert code == 0 and "1 rebuilt-corrupt" in text


def test_failed_chain_sets_exit_status(tmp_path, capsys):
    code, text, _ = run(capsys, "cache", DEMO, "--out", tmp_path, "--workers", 2, "--no-progress",
                        "--featurizer", FEATURIZER, "--max-template-date", "2021-10-10")
    assert code == 1
    assert "4 built" in text and "2 failed" in text
    assert "FAILED 2q2k_A" in text and "protein-only" in text


def test_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["cache", str(DEMO), "--out", str(tmp_path), "--max-template-date", "21-10-10"])
    assert e.value.code == 2 and "YYYY-MM-DD" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["cache", str(DEMO), "--out", str(tmp_path), "--featurizer", "nope_module:f"])
    assert e.value.code == 2 and "cannot import" in capsys.readouterr().err
    code, _, err = run(capsys, "cache", tmp_path / "missing", "--out", tmp_path / "c",
                       "--featurizer", FEATURIZER)
    assert code == 1 and "mmcifs" in err
    code, _, err = run(capsys, "inspect", tmp_path / "nothing")
    assert code == 2 and "no such file" in err


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "fold_data.cli", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for command in ("cache", "inspect", "demo"):
        assert command in res.stdout


def test_demo_end_to_end_on_bundled_data(tmp_path, capsys):
    """The main job: real make_features into the cache, make_sample through the loader."""
    args = ("demo", DEMO, "--cache", tmp_path, "--workers", 1, "--no-progress",
            "--chains", "1psm_A,2q2k_A", "--samples", 3, "--loader-workers", 1)
    code, text, err = run(capsys, *args)
    assert code == 0, text + err
    assert "2 built" in text and "1psm_A: {'aatype': [38]" in text
    assert "msa_feat (3, 16, 64, 49)" in text  # tiny preset: R=3, N_clust=16, N_res=64
    assert "loader: 3 samples" in text
    code, text, _ = run(capsys, *args)
    assert code == 0 and "2 reused" in text
