"""``fold-train train --cache DIR`` alone: every entry is read and checksummed before training,
and bad ones are refused up front, by name, with the command that rebuilds them (nothing in a
run from --cache alone can rebuild them, so no message may promise it)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _train_helpers import SMALL
from fold_data.cache import INDEX_NAME, FeatureCache
from fold_data.errors import InputError
from fold_train.cache_check import check_entries
from fold_train.cli import main
from fold_train.data import open_cache


def _store(cache: FeatureCache, name: str) -> str:
    key = cache.key([], {"name": name})
    cache.store(key, {"x": np.arange(4096, dtype=np.int32)}, {"name": name})
    return key


def _flip_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the arrays' payload (not the zip directory)
    path.write_bytes(bytes(data))


def test_bad_entries_are_named_with_the_rebuild_command(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B", "3abc_C", "4abc_D"]}
    cache.write_index(keys)
    _flip_byte(cache.path(keys["2abc_B"]))
    truncated = cache.path(keys["4abc_D"])
    truncated.write_bytes(truncated.read_bytes()[:1000])
    with pytest.raises(InputError) as err:
        open_cache(None, tmp_path)
    e = err.value
    assert e.path == str(tmp_path) and e.record == "2abc_B, 4abc_D"
    assert e.reason.startswith("2 of 4 cache entries cannot be used: "
                               f"2abc_B ({keys['2abc_B']}.npz: payload checksum mismatch); "
                               f"4abc_D ({keys['4abc_D']}.npz: unreadable (")
    assert e.reason.endswith("Training from --cache alone cannot rebuild them; rebuild them "
                             f"from the inputs: fold-data cache DATA_DIR --out {tmp_path}")
    assert "will be rebuilt" not in str(e)
    # nothing deleted: the user decides
    assert all(cache.path(k).is_file() for k in keys.values())


def test_only_the_chains_asked_for_are_checked(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B"]}
    cache.write_index(keys)
    _flip_byte(cache.path(keys["2abc_B"]))
    assert open_cache(None, tmp_path, chains=["1abc_A"]) == [("1abc_A", keys["1abc_A"])]


def test_an_entry_of_another_pipeline_version_is_refused(tmp_path):
    cache = FeatureCache(tmp_path)
    key = _store(cache, "1abc_A")
    other = FeatureCache(tmp_path, version="fold-data-0.0.0+af2-raw-0")
    other.store(key, {"x": np.zeros(3, np.int32)}, {"name": "1abc_A"})  # same file name
    with pytest.raises(InputError, match=r"1 of 1 cache entries cannot be used: 1abc_A "
                                         r"\(\w+\.npz: pipeline version 'fold-data-0\.0\.0"):
        check_entries(cache, {"1abc_A": key})


def test_af3_hint_names_the_training_build(tmp_path):
    from fold_data.af3 import af3_cache
    from fold_train.af3_data import af3_cache_dir, open_af3_cache

    cache = af3_cache(af3_cache_dir(tmp_path))
    key = _store(cache, "3o5r")
    cache.write_index({"3o5r": key})
    _flip_byte(cache.path(key))
    with pytest.raises(InputError) as err:
        open_af3_cache(None, tmp_path)
    assert err.value.record == "3o5r"
    assert err.value.reason.endswith("rebuild them from the complexes: fold-train train --preset "
                                     f"PRESET --data COMPLEX_DIR --cache {tmp_path}")


def test_train_from_a_bad_cache_stops_before_training(demo_cache, tmp_path, capsys):
    cache_dir, chains = demo_cache
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    bad_name, bad_key = chains[-1]
    _flip_byte(copy / f"{bad_key}.npz")
    run = tmp_path / "run"
    code = main(["train", "--preset", "tiny", "--cache", str(copy), "--run-dir", str(run),
                 "--no-progress", *SMALL, "steps=2"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"fold-train train: {copy} [{bad_name}]: 1 of {len(chains)} cache entries cannot be " \
           f"used: {bad_name} ({bad_key}.npz: payload checksum mismatch)" in err
    assert f"fold-data cache DATA_DIR --out {copy}" in err and "Traceback" not in err
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert (copy / f"{bad_key}.npz").is_file() and (copy / INDEX_NAME).is_file()
