"""Capture a benchmark step (forward, or forward + backward) into a CUDA graph and replay it.

Used by ``--graphs`` in model/evoformer.py, model/af3_blocks.py, model/peers.py and
tools/profile_block.py: a replay launches the step's kernels without the Python/launch overhead, so
a table can show what the kernels themselves cost, for the ``torch`` and the ``auto`` (Triton)
backend alike. As in fold-train's CUDA-graph training step (``fold_train/cuda_graphs.py``): warm-up
on a side stream (autotuning, lazy initialisation, cuBLAS workspaces happen there), then one
capture; inputs are the benchmark's fixed tensors (static addresses) and gradients are the graph's
outputs (``torch.autograd.grad``, static buffers of the graph's pool) instead of ``.grad`` fields
that the eager step sets to None between calls. Dropout draws fresh masks on every replay (PyTorch's
Philox generator is graph-safe).

On CPU there is no graph: :func:`capture` returns the same body, run eagerly (smoke tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from benchmarks.common.kernel_time import kernel_counts


def grad_body(loss_fn: Callable[[], torch.Tensor],
              tensors: Sequence[torch.Tensor]) -> Callable[[], tuple]:
    """A step whose outputs are ``d loss / d tensors`` (no ``.grad`` accumulation)."""
    tensors = [t for t in tensors if t.requires_grad]

    def body():
        return torch.autograd.grad(loss_fn(), tensors, allow_unused=True)
    return body


def capture_calls(fn: Callable[[], object], calls: int, device: torch.device
                  ) -> Callable[[], None]:
    """The replay of ``calls`` back-to-back calls of ``fn`` captured in one graph (per-call
    kernel time is the replay's over ``calls``, without the graph's own launch); on CPU, the
    calls themselves."""
    def body() -> None:
        for _ in range(calls):
            fn()
    return capture(body, device)[0]


def capture(body: Callable[[], object], device: torch.device,
            warmup: int = 3) -> tuple[Callable[[], None], object]:
    """``(replay, outputs)``: ``replay()`` re-runs ``body``'s kernels, refreshing ``outputs``."""
    if device.type != "cuda":
        out = body()
        return body, out
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = body()
    except RuntimeError as e:
        raise RuntimeError(
            f"CUDA graph capture of the benchmark step failed: {e}. Something in the step "
            "synchronizes with the host (.item(), nonzero, a host-to-device copy); "
            "fold_train.cuda_graphs.host_syncs(step) lists such ops") from e

    def replay() -> None:
        graph.replay()
    replay.graph = graph  # type: ignore[attr-defined]  (kept alive with the replay)
    return replay, out


def _tensors(outs) -> list[torch.Tensor]:
    if isinstance(outs, torch.Tensor):
        return [outs]
    if isinstance(outs, (tuple, list)):
        return [t for o in outs for t in _tensors(o)]
    return []


@contextlib.contextmanager
def restored(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """``tensors`` changed in place inside the block get their values on entry back on exit."""
    saved = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(tensors, saved):
                t.copy_(s)


@contextlib.contextmanager
def new_values(inputs: Sequence[torch.Tensor], seed: int) -> Iterator[None]:
    """The floating-point ``inputs`` hold seeded random values inside the block, their own
    after it."""
    gen = torch.Generator().manual_seed(seed)
    floats = [x for x in inputs if x.is_floating_point()]
    with restored(floats):
        with torch.no_grad():
            for x in floats:
                x.copy_(torch.randn(x.shape, generator=gen).to(x.device, x.dtype))
        yield


def replay_differences(body: Callable[[], object], inputs: Sequence[torch.Tensor],
                       device: torch.device, capture_fn=None, seed: int = 2,
                       repeats: int = 2) -> tuple[list[float], list[float]] | None:
    """Whether a CUDA graph of ``body`` holds all of its work: ``(differences, spreads)``, for
    each output the relative difference (max |replay - eager| / max |eager|; NaN passes on as
    NaN) between a replay and an eager call after the floating-point ``inputs`` got new random
    values in place (they get their own back afterwards), and how far ``repeats`` further eager
    calls on the same inputs differ from that one. A kernel launched outside the capturing
    stream, on the legacy default stream say, runs once while the graph is captured and is not
    in it: the replay then keeps that kernel's capture-time results where the eager call's
    follow the new inputs, and the replay's time leaves its cost out. ``body`` must draw
    nothing at random (no dropout: a module in eval mode). One whose kernels sum in an order
    that varies between calls (atomic adds) differs from its replay by its rounding, as its
    eager calls differ among themselves (the spread; zero for a deterministic body); an output
    whose exact value is zero (a bias's gradient that a softmax's shift invariance cancels) is
    all rounding, so its relative spread is O(1). None on CPU (no graphs), unless
    ``capture_fn`` stands in for :func:`capture`."""
    if capture_fn is None:
        if device.type != "cuda":
            return None
        capture_fn = capture
    replay, static = capture_fn(body, device)
    with new_values(inputs, seed):
        replay()
        got = [t.detach().float().clone() for t in _tensors(static)]
        want = [t.detach().float().clone() for t in _tensors(body())]
        spreads = [0.0] * len(want)
        for _ in range(repeats):
            again = _differences([t.detach().float() for t in _tensors(body())], want)
            spreads = [largest((a, b)) for a, b in zip(spreads, again)]
    if len(got) != len(want) or not want:
        raise ValueError(f"replay_differences: the replay gave {len(got)} tensors, the eager "
                         f"call {len(want)}")
    return _differences(got, want), spreads


def largest(values: Sequence[float]) -> float:
    """The largest of ``values`` (0.0 for none), inf where one is NaN (a NaN never passes)."""
    worst = 0.0
    for v in values:
        if not v <= worst:  # larger, or NaN
            worst = v if v == v else float("inf")
    return worst


def _differences(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> list[float]:
    """max |got - want| / max |want| for each pair of tensors (0.0 for an empty one)."""
    return [float((g - w).abs().max()) / max(float(w.abs().max()), 1e-30) if w.numel() else 0.0
            for g, w in zip(got, want)]


def replay_census(body: Callable[[], object], device: torch.device, capture_fn=None,
                  counts_fn=None) -> dict[str, int] | None:
    """The kernels an eager call of ``body`` runs more often than a replay of its graph does,
    ``{name: how many more}`` (empty: the graph holds every launch). A direct census: a kernel
    launched outside the capturing stream is missing from the replay whatever its results
    (a comparison of outputs can miss it: with its zero-initialised output layers, Protenix's
    Pairformer forward replay matched its eager forward without the six LayerNorm forward
    launches, H200, 2026-12-01). A graph may run more than the eager call (its own fills),
    never fewer. None on CPU, unless
    ``capture_fn`` and ``counts_fn`` (``fn -> Counter``) stand in for :func:`capture` and
    :func:`benchmarks.common.kernel_time.kernel_counts`."""
    if capture_fn is None:
        if device.type != "cuda":
            return None
        capture_fn = capture
    if counts_fn is None:
        def counts_fn(fn):
            return kernel_counts(fn, device)
    replay, _ = capture_fn(body, device)
    eager, replayed = counts_fn(body), counts_fn(replay)
    return {name: n - replayed.get(name, 0) for name, n in sorted(eager.items())
            if n > replayed.get(name, 0)}
