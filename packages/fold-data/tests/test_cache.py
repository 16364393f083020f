"""FeatureCache and build_cache: exact round trip, corruption, staleness, no pickle, atomicity."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import fold_data.cache as cache_mod
import numpy as np
import pytest
from fold_data.cache import CacheWarning, FeatureCache, build_cache, pipeline_version
from fold_data.errors import InputError, InputWarning

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"


def random_features(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_res, n_msa = 7, 5  # odd sizes
    return {
        "aatype": rng.integers(0, 21, n_res).astype(np.int32),
        "msa": rng.integers(0, 22, (n_msa, n_res)).astype(np.int32),
        "deletion_matrix": rng.random((n_msa, n_res)).astype(np.float32),
        "all_atom_positions": rng.normal(size=(n_res, 37, 3)).astype(np.float32) * 30,
        "resolution": np.float32(rng.random() * 3),  # 0-d
        "seq_length": np.array(n_res, dtype=np.int32),
        "sequence": np.array(b"MKVLA\x00X", dtype="S7"),  # bytes scalar with an embedded NUL
        "msa_species": np.array([b"9606", b"", b"10090", b"x", b"HUMAN"], dtype="S5"),
        "empty_templates": np.zeros((0, n_res), dtype=np.int32),
        "mask": rng.random(n_res) > 0.5,
        "f64": rng.normal(size=3),
        "names": np.array(["ab", "c"]),  # unicode
        "fortran": np.asfortranarray(rng.normal(size=(3, 5)).astype(np.float32)),
    }


def write_inputs(tmp_path: Path, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for name in ("x.cif", "uniref90_hits.sto"):
        p = tmp_path / "inputs" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(rng.bytes(300))
        paths.append(p)
    return paths


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].flags.writeable, k
        assert a[k].dtype == np.asarray(b[k]).dtype, k
        assert a[k].shape == np.asarray(b[k]).shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_round_trip_is_exact_and_needs_no_pickle(tmp_path):
    cache = FeatureCache(tmp_path / "c", version="v1")
    feats = random_features()
    key = cache.key(write_inputs(tmp_path), {"chain_id": "A"})
    path = cache.store(key, feats, {"name": "1abc_A"})
    assert path == tmp_path / "c" / f"{key}.npz"
    assert_same(cache.load(key), feats)
    with np.load(path, allow_pickle=False) as npz:  # readable by anyone without unpickling
        assert set(npz.files) == set(feats) | {"__meta__"}
    meta = cache.read_meta(key)
    assert meta["name"] == "1abc_A" and meta["key"] == key and meta["version"] == "v1"
    assert cache.load("0" * 64) is None
    compressed = FeatureCache(tmp_path / "z", version="v1", compress=True)
    compressed.store(key, feats, {})
    assert_same(compressed.load(key), feats)


def test_object_array_on_disk_is_never_unpickled(tmp_path):
    cache = FeatureCache(tmp_path, version="v1")
    key = "f" * 64
    with open(cache.path(key), "wb") as f:  # what a hostile or buggy writer could leave
        np.savez(f, x=np.array([{"a": 1}], dtype=object), __meta__=np.zeros(3, np.uint8))
    with pytest.warns(CacheWarning, match="pickle"):
        assert cache.load(key) is None
    assert not cache.path(key).exists()


def test_object_arrays_are_refused(tmp_path):
    cache = FeatureCache(tmp_path, version="v1")
    bad = {"sequence": np.array([b"MKV"], dtype=object)}
    with pytest.raises(TypeError, match="'sequence'.*pickle"):
        cache.store("k", bad, {})
    with pytest.raises(TypeError, match="numpy array"):
        cache.store("k", {"x": [1, 2]}, {})
    with pytest.raises(ValueError, match="reserved"):
        cache.store("k", {"__meta__": np.zeros(2)}, {})
    assert list(tmp_path.iterdir()) == []


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


DAMAGES = ["truncate", "flip_payload", "flip_header", "garbage", "wrong_key"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_corrupt_entry_is_detected_deleted_and_rebuilt(tmp_path, damage):
    cache = FeatureCache(tmp_path / "c", version="v1")
    inputs = write_inputs(tmp_path)
    calls = []

    def build():
        calls.append(1)
        return random_features()

    first = cache.fetch("1abc_A", inputs, {}, build)
    assert first.status == "built"
    path = first.path
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "flip_payload":
        arr_offset = path.read_bytes().index(random_features()["all_atom_positions"].tobytes()[:16])
        _flip_byte(path, arr_offset + 5)
    elif damage == "flip_header":  # the .npy header of one array: its shape
        _flip_byte(path, path.read_bytes().index(b"'shape': (") + 11)
    elif damage == "garbage":
        path.write_bytes(b"\x80\x04cos\nsystem\n")  # a pickle: must never be executed
    else:  # a valid file under another key's name
        other = cache.key(inputs, {"other": 1})
        shutil.copy(path, cache.path(other))
        with pytest.warns(CacheWarning, match="key"):
            assert cache.load(other) is None
        assert not cache.path(other).exists()
        return
    with pytest.warns(CacheWarning, match="corrupt"):
        again = cache.fetch("1abc_A", inputs, {}, build)
    assert again.status == "rebuilt-corrupt" and len(calls) == 2
    assert_same(again.features, random_features())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.fetch("1abc_A", inputs, {}, build).status == "reused"
    assert len(calls) == 2


def test_flip_every_region_is_caught(tmp_path):
    """No single flipped byte anywhere in the file yields a silently different entry."""
    cache = FeatureCache(tmp_path, version="v1")
    feats = {"a": np.arange(6, dtype=np.int32), "s": np.array([b"ab"], dtype="S2")}
    path = cache.store("k", feats, {})
    pristine = path.read_bytes()
    for offset in range(0, len(pristine), 7):
        path.write_bytes(pristine)
        _flip_byte(path, offset)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            got = cache.load("k")
        if got is not None:  # zip slack bytes (e.g. timestamps) may be harmless
            assert_same(got, feats)


def test_stale_entries_get_new_keys(tmp_path):
    inputs = write_inputs(tmp_path)
    v1 = FeatureCache(tmp_path / "c", version="v1")
    params = {"chain_id": "A", "max_template_date": "2020-01-01"}
    key = v1.key(inputs, params)
    assert key == v1.key(inputs, {"max_template_date": "2020-01-01", "chain_id": "A"})
    assert key != v1.key(inputs, {**params, "chain_id": "B"})
    assert key != FeatureCache(tmp_path / "c", version="v2").key(inputs, params)
    assert key != v1.key(inputs[::-1], params)
    os.utime(inputs[0], (1, 1))  # mtime is not content
    assert key == v1.key(inputs, params)
    inputs[1].write_bytes(inputs[1].read_bytes()[:-1] + b"!")
    assert key != v1.key(inputs, params)
    # A changed input is rebuilt, not served from the old entry.
    calls = []
    v1.fetch("x", inputs, {}, lambda: calls.append(1) or random_features(1))
    inputs[0].write_bytes(b"changed")
    rebuilt = v1.fetch("x", inputs, {}, lambda: calls.append(1) or random_features(2))
    assert rebuilt.status == "built"
    assert len(calls) == 2
    with pytest.raises(InputError, match="missing.cif"):
        v1.key([tmp_path / "missing.cif"], {})
    assert pipeline_version().startswith("fold-data-")


def test_crash_mid_write_leaves_no_partial_file(tmp_path, monkeypatch):
    cache = FeatureCache(tmp_path, version="v1")
    cache.store("good", random_features(), {})
    before = sorted(p.name for p in tmp_path.iterdir())

    def crashing_writer(fileobj, arrays, compress):
        fileobj.write(b"PK\x03\x04 half an npz")
        raise OSError("disk full")

    monkeypatch.setattr(cache_mod, "_write_npz", crashing_writer)
    for key in ("good", "new"):  # neither a new entry nor an overwrite leaves a partial file
        with pytest.raises(OSError, match="disk full"):
            cache.store(key, random_features(1), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp file left over
    assert cache.load("new") is None
    assert_same(cache.load("good"), random_features())


# Module-level featurizers: build_cache pickles them into its worker processes.
def fake_featurize(mmcif_path, chain_id, msa_paths=(), template_hits=None, **kwargs):
    """A stand-in for make_features that depends on every input's bytes."""
    if chain_id == "B":
        raise InputError(mmcif_path, chain_id, "expected a protein chain")
    blob = b"".join(Path(p).read_bytes()[:64] for p in (mmcif_path, *msa_paths))
    return {
        "seed": np.frombuffer(blob, dtype=np.uint8).astype(np.int32),
        "chain": np.array(chain_id.encode(), dtype="S"),
        "n_msa": np.array(len(msa_paths), dtype=np.int32),
        "date": np.array(str(kwargs.get("max_template_date")).encode()),
    }


def test_build_cache_reports_each_chain(tmp_path):
    if not DEMO.is_dir():
        pytest.skip("data/demo is absent")
    out = tmp_path / "cache"
    kw = dict(featurize=fake_featurize, progress=False, max_template_date="2021-10-10")
    report = build_cache(DEMO, out, workers=2, **kw)
    by_name = {r.name: r for r in report.results}
    assert set(by_name) == {"1psm_A", "2q2k_A", "2q2k_B", "3u8v_A", "3zee_A", "4zey_A"}
    assert by_name["2q2k_B"].status == "failed" and "protein chain" in by_name["2q2k_B"].error
    assert report.count("built") == 5 and not report.ok
    assert "1 failed" in report.summary() and "2q2k_B" in report.summary()

    index = json.loads((out / "index.json").read_text())["entries"]
    assert set(index) == {"1psm_A", "2q2k_A", "3u8v_A", "3zee_A", "4zey_A"}
    cache = FeatureCache(out)
    feats = cache.load(index["4zey_A"])
    assert feats["chain"] == b"A" and feats["n_msa"] == 3 and feats["date"] == b"2021-10-10"

    # Second run: everything reused; a damaged entry is rebuilt; other params -> new keys.
    cache.path(index["1psm_A"]).write_bytes(b"not an npz")
    with pytest.warns(CacheWarning):
        again = build_cache(DEMO, out, workers=1, chains=["1psm_A", "4zey_A"], **kw)
    assert [r.status for r in again.results] == ["rebuilt-corrupt", "reused"]
    other = build_cache(DEMO, out, workers=1, chains=["4zey_A"], featurize=fake_featurize,
                        progress=False, max_template_date="2018-01-01")
    assert other.results[0].status == "built" and other.results[0].key != index["4zey_A"]
    # Another featurizer never reuses these entries, even in the same directory.
    third = build_cache(DEMO, out, workers=1, chains=["4zey_A"], featurize=other_featurize,
                        progress=False, max_template_date="2018-01-01")
    assert third.results[0].status == "built" and third.results[0].key != other.results[0].key
    assert third.results[0].warnings == ["InputWarning: a skipped template hit"]


def other_featurize(mmcif_path, chain_id, msa_paths=(), template_hits=None, **kwargs):
    warnings.warn("a skipped template hit", InputWarning, stacklevel=2)
    return {"x": np.arange(3)}


def store_many(root: str, key: str, times: int) -> int:
    cache = FeatureCache(root, version="v1")
    for _ in range(times):
        cache.store(key, random_features(3), {"name": "same"})
    return times


def test_concurrent_writers_of_one_entry_never_expose_a_partial_file(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    cache = FeatureCache(tmp_path, version="v1")
    key = "c" * 64
    expected = random_features(3)
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # a torn read would warn: fail instead
        with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(store_many, str(tmp_path), key, 30) for _ in range(2)]
            while not all(f.done() for f in futures):
                got = cache.load(key)
                if got is not None:
                    assert_same(got, expected)
                    seen += 1
            assert [f.result() for f in futures] == [30, 30]
    assert_same(cache.load(key), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.npz"]  # no temp files left


def test_read_only_cache_ignores_a_corrupt_entry(tmp_path):
    cache = FeatureCache(tmp_path / "ro", version="v1")
    cache.store("k", random_features(), {})
    cache.path("k").write_bytes(b"junk")
    os.chmod(tmp_path / "ro", 0o555)
    try:
        if os.access(cache.path("k").parent, os.W_OK):
            pytest.skip("running as a user who can write anyway (root)")
        with pytest.warns(CacheWarning, match="could not delete"):
            assert cache.load("k") is None
    finally:
        os.chmod(tmp_path / "ro", 0o755)
