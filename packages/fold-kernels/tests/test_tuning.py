"""Per-architecture candidates and the cached autotuner (timing replaced by a fake)."""

from __future__ import annotations

import json

import pytest
import triton.testing
from fold_kernels import tuning


@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq", "dbias"])
def test_attention_candidates_per_architecture(kernel):
    nv = tuning.attention_configs(kernel, "sm90", 32)
    amd = tuning.attention_configs(kernel, "gfx942", 32)
    assert len(nv) >= 2 and len(amd) == len(nv)
    assert all(c.num_stages <= 2 for c in amd)  # CDNA: shallower software pipelines
    assert all(c.rows in (1, 2, 4) for c in nv)
    assert len(tuning.attention_configs(kernel, "interpreter", 32)) == 1


def test_large_forward_tiles_only_for_half_dtypes_at_head_dim_32():
    """The 128-query forward tiles (the two that won an H100 sweep) need about 100 KB of shared
    memory in bf16 (twice that in fp32): offered for 2-byte dtypes at head dims 17-32 only,
    after the default."""
    fp32 = tuning.attention_configs("fwd", "sm90", 32)
    half = tuning.attention_configs("fwd", "sm90", 32, itemsize=2)
    assert half[: len(fp32)] == fp32 and len(half) > len(fp32)
    assert {c.rows for c in half} == {1, 2} and max(c.block_m for c in half) >= 128
    assert all(c.rows <= 2 and c.block_m <= 64 for c in fp32)
    for d in (16, 64):  # other head dims: the same candidates for every dtype
        assert (tuning.attention_configs("fwd", "sm90", d, itemsize=2)
                == tuning.attention_configs("fwd", "sm90", d))


def test_pinned_config_bypasses_the_tuner(monkeypatch):
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "1")
    cands = [tuning.Config(64, 64), tuning.Config(32, 32)]
    launched = []
    with tuning.pinned("k", cands[1]):
        assert tuning.pick("k", (1,), cands, launched.append) == cands[1]
        with tuning.pinned("k", cands[0]):  # nested: the inner one wins, then the outer again
            assert tuning.pick("k", (1,), cands, launched.append) == cands[0]
        assert tuning.pick("k", (1,), cands, launched.append) == cands[1]
        monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "0")
        assert tuning.pick("other", (1,), cands, launched.append) == cands[0]  # not pinned
    assert not launched and not tuning._PINNED  # nothing timed, nothing left pinned


def test_pick_times_once_and_caches_on_disk(tmp_path, monkeypatch):
    cache = tmp_path / "tuning.json"
    monkeypatch.setenv("FOLD_KERNELS_CACHE", str(cache))
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "1")  # conftest turns it off on GPUs
    monkeypatch.setattr(tuning, "_MEMORY", {})
    monkeypatch.setattr(tuning, "_PICKED", {})
    monkeypatch.setattr(tuning, "_DISK_LOADED", False)
    monkeypatch.setattr(tuning, "arch", lambda device=None: "sm90")
    cands = [tuning.Config(64, 64), tuning.Config(32, 32), tuning.Config(128, 64)]
    fake_ms = {cands[0]: 3.0, cands[1]: 1.0, cands[2]: 2.0}
    calls = []

    def fake_bench(fn, **kwargs):
        fn()
        return fake_ms[calls[-1]]

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    best = tuning.pick("k", (1, 2), cands, calls.append)
    assert best == cands[1] and len(calls) == 3
    assert json.loads(cache.read_text())  # written (atomically, via a temporary file)
    assert not list(tmp_path.glob(".tuning.*"))  # no temporary file left behind
    again = tuning.pick("k", (1, 2), cands, calls.append)
    assert again == cands[1] and len(calls) == 3  # from memory: no new timing
    monkeypatch.setattr(tuning, "_MEMORY", {})
    monkeypatch.setattr(tuning, "_PICKED", {})  # a new process: only the disk cache is left
    monkeypatch.setattr(tuning, "_DISK_LOADED", False)
    assert tuning.pick("k", (1, 2), cands, calls.append) == cands[1] and len(calls) == 3


def test_autotune_off_takes_the_default(monkeypatch):
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "0")
    cands = [tuning.Config(64, 64), tuning.Config(32, 32)]
    assert tuning.pick("k", (0,), cands, lambda cfg: None) == cands[0]


def test_env_var_cache_sees_monkeypatch(monkeypatch):
    """The per-call env reads are cached, but a changed value takes effect at once."""
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "0")
    assert not tuning._AUTOTUNE.get()
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "1")
    assert tuning._AUTOTUNE.get()
    monkeypatch.delenv("FOLD_KERNELS_AUTOTUNE")
    assert tuning._AUTOTUNE.get()  # unset: autotuning on (the default)
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "0")
    assert not tuning._AUTOTUNE.get()


def test_no_timing_while_a_cuda_graph_is_captured(tmp_path, monkeypatch):
    """Timing synchronizes, which would invalidate a capture far from the cause: during a
    capture an untuned key takes the default configuration and is not cached."""
    monkeypatch.setenv("FOLD_KERNELS_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "1")
    monkeypatch.setattr(tuning, "_MEMORY", {})
    monkeypatch.setattr(tuning, "_PICKED", {})
    monkeypatch.setattr(tuning, "_DISK_LOADED", False)
    monkeypatch.setattr(tuning, "arch", lambda device=None: "sm90")
    monkeypatch.setattr(tuning, "_capturing", lambda: True)
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("timed"))
    cands = [tuning.Config(64, 64), tuning.Config(32, 32)]
    assert tuning.pick("k", (7,), cands, lambda cfg: pytest.fail("launched")) == cands[0]
    assert tuning._MEMORY == {} and tuning._PICKED == {}


def test_buckets():
    assert [tuning.bucket(n) for n in (1, 17, 64, 65, 96, 97, 128, 129, 300, 384, 385, 768)] == \
        [1, 17, 64, 96, 96, 128, 128, 192, 384, 384, 512, 768]
    assert tuning.bucket_key((300, True, "bf16", 1)) == (384, True, "bf16", 1)


def _fresh_tuner(monkeypatch, cache):
    monkeypatch.setenv("FOLD_KERNELS_CACHE", str(cache))
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "1")
    monkeypatch.setattr(tuning, "_MEMORY", {})
    monkeypatch.setattr(tuning, "_PICKED", {})
    monkeypatch.setattr(tuning, "_DISK_LOADED", False)
    monkeypatch.setattr(tuning, "arch", lambda device=None: "sm90")


def test_sizes_of_one_bucket_share_a_search(tmp_path, monkeypatch):
    _fresh_tuner(monkeypatch, tmp_path / "tuning.json")
    cands = [tuning.Config(64, 64), tuning.Config(32, 32)]
    calls = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, **kw: (fn(), {cands[0]: 2.0, cands[1]: 1.0}[calls[-1]])[1])
    assert tuning.pick("k", (300, 128), cands, calls.append) == cands[1]
    assert len(calls) == 2
    assert tuning.pick("k", (320, 128), cands, calls.append) == cands[1]  # bucket 384 too
    assert len(calls) == 2
    tuning.pick("k", (400, 128), cands, calls.append)  # bucket 512: a new search
    assert len(calls) == 4


def test_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, monkeypatch):
    cache = tmp_path / "tuning.json"
    cache.write_text('{"k|sm90|1": {"block_m": 64, "blo')  # cut short by a crash
    _fresh_tuner(monkeypatch, cache)
    cands = [tuning.Config(64, 64), tuning.Config(32, 32)]
    calls = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, **kw: (fn(), {cands[0]: 2.0, cands[1]: 1.0}[calls[-1]])[1])
    with pytest.warns(RuntimeWarning, match="unreadable autotune cache .*tuning.json"):
        assert tuning.pick("k", (1,), cands, calls.append) == cands[1]
    assert len(calls) == 2  # tuned again
    data = json.loads(cache.read_text())  # rewritten whole and valid
    assert data == {"k|sm90|1": {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 2,
                                 "block_k": 32, "rows": 1, "transpose": False,
                                 "acc_tile": False}}
    for bad in ("[1, 2]", '{"k|sm90|1": {"no_such_field": 1}}'):
        cache.write_text(bad)
        _fresh_tuner(monkeypatch, cache)
        with pytest.warns(RuntimeWarning, match="unreadable autotune cache"):
            tuning.pick("k", (1,), cands, calls.append)
