"""Programmatic dependent launch (fold_kernels.pdl): every kernel waits for its predecessors
before it touches memory, the launcher passes PDL only where it is on, and on a GPU the ops give
the same bits with PDL and without, eagerly and in a CUDA graph."""

import ast
import importlib
import inspect
import pkgutil
import textwrap

import fold_kernels
import pytest
import torch
import triton
import triton.language as tl
from fold_kernels import launch, pdl

GPU = torch.cuda.is_available()


def _fast_kernels():
    """Every FastKernel defined in fold_kernels' modules, as (module, name, kernel)."""
    out = []
    for info in pkgutil.iter_modules(fold_kernels.__path__):
        mod = importlib.import_module(f"fold_kernels.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, launch.FastKernel) and obj.jit.fn.__module__ == mod.__name__:
                out.append((mod.__name__, name, obj))
    return out


def test_every_kernel_takes_pdl_and_enters_first():
    """A kernel launched with PDL that loaded or stored before ``pdl.enter`` would race with the
    kernel before it: the wait must be the first statement (after the docstring)."""
    kernels = _fast_kernels()
    assert len(kernels) >= 20  # the walk found the kernels (a broken walk must not pass)
    for module, name, k in kernels:
        params = list(inspect.signature(k.jit.fn).parameters)
        assert params[-1] == pdl.PARAM, f"{module}.{name}: no trailing PDL parameter"
        fn = ast.parse(textwrap.dedent(inspect.getsource(k.jit.fn))).body[0]
        body = fn.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        assert ast.unparse(body[0]) == "pdl.enter(PDL)", f"{module}.{name} starts otherwise"


@launch.fast
@triton.jit
def _scale(X, Y, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=m) * 2.0 + 1.0, mask=m)


def test_launcher_passes_pdl_false_off_hopper(monkeypatch):
    """Under the interpreter (and where PDL is off) the kernel gets PDL=False and no
    ``launch_pdl`` option; it runs."""
    seen = []
    real = _scale.jit.__getitem__

    def spy(grid):
        run = real(grid)

        def call(*args, **kwargs):
            seen.append(kwargs)
            return run(*args, **kwargs)
        return call
    monkeypatch.setattr(_scale, "jit", type("J", (), {"__getitem__": lambda s, g: spy(g)})())
    device = "cuda" if GPU else "cpu"
    monkeypatch.setenv("FOLD_KERNELS_PDL", "0")
    x = torch.arange(37, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    _scale[(3,)](x, y, 37, BLOCK=16)
    assert torch.equal(y, x * 2 + 1)
    assert seen and all(kw[pdl.PARAM] is False and "launch_pdl" not in kw for kw in seen)


def test_active_off_under_interpreter_and_switch(monkeypatch):
    monkeypatch.setenv("FOLD_KERNELS_PDL", "0")
    assert not pdl.active(0)
    monkeypatch.setenv("FOLD_KERNELS_PDL", "1")
    if not GPU:
        assert not pdl.active(0)  # the interpreter: no griddepcontrol there


@pytest.mark.skipif(not GPU, reason="programmatic dependent launch needs a GPU")
def test_kernel_waits_for_the_kernel_before(monkeypatch):
    """A write-after-read hazard: the second kernel overwrites the first one's input. With PDL
    the second is scheduled while the first runs; its wait must hold the store back."""
    monkeypatch.setenv("FOLD_KERNELS_PDL", "1")
    n = 1 << 24
    x = torch.randn(n, device="cuda")
    ref = x * 2 + 1
    y, z = torch.empty_like(x), torch.zeros_like(x)
    for _ in range(3):
        x0 = x.clone()
        _scale[(triton.cdiv(n, 1024),)](x0, y, n, BLOCK=1024)  # reads x0
        _scale[(triton.cdiv(n, 1024),)](z, x0, n, BLOCK=1024)  # overwrites x0 with 1
        torch.cuda.synchronize()
        assert torch.equal(y, ref)
        assert torch.equal(x0, torch.ones_like(x0))


def _chain(x, w, b, gate, dy):
    """LayerNorm -> gate -> LayerNorm, forward and backward: nine fold kernels in a row."""
    from fold_kernels.elementwise import bias_sigmoid_gate
    from fold_kernels.layer_norm import layer_norm

    y = layer_norm(bias_sigmoid_gate(layer_norm(x, w, b), gate), w, b)
    return (y, *torch.autograd.grad(y, (x, w, b, gate), dy))


@pytest.mark.skipif(not GPU, reason="programmatic dependent launch needs a GPU")
def test_same_bits_with_and_without_pdl_eager_and_graph(monkeypatch):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    x, gate = rnd(3, 251, 131), rnd(3, 251, 131)
    w, b = rnd(131), rnd(131)
    dy = torch.randn(3, 251, 131, generator=g).to("cuda", torch.bfloat16)
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("FOLD_KERNELS_PDL", mode)
        # detached: a clone of y would keep this call's autograd graph (and the leaves'
        # AccumulateGrad nodes, made on the default stream) alive into the capture
        eager = [t.detach().clone() for t in _chain(x, w, b, gate, dy)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _chain(x, w, b, gate, dy)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _chain(x, w, b, gate, dy)
        graph.replay()
        torch.cuda.synchronize()
        out[mode] = (eager, [t.detach().clone() for t in captured])
        del captured, graph
    names = ["y", "dx", "dw", "db", "dgate"]
    pairs = [(f"eager vs graph, PDL {m}", out[m][0], out[m][1]) for m in ("0", "1")]
    pairs += [(f"{where}, PDL off vs on", out["0"][i], out["1"][i])
              for where, i in (("eager", 0), ("graph", 1))]
    differ = []
    for what, xs, ys in pairs:
        for name, a, b_ in zip(names, xs, ys):
            if not (torch.isfinite(b_).all() and torch.equal(a, b_)):
                differ.append(f"{what}: {name} by {(a.float() - b_.float()).abs().max().item()}")
    assert not differ, "; ".join(differ)
