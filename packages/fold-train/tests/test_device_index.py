"""``--device cuda`` names the current CUDA device by its index: torch.cuda.set_device and
mem_get_info refuse a device without one ("Expected a torch.device with a specified index"),
which broke ``fold-train train --device cuda``. Checked on CPU with torch.cuda's calls
recorded."""

from __future__ import annotations

import torch
from fold_train import autochunk, distributed


def test_cuda_without_index_becomes_the_current_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set", d)))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = distributed.setup("cuda")
    assert ctx.device == torch.device("cuda", 3) and calls == [("set", torch.device("cuda", 3))]
    assert distributed.setup("cuda:1").device == torch.device("cuda", 1)


def test_available_memory_passes_an_index(monkeypatch):
    seen = []

    def mem_get_info(device=None):
        seen.append(device)
        if isinstance(device, torch.device):
            raise ValueError("Expected a torch.device with a specified index or an integer")
        return 123, 456

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 600)
    # the driver's free memory and the allocator's cached, unused blocks
    assert autochunk.available_memory("cuda") == 123 + 400
    assert autochunk.available_memory("cuda:2") == 123 + 400
    assert seen == [None, 2]
