"""The chunk loop that generated code calls: slice inputs, run the body, fill the outputs."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.fx as fx
import torch.nn as nn

__all__ = ["ChunkLoop", "first_and_last_chunk_only"]

_FIRST_AND_LAST = contextvars.ContextVar("fold_chunk_first_and_last", default=False)


@contextlib.contextmanager
def first_and_last_chunk_only() -> Iterator[None]:
    """Run only the first two and the last chunk of every loop (memory estimation on
    FakeTensors: from the second chunk on, every chunk needs the same memory)."""
    token = _FIRST_AND_LAST.set(True)
    try:
        yield
    finally:
        _FIRST_AND_LAST.reset(token)


class ChunkLoop(nn.Module):
    """``forward(*inputs) -> tuple of outputs``: for each chunk ``[start, start + n)`` of
    ``extent``, input ``k`` is ``inputs[k].narrow(in_dims[k], start, n)`` (whole when its dim is
    None), ``body(n, *sliced)`` returns the chunk of every output, which is copied into a whole
    output buffer allocated on the first chunk (shape of the chunk with ``out_dims[j]`` set to
    ``extent``)."""

    def __init__(self, body: fx.GraphModule, in_dims: list[int | None], out_dims: list[int],
                 extent: int, chunk_size: int) -> None:
        super().__init__()
        self.body = body
        self.in_dims = list(in_dims)
        self.out_dims = list(out_dims)
        self.extent = extent
        self.chunk_size = chunk_size

    def extra_repr(self) -> str:
        return (f"extent={self.extent}, chunk_size={self.chunk_size}, in_dims={self.in_dims}, "
                f"out_dims={self.out_dims}")

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        starts = list(range(0, self.extent, self.chunk_size))
        if _FIRST_AND_LAST.get() and len(starts) > 3:
            # the first chunk runs before the output buffers exist; the second shows the peak
            starts = [starts[0], starts[1], starts[-1]]
        outs: list[torch.Tensor] = []
        for start in starts:
            n = min(self.chunk_size, self.extent - start)
            sliced = [x if d is None else x.narrow(d, start, n)
                      for x, d in zip(inputs, self.in_dims)]
            chunk = self.body(n, *sliced)
            del sliced
            self._store(outs, chunk, start, n)
            del chunk  # free this chunk's outputs before the next chunk is computed
        return tuple(outs)

    def _store(self, outs: list[torch.Tensor], chunk: tuple[torch.Tensor, ...], start: int,
               n: int) -> None:
        """Copy one chunk of each output into its whole buffer (allocated on the first call).
        A method of its own so that no loop variable keeps a chunk alive."""
        if not outs:
            for c, d in zip(chunk, self.out_dims):
                shape = list(c.shape)
                shape[d] = self.extent  # [..., extent (was n), ...]
                outs.append(c.new_empty(shape))
        for o, c, d in zip(outs, chunk, self.out_dims):
            o.narrow(d, start, n).copy_(c)
