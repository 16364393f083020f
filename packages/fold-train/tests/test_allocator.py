"""``fold-train predict`` asks for expandable segments before CUDA starts, never over the
user's own allocator setting."""

from __future__ import annotations

import torch
from fold_train import allocator


def _clear(monkeypatch):
    for v in allocator.ENV_VARS:
        monkeypatch.delenv(v, raising=False)


def test_set_when_unset_and_cuda_not_started(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert allocator.prefer_expandable_segments()
    assert allocator.os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_the_users_setting_wins(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for v in allocator.ENV_VARS:
        _clear(monkeypatch)
        monkeypatch.setenv(v, "max_split_size_mb:128")
        assert not allocator.prefer_expandable_segments()
        assert allocator.os.environ[v] == "max_split_size_mb:128"
        other = [w for w in allocator.ENV_VARS if w != v]
        assert not any(allocator.os.environ.get(w) for w in other)


def test_too_late_once_cuda_started(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not allocator.prefer_expandable_segments()
    assert not any(allocator.os.environ.get(v) for v in allocator.ENV_VARS)
