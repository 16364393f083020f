"""NonBlockingLoader: completeness, ready-first vs strict order, errors, dead workers, prefetch."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from fold_data.loader import LoaderError, NonBlockingLoader


# Module-level so the spawned workers can unpickle them.
def square_sample(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {"index": np.int64(i), "x": rng.normal(size=(3, 5)).astype(np.float32)}


def sleepy(item: tuple[int, float]) -> int:
    index, delay = item
    time.sleep(delay)
    return index


def fails_on_three(i: int) -> int:
    if i == 3:
        raise ValueError("bad residue 17 in chain B")
    return i


def dies_on_two(i: int) -> int:
    if i == 2:
        os._exit(7)  # a hard crash: no exception, no cleanup
    time.sleep(0.02)
    return i


def marks_start(item: tuple[str, int]) -> int:
    directory, i = item
    Path(directory, f"started_{i}").touch()
    return i


def with_seed(i: int, seed: int) -> tuple[int, int]:
    return i, seed


def test_every_sample_once_per_epoch_with_shuffle():
    with NonBlockingLoader(11, square_sample, workers=2, prefetch=3, shuffle=True, seed=5) as ld:
        epochs = [[int(s["index"]) for s in ld] for _ in range(2)]
    for got in epochs:
        assert sorted(got) == list(range(11))
    assert epochs[0] != epochs[1]  # a new permutation per epoch (fixed seed: deterministic)
    # The payload arrives intact.
    with NonBlockingLoader([4], square_sample, workers=1) as ld:
        (s,) = list(ld)
    np.testing.assert_array_equal(s["x"], square_sample(4)["x"])


def test_ready_first_vs_strict_order():
    # Sample 0 is 10x slower than the rest: best effort yields the others while it is prepared.
    delays = [0.6] + [0.06] * 5
    items = list(enumerate(delays))
    with NonBlockingLoader(items, sleepy, workers=2, prefetch=4) as ld:
        best = list(ld)
        assert ld.stats.out_of_order > 0
        assert sorted(best) == list(range(6))
        assert best[0] != 0 and best.index(0) >= 3
        ld.strict_order, before = True, ld.stats.out_of_order  # same workers, next epoch
        assert list(ld) == list(range(6))
        assert ld.stats.out_of_order == before


def test_prepare_fn_exception_names_the_sample():
    names = [f"chain_{i}" for i in range(6)]
    with NonBlockingLoader(6, fails_on_three, workers=2, names=names, strict_order=True) as ld:
        with pytest.raises(LoaderError, match="chain_3") as err:
            list(ld)
        assert err.value.index == 3 and err.value.name == "chain_3"
        assert "bad residue 17 in chain B" in str(err.value)
        assert "Traceback" in err.value.worker_traceback
        # The workers survive a failed sample: the next epoch runs (and fails at the same place).
        seen = []
        with pytest.raises(LoaderError):
            for i in ld:
                seen.append(i)
        assert seen == [0, 1, 2]


def test_dead_worker_raises_quickly():
    t0 = time.monotonic()
    ld = NonBlockingLoader(8, dies_on_two, workers=2, prefetch=4, poll_interval=0.1)
    with pytest.raises(LoaderError, match=r"died with exit code 7.*index 2"):
        list(ld)
    assert time.monotonic() - t0 < 10
    assert all(not p.is_alive() for p in ld._procs)  # closed: no orphaned workers
    with pytest.raises(RuntimeError, match="closed"):
        iter(ld)


def test_prefetch_is_bounded(tmp_path):
    items = [(str(tmp_path), i) for i in range(20)]
    with NonBlockingLoader(items, marks_start, workers=2, prefetch=3) as ld:
        it = iter(ld)
        next(it)
        time.sleep(0.5)  # a slow training step: the workers must not run ahead
        assert len(list(tmp_path.glob("started_*"))) <= 3
        assert len(list(it)) == 19
    assert len(list(tmp_path.glob("started_*"))) == 20


def test_per_sample_seeds_do_not_depend_on_workers():
    def run(workers):
        with NonBlockingLoader(7, with_seed, workers=workers, pass_seed=True, seed=3) as ld:
            return dict(list(ld)), dict(list(ld))

    first, second = run(2)
    assert first == run(1)[0]
    assert len(set(first.values())) == 7 and first != second  # distinct per sample and epoch


def test_timeout_names_the_slow_sample():
    items = [(0, 0.01), (1, 0.8)]
    with NonBlockingLoader(items, sleepy, workers=2, timeout=0.3, poll_interval=0.05,
                           strict_order=True) as ld:
        with pytest.raises(LoaderError, match="index 1"):
            list(ld)


def test_bad_arguments():
    with pytest.raises(ValueError, match="names"):
        NonBlockingLoader(3, square_sample, names=["a"])
    with pytest.raises(ValueError, match="prefetch"):
        NonBlockingLoader(3, square_sample, prefetch=0)


def big_sample(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {
        "x": rng.normal(size=(33, 129, 7)).astype(np.float32),  # out of band (> 64 KiB)
        "f": np.asfortranarray(rng.normal(size=(65, 131))),  # Fortran order, out of band
        "small": rng.integers(0, 9, 5).astype(np.int32),  # in band
        "s": np.array([b"abc", b""], dtype="S3"),
    }


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_shared_memory_transport_round_trip_and_cleanup():
    with NonBlockingLoader(5, big_sample, workers=2, prefetch=4, shared_memory=True) as ld:
        prefix = ld._shm_prefix
        got = list(ld)
        it = iter(ld)  # an abandoned epoch: prepared samples must not leak
        next(it)
        time.sleep(0.3)
        del it
    assert len(got) == 5
    for s in got:
        i = next(i for i in range(5) if np.array_equal(s["small"], big_sample(i)["small"]))
        for k, v in big_sample(i).items():
            assert s[k].dtype == v.dtype and s[k].flags.f_contiguous == v.flags.f_contiguous
            np.testing.assert_array_equal(s[k], v)
    got[0]["x"][0, 0, 0] = 1.0  # writable (private copy-on-write mapping)
    assert not list(Path("/dev/shm").glob(Path(prefix).name + "-*"))


def test_garbage_collection_stops_the_workers():
    import gc

    ld = NonBlockingLoader(50, sleepy_index, workers=2, prefetch=4)
    it = iter(ld)
    next(it)
    procs = list(ld._procs)
    del it, ld
    gc.collect()
    deadline = time.monotonic() + 10
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.is_alive() for p in procs)


def sleepy_index(i: int) -> int:
    time.sleep(0.05)
    return i
