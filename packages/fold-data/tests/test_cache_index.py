"""The cache index under concurrent writers (locked: no entry lost), reconciled with the entry
files (lost entries added back, indexed entries without a file reported), and ``fold-data
inspect`` saying when the two disagree."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
from fold_data.cache import FeatureCache
from fold_data.cli import main


def _writer(root: str, worker: int, n: int) -> None:
    cache = FeatureCache(root)
    for i in range(n):
        cache.write_index({f"w{worker}_{i}": f"{worker:02d}{i:062d}"})


def test_concurrent_index_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    index = FeatureCache(tmp_path).read_index()
    assert len(index) == 160 and index["w3_39"] == f"03{39:062d}"


def _store(cache: FeatureCache, name: str, seed: int) -> str:
    key = cache.key([], {"name": name})
    cache.store(key, {"x": np.full(3, seed, np.int32)}, {"name": name})
    return key


def test_reconcile_finds_unindexed_entries_and_missing_files(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n, i) for i, n in enumerate(["a", "b", "c"])}
    cache.write_index({"a": keys["a"], "gone": "f" * 64})
    check = cache.reconcile_index()
    assert check.unindexed == {"b": keys["b"], "c": keys["c"]}
    assert check.missing == ["gone"]
    assert cache.read_index() == {"a": keys["a"], "gone": "f" * 64}  # only reported
    assert cache.reconcile_index(add=True).entries == {**keys, "gone": "f" * 64}
    assert cache.read_index() == {**keys, "gone": "f" * 64}  # written back, under the lock
    # an entry of another pipeline version is not taken for a lost one
    old = FeatureCache(tmp_path, version="older")
    _store(old, "d", 9)
    assert cache.reconcile_index().unindexed == {}


def test_inspect_reports_an_index_that_disagrees_with_the_files(tmp_path, capsys):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n, i) for i, n in enumerate(["a", "b"])}
    cache.write_index({"a": keys["a"]})
    assert main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "1 files are not in index.json" in out and "2/2 valid" in out
    cache.write_index({"b": keys["b"]})
    assert main(["inspect", str(tmp_path)]) == 0
