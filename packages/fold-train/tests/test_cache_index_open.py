"""Training from ``--cache`` alone: entries the index lacks are named in a warning, an indexed
entry without its file is a clear error (not a silent run on fewer chains)."""

from __future__ import annotations

import numpy as np
import pytest
from fold_data.cache import CacheWarning, FeatureCache
from fold_data.errors import InputError
from fold_train.data import open_cache


def _store(cache: FeatureCache, name: str) -> str:
    key = cache.key([], {"name": name})
    cache.store(key, {"x": np.zeros(3, np.int32)}, {"name": name})
    return key


def test_unindexed_entries_are_named_in_a_warning(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B", "3abc_C"]}
    cache.write_index({"1abc_A": keys["1abc_A"]})  # an interrupted build lost the others
    with pytest.warns(CacheWarning, match="2 cache entries are not in index.json and are not "
                                          "trained on: 2abc_B, 3abc_C"):
        chains = open_cache(None, tmp_path)
    assert chains == [("1abc_A", keys["1abc_A"])]


def test_an_indexed_entry_without_its_file_is_an_error(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B"]}
    cache.write_index(keys)
    cache.path(keys["2abc_B"]).unlink()
    with pytest.raises(InputError) as err:
        open_cache(None, tmp_path)
    assert err.value.record == "2abc_B" and err.value.path.endswith("index.json")
    assert "no entry file" in err.value.reason
