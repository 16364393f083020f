"""CUDA Graphs for the training step, one captured graph per recycling count (ScaleFold 3.3).

AF2 trains on fixed padded shapes (crop ``N_res``, ``N_clust``, ``N_extra``, templates), so the
whole forward + loss + backward of a step launches the same kernels on the same addresses every
time, except for one thing: the number of recycling passes ``N_cycle``, drawn per step, changes
the launch sequence. :class:`GraphedStep` therefore keeps one captured graph per ``N_cycle``,
built the first time that count is drawn, and replays it afterwards; all graphs read one set of
static input buffers (the batch is copied into them before a replay) and share one memory pool.

Sharing the pool is safe because every replay's outputs are copied out before any other graph
runs: a graph's transient blocks may overlap another graph's output buffers, never a tensor that
is still needed. Parameters, their flat gradient buffer and the optimizer state live outside the
pool (allocated eagerly), so gradients accumulate at fixed addresses that the optimizer reads.

Dropout under capture: PyTorch's Philox CUDA generator is graph-safe: capture records the
generator's seed and an offset placeholder, and each replay advances the offset, so every replay
draws fresh masks. The default generator is registered automatically; other generators are
passed as ``generators`` and registered with the graph.

The optimizer update runs outside the graphs (its learning rate changes every step and the skip
of a non-finite step needs the host); with flat buffers it is a few launches.

The capture itself is behind :class:`CaptureBackend`: :class:`CudaGraphBackend` is the real one
(warm-up on a side stream, then ``torch.cuda.graph``); :class:`EagerCapture` runs the same body
eagerly, so tests and CPU smoke runs check the keying logic and the body without CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

__all__ = [
    "CaptureBackend",
    "CudaGraphBackend",
    "EagerCapture",
    "CudaGraphError",
    "GraphedStep",
    "host_syncs",
]

StepOutputs = dict[str, torch.Tensor]


class CudaGraphError(RuntimeError):
    """CUDA Graphs were requested but cannot be used here (no CUDA device, a step that cannot be
    captured, or a batch whose shapes differ from the captured ones)."""


class CaptureBackend(Protocol):
    """Captures ``fn`` (no arguments, returns a dict of tensors) and returns ``(replay,
    outputs)``: ``replay()`` re-runs the captured work, refreshing ``outputs`` in place.
    ``warmup_fn``, when given, runs eagerly first (lazy initializations); None: no warm-up."""

    def capture(self, fn: Callable[[], StepOutputs],
                warmup_fn: Callable[[], object] | None = None
                ) -> tuple[Callable[[], None], StepOutputs]:
        ...


class EagerCapture:
    """A :class:`CaptureBackend` without CUDA (CPU smoke tests and benchmarks): 'capturing' runs
    the warm-up and ``fn`` once, a replay runs ``fn`` again and writes its results into the
    captured outputs in place, as a graph replay refreshes its static outputs."""

    def capture(self, fn: Callable[[], StepOutputs],
                warmup_fn: Callable[[], object] | None = None
                ) -> tuple[Callable[[], None], StepOutputs]:
        if warmup_fn is not None:
            warmup_fn()
        outputs = fn()

        def replay() -> None:
            fresh = fn()
            with torch.no_grad():
                for k, v in fresh.items():
                    outputs[k].copy_(v)

        return replay, outputs


class CudaGraphBackend:
    """Capture with ``torch.cuda.CUDAGraph`` on ``device``: ``warmup`` eager runs of ``warmup_fn``
    on a side stream (autotuners, lazy initializations, cuBLAS workspaces and ``torch.compile``
    happen there, not during capture), then one capture into a memory pool shared by every graph
    of this backend.

    Raises :class:`CudaGraphError` when ``device`` is not a usable CUDA device.
    """

    def __init__(self, device: torch.device | str, *, warmup: int = 3,
                 generators: Sequence[torch.Generator] = ()) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise CudaGraphError(
                f"cuda_graphs=true needs a CUDA device, but the training device is {device}; "
                "CUDA Graphs capture GPU kernel launches and have no CPU equivalent (set "
                "cuda_graphs=false)")
        if not torch.cuda.is_available():
            raise CudaGraphError("cuda_graphs=true needs CUDA, but torch.cuda.is_available() is "
                                 f"False (torch {torch.__version__}); set cuda_graphs=false")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy initializations must not happen during "
                             f"capture), got {warmup}")
        self.device = device
        self.warmup = warmup
        self.generators = list(generators)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []  # kept alive: replays need them

    def capture(self, fn: Callable[[], StepOutputs],
                warmup_fn: Callable[[], object] | None = None
                ) -> tuple[Callable[[], None], StepOutputs]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup if warmup_fn is not None else 0):
                warmup_fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        # The warm-up ran eagerly: its freed activations stay cached in the default pool, and
        # the capture needs the same peak again in the graphs' private pool. Without this the
        # step needs about twice its memory (a no-checkpointing step ran out of memory here).
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:
            register = getattr(graph, "register_generator_state", None)
            if register is None:
                raise CudaGraphError(
                    f"torch {torch.__version__} cannot register extra generators with a CUDA "
                    "graph (CUDAGraph.register_generator_state); use the default generator")
            register(gen)
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = fn()
        except torch.cuda.OutOfMemoryError:
            raise  # the step does not fit: not a capture problem
        except RuntimeError as e:
            raise CudaGraphError(
                f"capturing the training step failed: {e}. A captured step must not synchronize "
                "with the host (.item(), nonzero, data-dependent shapes; see "
                "fold_train.cuda_graphs.host_syncs) nor read the CUDA RNG state (activation "
                "checkpointing with preserve_rng_state does on some PyTorch versions: try "
                "activation_checkpointing=false)") from e
        self.graphs.append(graph)
        return graph.replay, outputs

    def reset(self) -> None:
        """Drop every captured graph (their memory returns to PyTorch's caching allocator) and
        start a new pool."""
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle()


class GraphedStep:
    """A training step ``body(n_cycle) -> {name: tensor}`` replayed from captured graphs, one per
    ``n_cycle``, built lazily by ``backend``.

    ``body`` must read its batch from :attr:`static_inputs` (filled by :meth:`load`) and touch no
    tensor that is reallocated between steps. Usage per step::

        graphed.load(batch)            # copy into the static buffers ([B, R, ...] each)
        out = graphed(n_cycle)         # capture on first use of n_cycle, then replay
    """

    def __init__(self, body: Callable[[int], StepOutputs], backend: CaptureBackend) -> None:
        self.body = body
        self.backend = backend
        self.static_inputs: dict[str, torch.Tensor] = {}
        self._graphs: dict[int, tuple[Callable[[], None], StepOutputs]] = {}
        self.replays = 0

    @property
    def captured(self) -> list[int]:
        """The recycling counts with a captured graph, in capture order."""
        return list(self._graphs)

    def reset(self) -> None:
        """Forget the captured graphs and the static inputs (the next :meth:`load` may have
        other shapes; graphs are captured again, the first after a warm-up)."""
        self._graphs.clear()
        self.static_inputs = {}
        reset = getattr(self.backend, "reset", None)
        if reset is not None:
            reset()

    @torch.no_grad()
    def load(self, batch: dict[str, torch.Tensor]) -> None:
        """Copy ``batch`` into the static input buffers (allocated from the first batch, on its
        device). Later batches must have the same keys, shapes and dtypes: the graphs read
        these addresses."""
        if not self.static_inputs:
            self.static_inputs = {k: v.detach().clone() for k, v in batch.items()}
            return
        if set(batch) != set(self.static_inputs):
            raise CudaGraphError(
                f"batch features {sorted(set(batch) ^ set(self.static_inputs))} differ from the "
                "captured step's; CUDA Graphs need the same features every step")
        for k, v in batch.items():
            dst = self.static_inputs[k]
            if v.shape != dst.shape or v.dtype != dst.dtype:
                raise CudaGraphError(
                    f"feature {k!r} has shape {tuple(v.shape)} {v.dtype}, the captured step "
                    f"expects {tuple(dst.shape)} {dst.dtype}; CUDA Graphs need fixed padded "
                    "shapes (the same data.n_res, n_clust, n_extra, n_templ and batch size)")
            dst.copy_(v, non_blocking=True)

    def __call__(self, n_cycle: int, warmup_n_cycle: int | None = None,
                 before_replay: Callable[[], object] | None = None) -> StepOutputs:
        """Run the step for ``n_cycle`` passes; returns copies of its outputs (they must survive
        the replay of another graph of the shared pool). ``before_replay`` runs right before
        the replay, after any capture (e.g. reseeding a generator that the warm-up and the
        capture advanced).

        Only the first capture is preceded by eager warm-up steps, of ``warmup_n_cycle`` passes
        (the largest count that will be drawn; default ``n_cycle``): they run every kernel
        that any count runs (no-gradient passes and the gradient pass). Later captures skip
        it: an eager step allocates outside the graphs' pool, which by then holds a whole
        step's activations, so a warm-up per count needed twice the step's memory (the
        af2_initial step without checkpointing ran out of memory on an 80 GB H100 that way).
        """
        if not self.static_inputs:
            raise CudaGraphError("GraphedStep: load(batch) before the first step")
        if n_cycle not in self._graphs:
            warm = None
            if not self._graphs:
                n_warm = max(n_cycle, warmup_n_cycle or n_cycle)
                warm = lambda: self.body(n_warm)  # noqa: E731
            replay, outputs = self.backend.capture(lambda: self.body(n_cycle), warmup_fn=warm)
            self._graphs[n_cycle] = (replay, outputs)
        replay, outputs = self._graphs[n_cycle]
        if before_replay is not None:
            before_replay()
        replay()  # capturing does not run the work: replay also right after the capture
        self.replays += 1
        return {k: v.detach().clone() for k, v in outputs.items()}


# -- finding host synchronizations (what makes a step uncapturable) -------------------------------

# aten ops that copy a value to the host or size an output by data
_SYNC_OPS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero",
                       "masked_select", "_unique", "_unique2", "unique_consecutive",
                       "unique_dim", "bincount", "histc", "repeat_interleave",
                       "_assert_async",
                       # a tensor made from host data (torch.tensor, new_tensor, as_tensor):
                       # on CUDA a pageable host-to-device copy, which capture refuses
                       "lift_fresh", "lift_fresh_copy"})
# composite functions whose host read is a CPU-only input check (the CUDA kernels skip it)
_CPU_ONLY_CHECKS = frozenset({torch.nn.functional.one_hot})


@contextlib.contextmanager
def _host_sync_probe(found: list[str]) -> Iterator[None]:
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    depth = [0]

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            inside = func in _CPU_ONLY_CHECKS
            depth[0] += inside
            try:
                return func(*args, **(kwargs or {}))
            finally:
                depth[0] -= inside

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in _SYNC_OPS and not depth[0]:
                found.append(name)
            return func(*args, **(kwargs or {}))

    with Functions(), Dispatch():
        yield


def host_syncs(fn: Callable[[], object]) -> list[str]:
    """Run ``fn`` (on any device, CPU included) and list the aten ops it calls that would
    synchronize a CUDA device with the host (``.item()``, ``nonzero``, data-dependent output
    sizes) or copy host data to it (``torch.tensor``, ``new_tensor``): each one makes CUDA Graph
    capture fail. Run ``fn`` once before, so that constant tables cached on first use are
    built. ``one_hot``'s CPU-only range check is not counted
    (the CUDA kernel does not read back)."""
    found: list[str] = []
    with _host_sync_probe(found):
        fn()
    return found
