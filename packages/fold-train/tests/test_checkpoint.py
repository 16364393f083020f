"""Checkpoints: round trip, corruption, refusal of pickled objects, atomic replacement."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from fold_train.checkpoint import (
    MAGIC,
    CheckpointError,
    checkpoint_path,
    find_latest,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(7, generator=g).bfloat16()},
        "step": 12,
        "lr": 1e-3,
        "name": "tiny",
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.default_rng(3).bit_generator
                .state, "python": list(__import__("random").getstate()[1][:5])},
        "history": [1.5, 2.5, None, True],
        "pair": (1, "a"),
    }


def test_round_trip(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "a" / "x.ckpt", state)
    back = load_checkpoint(path)
    assert back["step"] == 12 and back["name"] == "tiny" and back["history"] == state["history"]
    assert back["lr"] == 1e-3 and tuple(back["pair"]) == (1, "a")
    for k in ("w", "b"):
        assert back["model"][k].dtype == state["model"][k].dtype
        assert torch.equal(back["model"][k], state["model"][k])
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    assert back["rng"]["numpy"] == state["rng"]["numpy"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temp left


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "empty"])
def test_corrupt_checkpoint_is_refused_with_the_file_named(tmp_path, damage):
    path = save_checkpoint(tmp_path / "x.ckpt", _state())
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "header":
        data[:4] = b"XXXX"
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(path.name)) as info:
        load_checkpoint(path)
    assert info.value.path == str(path)
    if damage in ("flip", "truncate"):
        assert "sha256" in str(info.value)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_pickled_object_is_never_unpickled(tmp_path):
    """A payload with a valid checksum but an arbitrary object in it is refused by the
    weights-only unpickler (the checksum only proves integrity, not safety)."""
    import hashlib

    buf = io.BytesIO()
    torch.save({"x": _Evil()}, buf)
    payload = buf.getvalue()
    path = tmp_path / "evil.ckpt"
    path.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        load_checkpoint(path)


def test_unstorable_state_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match="state.extra.obj"):
        save_checkpoint(tmp_path / "x.ckpt", {"extra": {"obj": object()}})
    with pytest.raises(TypeError, match="keys must be str"):
        save_checkpoint(tmp_path / "x.ckpt", {"extra": {1: 2}})
    assert not list(tmp_path.iterdir())


def test_overwrite_is_atomic_and_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "x.ckpt", {"v": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"v": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["v"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["x.ckpt"]


def test_latest_and_prune(tmp_path):
    assert find_latest(tmp_path) is None
    for step in (5, 100, 20):
        save_checkpoint(checkpoint_path(tmp_path, step), {"step": step})
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert find_latest(tmp_path) == checkpoint_path(tmp_path, 100)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert removed == [checkpoint_path(tmp_path, 5)]
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == [
        "step_00000020.ckpt", "step_00000100.ckpt"]
