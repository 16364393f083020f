"""Collectives for DAP and BP as autograd functions (FastFold section 4.2).

Each collective has a raw form (:class:`Collectives`, returning a :class:`Pending` result so a
caller may overlap it, see :mod:`fold_parallel.dao`) and an autograd form whose backward is the
dual collective:

========================  ==========================  ===============================
forward                   backward                    used for
========================  ==========================  ===============================
``all_gather(x, d)``      ``reduce_scatter(g, d)``    pair bias, OPM / triangle operand
``reduce_scatter(x, d)``  ``all_gather(g, d)``        row-layout outer product mean
``all_to_all(x, s, c)``   ``all_to_all(g, c, s)``     ``row_to_col`` / ``col_to_row``
``all_reduce(x)``         ``all_reduce(g)``           the BP join of the pair branches
``broadcast(x, src)``     ``all_reduce(g)`` to src    the BP MSA output at the stack end
========================  ==========================  ===============================

``scatter(x, d)`` is a plain slice (no communication); autograd gives it the zero-padded grad.

Gradient convention (why the backward of a gather *sums*): every rank of a DAP / BP group runs
the whole loss on its copy of the replicated parts of the model. Then, for every leaf (parameters
and replicated inputs), the sum of the per-rank gradients is ``P`` times the single-device
gradient, and averaging gradients over the group (exactly what data parallelism does) recovers it.
Hybrid DP x BP x DAP is therefore one gradient average over all ranks (:mod:`fold_parallel.ddp`).

Backends: ``"native"`` uses ``all_to_all_single`` / ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` (NCCL). ``"fallback"`` uses only what every gloo build has: the
all-to-all is point-to-point ``isend``/``irecv`` (same volume as a native all-to-all), the
all-gather is the list form, the reduce-scatter is an all-reduce followed by a slice.
``comm_dtype=torch.bfloat16`` sends floating tensors (and their gradients) in bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from fold_parallel.guard import CollectiveError, guarded

__all__ = [
    "Impl",
    "Pending",
    "Collectives",
    "scatter",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_reduce",
    "broadcast",
]

Impl = Literal["auto", "native", "fallback"]

# Active communication-volume recorders (fold_parallel.volume.CommRecorder).
_RECORDERS: list = []

# p2p tags cycle through this range; ranks issue collectives in the same order, so equal tags
# pair the right messages even when an async all-to-all is still in flight.
_TAG_CYCLE = 1 << 20


class Pending:
    """A collective in flight: ``wait()`` finishes it and returns the result tensor.

    A synchronous collective is issued with ``async_op=False`` (on NCCL it then runs on the
    current stream: no side stream, no cross-stream events, no tensor stashing) and comes here
    with no work to wait for; only DAO's overlapped collectives carry a work handle.
    """

    def __init__(
        self,
        works: list,
        finish: Callable[[], torch.Tensor],
        what: Callable[[], str],
        timeout_s: float | None,
    ) -> None:
        self._works = works
        self._finish: Callable[[], torch.Tensor] | None = finish
        self._what = what
        self._timeout_s = timeout_s
        self._result: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        if self._finish is not None:
            if self._works:
                with guarded(self._what, self._timeout_s):
                    for work in self._works:
                        work.wait()
            self._result = self._finish()
            # Drop the work handles and the buffers the closure holds (send / receive buffers).
            self._works, self._finish = [], None
        return self._result


def _norm_dim(dim: int, ndim: int) -> int:
    """A negative dim index (the layouts are defined from the end)."""
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim {dim} out of range for a {ndim}-d tensor")
    return dim - ndim if dim >= 0 else dim


class Collectives:
    """Raw collectives over one process group (``group=None``: the default group).

    ``impl="auto"`` picks ``"native"`` on NCCL and ``"fallback"`` on gloo. ``timeout_s`` is
    what the error message of a failed collective quotes (the process group's own timeout is
    what bounds the wait; :func:`fold_parallel.groups.init_distributed` sets it).

    Every method takes ``async_op``: ``False`` (the default) completes the collective before
    returning (on NCCL: enqueued on the current stream, no host synchronisation); ``True``
    returns while it is in flight (DAO, :mod:`fold_parallel.dao`).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        impl: Impl = "auto",
        comm_dtype: torch.dtype | None = None,
        timeout_s: float | None = None,
        name: str = "group",
    ) -> None:
        if impl not in ("auto", "native", "fallback"):
            raise ValueError(f"impl must be 'auto', 'native' or 'fallback', got {impl!r}")
        if comm_dtype is not None and not comm_dtype.is_floating_point:
            raise ValueError(f"comm_dtype must be a floating dtype, got {comm_dtype}")
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if impl == "auto":
            # "nccl", or a per-device backend string such as "cpu:gloo,cuda:nccl".
            impl = "native" if "nccl" in str(dist.get_backend(group)) else "fallback"
        self.impl = impl
        self.comm_dtype = comm_dtype
        self.timeout_s = timeout_s
        self.name = name
        self._tag = 0
        self._global_ranks = [self._global_rank(r) for r in range(self.size)]

    def _global_rank(self, r: int) -> int:
        if self.group is None or self.group == dist.group.WORLD:
            return r
        return dist.get_global_rank(self.group, r)

    # --- dtype of the wire -------------------------------------------------------------------
    def _to_wire(self, x: torch.Tensor) -> torch.Tensor:
        if self.comm_dtype is not None and x.is_floating_point() and x.dtype != self.comm_dtype:
            x = x.to(self.comm_dtype)
        return x.contiguous()

    def _private_copy(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` on the wire, in a buffer of its own (in-place collectives must not write into
        a tensor autograd may have saved); one copy at most."""
        buf = self._to_wire(x)
        return buf.clone() if buf is x else buf

    def _what(self, op: str, x: torch.Tensor) -> Callable[[], str]:
        """The error-message text, formatted only if the collective fails (it runs on every
        collective; string formatting there is pure per-call host overhead)."""
        shape, dtype = x.shape, x.dtype
        return lambda: (
            f"{op} of a {tuple(shape)} {dtype} tensor over the {self.name} "
            f"(rank {self.rank} of {self.size}, global ranks {self._global_ranks})"
        )

    def _note(self, op: str, x: torch.Tensor) -> None:
        """Tell the active recorders about a collective on ``x`` (this rank's input)."""
        if not _RECORDERS:
            return
        dtype = x.dtype
        if self.comm_dtype is not None and x.is_floating_point():
            dtype = self.comm_dtype
        for rec in _RECORDERS:
            rec.note(op, self.name, self.size, tuple(x.shape), dtype, self.impl)

    def _pending(
        self, work, finish: Callable[[], torch.Tensor], what: Callable[[], str], async_op: bool
    ) -> Pending:
        works = work if isinstance(work, list) else ([] if work is None else [work])
        pending = Pending(works, finish, what, self.timeout_s)
        if not async_op:
            pending.wait()
        return pending

    def _check_divisible(self, x: torch.Tensor, dim: int, op: str) -> None:
        if x.shape[dim] % self.size != 0:
            raise CollectiveError(
                f"{op}: dim {dim} of the {tuple(x.shape)} tensor is not divisible by the "
                f"{self.name} size {self.size} (pad with fold_parallel.dap.pad_to_multiple)"
            )

    # --- collectives -------------------------------------------------------------------------
    def all_gather(self, x: torch.Tensor, dim: int, async_op: bool = False) -> Pending:
        """Shards ``[.., n, ..]`` -> ``[.., P * n, ..]`` (rank order) along ``dim``."""
        dim = _norm_dim(dim, x.dim())
        out_dtype, p = x.dtype, self.size
        send = self._to_wire(x)
        self._note("all_gather", send)
        what = self._what("all_gather", x)
        with guarded(what, self.timeout_s):
            if self.impl == "native":
                buf = send.new_empty((p * send.shape[0], *send.shape[1:]))
                work = dist.all_gather_into_tensor(buf, send, self.group, async_op=async_op)

                def finish() -> torch.Tensor:
                    parts = buf.unflatten(0, (p, send.shape[0]))  # [P, *x.shape]
                    return parts.movedim(0, dim - 1).flatten(dim - 1, dim).to(out_dtype)
            else:
                bufs = [torch.empty_like(send) for _ in range(p)]
                work = dist.all_gather(bufs, send, self.group, async_op=async_op)

                def finish() -> torch.Tensor:
                    return torch.cat(bufs, dim=dim).to(out_dtype)

        return self._pending(work, finish, what, async_op)

    def reduce_scatter(self, x: torch.Tensor, dim: int, async_op: bool = False) -> Pending:
        """Partial whole tensors ``[.., N, ..]`` -> this rank's slice ``[.., N / P, ..]`` of
        their sum along ``dim``."""
        dim = _norm_dim(dim, x.dim())
        self._check_divisible(x, dim, "reduce_scatter")
        out_dtype, p, r = x.dtype, self.size, self.rank
        n = x.shape[dim] // p
        self._note("reduce_scatter", x)
        what = self._what("reduce_scatter", x)
        with guarded(what, self.timeout_s):
            if self.impl == "native":
                # [.., P * n, ..] -> [P, .., n, ..]: rank j's slice first-dim contiguous (a view,
                # no copy, when dim is the first dim of size > 1, e.g. the pair's i).
                send = self._to_wire(x.unflatten(dim, (p, n)).movedim(dim - 1, 0))
                out = send.new_empty(send.shape[1:])
                work = dist.reduce_scatter_tensor(
                    out.view(-1), send.view(-1), group=self.group, async_op=async_op
                )

                def finish() -> torch.Tensor:
                    return out.to(out_dtype)
            else:
                buf = self._private_copy(x)
                work = dist.all_reduce(buf, group=self.group, async_op=async_op)

                def finish() -> torch.Tensor:
                    return buf.narrow(dim, r * n, n).contiguous().to(out_dtype)

        return self._pending(work, finish, what, async_op)

    def all_to_all(
        self, x: torch.Tensor, split_dim: int, cat_dim: int, async_op: bool = False
    ) -> Pending:
        """Split ``split_dim`` into P chunks, send chunk j to rank j, concatenate the received
        chunks along ``cat_dim`` in rank order. ``row_to_col`` is ``(split=-2, cat=-3)``."""
        split_dim = _norm_dim(split_dim, x.dim())
        cat_dim = _norm_dim(cat_dim, x.dim())
        self._check_divisible(x, split_dim, "all_to_all")
        out_dtype, p = x.dtype, self.size
        n = x.shape[split_dim] // p
        # [.., P * n, ..] -> [P, .., n, ..]: the chunk for rank j is send[j].
        send = self._to_wire(x.unflatten(split_dim, (p, n)).movedim(split_dim - 1, 0))
        recv = torch.empty_like(send)
        self._note("all_to_all", send)
        what = self._what("all_to_all", x)
        with guarded(what, self.timeout_s):
            if self.impl == "native":
                work = dist.all_to_all_single(recv, send, group=self.group, async_op=async_op)
            else:
                work = self._p2p_all_to_all(send, recv)

        def finish() -> torch.Tensor:
            # recv[i] came from rank i: [P, .., c, ..] -> [.., P * c, ..] along cat_dim.
            return recv.movedim(0, cat_dim - 1).flatten(cat_dim - 1, cat_dim).to(out_dtype)

        return self._pending(work, finish, what, async_op)

    def _p2p_all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> list:
        """All-to-all from isend/irecv pairs (gloo on CPU has no all-to-all in every build)."""
        tag = self._tag
        self._tag = (self._tag + 1) % _TAG_CYCLE
        recv[self.rank].copy_(send[self.rank])
        works = []
        for j in range(self.size):
            if j == self.rank:
                continue
            peer = self._global_ranks[j]
            works.append(dist.irecv(recv[j], src=peer, group=self.group, tag=tag))
            works.append(dist.isend(send[j], dst=peer, group=self.group, tag=tag))
        return works

    def all_reduce(self, x: torch.Tensor, async_op: bool = False, inplace: bool = False) -> Pending:
        """Sum over the group. ``inplace``: the caller owns ``x`` (e.g. a fresh gradient bucket),
        so it is reduced in place when it is already on the wire (no copy)."""
        out_dtype = x.dtype
        buf = self._to_wire(x) if inplace else self._private_copy(x)
        self._note("all_reduce", buf)
        what = self._what("all_reduce", x)
        with guarded(what, self.timeout_s):
            work = dist.all_reduce(buf, group=self.group, async_op=async_op)
        return self._pending(work, lambda: buf.to(out_dtype), what, async_op)

    def broadcast(self, x: torch.Tensor, src: int, async_op: bool = False) -> Pending:
        """``x`` of group rank ``src`` on every rank (same shape everywhere)."""
        out_dtype = x.dtype
        buf = self._private_copy(x)
        self._note("broadcast", buf)
        what = self._what(f"broadcast from group rank {src}", x)
        with guarded(what, self.timeout_s):
            work = dist.broadcast(
                buf, self._global_ranks[src], group=self.group, async_op=async_op
            )
        return self._pending(work, lambda: buf.to(out_dtype), what, async_op)


# --- autograd functions ------------------------------------------------------------------------


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, coll: Collectives) -> torch.Tensor:
        ctx.dim, ctx.coll = dim, coll
        return coll.all_gather(x, dim).wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.coll.reduce_scatter(grad, ctx.dim).wait(), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, coll: Collectives) -> torch.Tensor:
        ctx.dim, ctx.coll = dim, coll
        return coll.reduce_scatter(x, dim).wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.coll.all_gather(grad, ctx.dim).wait(), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: torch.Tensor, split_dim: int, cat_dim: int, coll: Collectives
    ) -> torch.Tensor:
        ctx.dims, ctx.coll = (split_dim, cat_dim), coll
        return coll.all_to_all(x, split_dim, cat_dim).wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        split_dim, cat_dim = ctx.dims
        return ctx.coll.all_to_all(grad, cat_dim, split_dim).wait(), None, None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, coll: Collectives) -> torch.Tensor:
        ctx.coll = coll
        return coll.all_reduce(x).wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.coll.all_reduce(grad).wait(), None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, src: int, coll: Collectives) -> torch.Tensor:
        ctx.src, ctx.coll = src, coll
        return coll.broadcast(x, src).wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = ctx.coll.all_reduce(grad).wait()
        # Only the source's input reached the output.
        return (total if ctx.coll.rank == ctx.src else torch.zeros_like(grad)), None, None


def scatter(x: torch.Tensor, dim: int, coll: Collectives) -> torch.Tensor:
    """This rank's slice ``[.., N / P, ..]`` of a replicated ``[.., N, ..]`` (no communication)."""
    dim = _norm_dim(dim, x.dim())
    coll._check_divisible(x, dim, "scatter")
    n = x.shape[dim] // coll.size
    return x.narrow(dim, coll.rank * n, n)


def all_gather(x: torch.Tensor, dim: int, coll: Collectives) -> torch.Tensor:
    """All-gather along ``dim``; backward reduce-scatters the gradient."""
    return _AllGather.apply(x, dim, coll)


def reduce_scatter(x: torch.Tensor, dim: int, coll: Collectives) -> torch.Tensor:
    """Reduce-scatter along ``dim``; backward all-gathers the gradient."""
    return _ReduceScatter.apply(x, dim, coll)


def all_to_all(x: torch.Tensor, split_dim: int, cat_dim: int, coll: Collectives) -> torch.Tensor:
    """All-to-all; backward is the inverse all-to-all (``cat_dim`` <-> ``split_dim``)."""
    return _AllToAll.apply(x, split_dim, cat_dim, coll)


def all_reduce(x: torch.Tensor, coll: Collectives) -> torch.Tensor:
    """Sum over the group; backward sums the gradients too."""
    return _AllReduce.apply(x, coll)


def broadcast(x: torch.Tensor, src: int, coll: Collectives) -> torch.Tensor:
    """``x`` of group rank ``src`` everywhere; backward sums the gradients onto ``src``."""
    return _Broadcast.apply(x, src, coll)
