"""Training from ``--cache`` alone: an index that lost entries is reconciled with a warning, an
indexed entry without its file is a clear error (not a run on fewer chains)."""

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


def test_lost_index_entries_are_added_back_with_a_warning(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B", "3abc_C"]}
    cache.write_index({"1abc_A": keys["1abc_A"]})  # a concurrent build lost the others
    with pytest.warns(CacheWarning, match="2 cache entries were missing from index.json"):
        chains = open_cache(None, tmp_path)
    assert chains == sorted(keys.items())


def test_an_indexed_entry_without_its_file_is_an_error(tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {n: _store(cache, n) for n in ["1abc_A", "2abc_B"]}
    cache.write_index(keys)
    cache.path(keys["2abc_B"]).unlink()
    with pytest.raises(InputError) as err:
        open_cache(None, tmp_path)
    assert err.value.record == "2abc_B" and err.value.path.endswith("index.json")
    assert "no entry file" in err.value.reason
