"""Trace a module with torch.fx and record, per node, the shapes and the activation memory.

The module runs once on FakeTensors (no real memory, real shapes/dtypes/devices) under
:class:`~fold_chunk.memory_tracker.AllocationTracker`. For every node we keep a
:class:`NodeInfo`: the output's tensor metadata, the storages it allocated and still holds
(``own``), the storages its output references (``refs``, views included) and the transient
bytes it needed beyond its outputs (``temp``, e.g. the copy a ``matmul`` makes of a strided
operand). Shapes are concrete, so non-tensor nodes (``x.shape``, ``x.size(-1)``, dtypes) are
folded into constants: the traced graph, and every module generated from it, is specialised to
the example inputs' shapes, dtypes and devices.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from fold_chunk.memory_tracker import AllocationTracker, storage_key

__all__ = ["TensorMeta", "NodeInfo", "Traced", "trace_module", "is_inplace"]


@dataclass(frozen=True)
class TensorMeta:
    """What the planner needs to know of a tensor value."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    nbytes: int

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass
class NodeInfo:
    """Per-node result of the fake run. ``meta`` is a TensorMeta, a tuple/list of them (for ops
    returning several tensors) or a plain constant."""

    meta: Any
    own: dict[int, int] = field(default_factory=dict)  # storage id -> bytes, allocated here
    refs: set[int] = field(default_factory=set)  # storage ids the output references
    temp: int = 0


@dataclass
class Traced:
    gm: fx.GraphModule
    info: dict[fx.Node, NodeInfo]
    example_inputs: tuple[Any, ...]

    @property
    def nodes(self) -> list[fx.Node]:
        return list(self.gm.graph.nodes)


_INPLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.imatmul,
    operator.setitem,
}


def is_inplace(node: fx.Node) -> bool:
    """Whether the node mutates a tensor (``x.add_(y)``, ``x += y``, ``x[i] = y``)."""
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).startswith("__")
    if node.op == "call_function":
        if node.target in _INPLACE_OPERATORS:
            return True
        if node.kwargs.get("out") is not None or node.kwargs.get("inplace"):
            return True
    return False


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return TensorMeta(tuple(v.shape), v.dtype, v.device, v.untyped_storage().nbytes())
    if isinstance(v, torch.Size):
        return tuple(v)
    if isinstance(v, (tuple, list)):
        return type(v)(_to_meta(x) for x in v)
    return v


def _has_tensor(v: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in tree_flatten(v)[0])


_CONST_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                torch.memory_format, slice, type(Ellipsis))


def _foldable(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_foldable(x) for x in v)
    return isinstance(v, _CONST_TYPES)


class _FakeRunner(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, tracker: AllocationTracker) -> None:
        super().__init__(gm)
        self.tracker = tracker
        self.info: dict[fx.Node, NodeInfo] = {}
        self.key_to_sid: dict[int, int] = {}
        self.sids = itertools.count()

    def run_node(self, n: fx.Node) -> Any:
        tr = self.tracker
        live_before = tr.live
        tr.reset_window()
        result = super().run_node(n)
        new = set(tr.new_keys)
        info = NodeInfo(meta=_to_meta(result))
        owned: set[int] = set()
        for t in tree_flatten(result)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = storage_key(t)
            if key not in tr.refs:
                continue  # external (input/parameter) storage
            if key in new and key not in owned:  # allocated by this node, held by its output
                owned.add(key)
                sid = next(self.sids)
                self.key_to_sid[key] = sid
                info.own[sid] = tr.sizes[key]
            sid = self.key_to_sid.get(key)
            if sid is not None:
                info.refs.add(sid)
        info.temp = max(0, tr.window_peak - live_before - sum(info.own.values()))
        self.info[n] = info
        return result


@contextlib.contextmanager
def _fake_parameters(gm: fx.GraphModule, mode: FakeTensorMode) -> Iterator[None]:
    """Parameters and buffers of every submodule as FakeTensors while the fake run lasts, then
    the real ones again. An op with a real tensor input would bypass FakeTensorMode's dispatch
    cache (and convert the tensor again on every call); the fakes are the ones
    ``mode.from_tensor`` memoizes, so the accounting is the same."""
    saved: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for mod in gm.modules():
            for store in (mod._parameters, mod._buffers):
                for name, t in list(store.items()):
                    if t is not None:
                        saved.append((store, name, t))
                        store[name] = mode.from_tensor(t)
        yield
    finally:
        for store, name, t in reversed(saved):
            store[name] = t


def fake_run(gm: fx.GraphModule, example_inputs: Sequence[Any],
             ) -> tuple[dict[fx.Node, NodeInfo], int]:
    """Run ``gm`` on FakeTensor copies of the inputs (and of its parameters); return the
    per-node :class:`NodeInfo` and the peak live activation bytes of the run."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    # inputs on an accelerator: count its memory only (host copies are not what the budget is)
    devices = {x.device.type for x in tree_flatten(tuple(example_inputs))[0]
               if isinstance(x, torch.Tensor)} - {"cpu", "meta"}
    tracker = AllocationTracker(devices.pop() if len(devices) == 1 else None)
    fake_inputs = tree_map(
        lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, tuple(example_inputs)
    )
    fakes = [mode.from_tensor(t) for t in itertools.chain(gm.parameters(), gm.buffers())]
    for t in itertools.chain(tree_flatten(fake_inputs)[0], fakes):
        if isinstance(t, torch.Tensor):
            tracker.external.add(storage_key(t))
    runner = _FakeRunner(gm, tracker)
    with _fake_parameters(gm, mode), torch.no_grad(), mode, tracker:
        out = runner.run(*fake_inputs)
    del out
    return runner.info, tracker.peak


def _fold_constants(gm: fx.GraphModule, info: dict[fx.Node, NodeInfo]) -> None:
    """Replace every non-tensor node (sizes, dtypes, ints) by its constant value."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op in ("output",) or is_inplace(node):
            continue
        meta = info[node].meta
        if _has_tensor_meta(meta) or not _foldable(meta):
            continue
        node.replace_all_uses_with(_as_constant(meta))  # type: ignore[arg-type]
    _dead_code(graph)
    gm.recompile()


def _has_tensor_meta(meta: Any) -> bool:
    if isinstance(meta, TensorMeta):
        return True
    if isinstance(meta, (tuple, list)):
        return any(_has_tensor_meta(m) for m in meta)
    return False


def _as_constant(meta: Any) -> Any:
    if isinstance(meta, list):
        return [_as_constant(m) for m in meta]
    if isinstance(meta, tuple):
        return tuple(_as_constant(m) for m in meta)
    return meta


def _dead_code(graph: fx.Graph) -> None:
    """Remove unused pure nodes (fx's own pass may drop in-place method calls)."""
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "call_method", "get_attr", "call_module") \
                and not node.users and not is_inplace(node):
            graph.erase_node(node)


class _Tracer(fx.Tracer):
    """``torch.fx.symbolic_trace``'s tracer with parameters and buffers found by identity in
    one dict. fx's own ``getattr`` scans ``root.named_parameters()`` on every parameter read:
    quadratic in the module's size (about 30 s for a 48-block Pairformer, more than the rest of
    AutoChunk's planning); the graph is the same."""

    def trace(self, root, concrete_args=None):
        self._names: dict[int, str] | None = None
        return super().trace(root, concrete_args)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        if not isinstance(attr_val, torch.Tensor):
            return attr_val
        if self._names is None:
            names = {}
            if self.proxy_buffer_attributes:
                names.update((id(b), n) for n, b in self.root.named_buffers())
            names.update((id(p), n) for n, p in self.root.named_parameters())
            self._names = names
        if not isinstance(attr_val, torch.nn.Parameter) and not self.proxy_buffer_attributes:
            return attr_val
        name = self._names.get(id(attr_val))
        if name is None:
            return attr_val
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]


def trace_module(module: torch.nn.Module, example_inputs: Sequence[Any]) -> Traced:
    """Symbolically trace ``module`` and annotate it with shapes and memory (see module doc)."""
    if isinstance(module, fx.GraphModule):
        graph = fx.Graph()  # a copy: constant folding must not edit the caller's graph
        graph.output(graph.graph_copy(module.graph, {}))
        gm = fx.GraphModule(module, graph)
    else:
        try:
            tracer = _Tracer()
            graph = tracer.trace(module)
            gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
        except Exception as exc:  # fx raises many kinds; say what the user has to fix
            raise TypeError(
                f"fold_chunk: torch.fx could not trace {type(module).__name__}: {exc}. "
                "AutoChunk needs a module without data-dependent Python control flow."
            ) from exc
    example_inputs = tuple(example_inputs)
    info, _ = fake_run(gm, example_inputs)
    _fold_constants(gm, info)
    # Folding changes nothing a tensor node computes; refresh the bookkeeping of the survivors.
    info = {n: info[n] for n in gm.graph.nodes if n in info}
    return Traced(gm, info, example_inputs)
