"""Triangle multiplication as one autograd node (``ops.triangle_multiplication``, fold-kernels)
inside fold-model's layer and blocks: a training step equals the composed ops' step bit for
bit (``FOLD_KERNELS_TRI_MUL_NODE=0``), the node runs where the layer records autograd and
nowhere else (inference, row chunks), and the blocks' steps hold two such nodes instead of
their triangle multiplications' dozens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "fold-model" / "tests"))
import test_grouped_casts as blocks  # noqa: E402  (fold-model's test: the blocks and the step)
from _triton_backend import DEVICE, register_triton  # noqa: E402


@pytest.fixture
def node_calls(monkeypatch):
    """The kernels registered, and a list that grows by one per one-node call."""
    register_triton(monkeypatch)
    module = sys.modules["fold_kernels.triangle_multiplication"]
    calls = []
    apply = module._TriangleMultiplication.apply

    def counted(*args):
        calls.append(args[0].shape)
        return apply(*args)

    monkeypatch.setattr(module._TriangleMultiplication, "apply", counted)
    return calls


def _nodes(out) -> int:
    """Autograd nodes reachable from ``out``'s grad_fn."""
    seen, todo = set(), [o.grad_fn for o in out if o.grad_fn is not None]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return len(seen)


@pytest.mark.parametrize("name", ["evoformer", "pairformer"])
def test_block_step_bit_for_bit_with_two_nodes(name, node_calls, monkeypatch):
    """bf16 autocast training step (fp32 weights and streams, weights cast once per block):
    outputs and every gradient equal the composed ops' step; two one-node calls (outgoing,
    incoming) per step, none with the switch off; fewer autograd nodes."""
    block, args = getattr(blocks, name)()
    block = blocks._noised(block).to(DEVICE)
    from fold_model import ops

    steps = {}
    with ops.use_backend("triton"):
        blocks._step(block, args)  # the grouped casts' plan
        for switch in ("0", "1"):
            monkeypatch.setenv("FOLD_KERNELS_TRI_MUL_NODE", switch)
            before = len(node_calls)
            steps[switch] = blocks._step(block, args)[:2], len(node_calls) - before
    assert (steps["0"][1], steps["1"][1]) == (0, 2)
    blocks.assert_same_step(steps["0"][0], steps["1"][0])


@pytest.mark.parametrize("outgoing", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_bit_for_bit_and_its_node_count(outgoing, dtype, node_calls, monkeypatch):
    from fold_model import ops
    from fold_model.layers.triangle_multiplication import TriangleMultiplication

    g = torch.Generator().manual_seed(3)
    layer = TriangleMultiplication(10, 6, outgoing=outgoing)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    layer = layer.to(DEVICE, dtype)
    z = torch.randn(2, 9, 9, 10, generator=g).to(DEVICE, dtype)
    mask = (torch.rand(2, 9, 9, generator=g) > 0.2).to(DEVICE, dtype)
    mask[:, 4] = 0  # a fully masked row
    d_update, d_z = (torch.randn(z.shape, generator=g).to(DEVICE, dtype) for _ in range(2))
    results = {}
    with ops.use_backend("triton"):
        for switch in ("0", "1"):
            monkeypatch.setenv("FOLD_KERNELS_TRI_MUL_NODE", switch)
            zi = z.clone().requires_grad_()
            update, z_out = layer.forward_residual(zi, mask)
            nodes = _nodes((update, z_out))
            grads = torch.autograd.grad((update, z_out), [zi, *layer.parameters()],
                                        (d_update, d_z))
            results[switch] = (update.detach(), grads, nodes)
    assert len(node_calls) == 1
    (u0, g0, n0), (u1, g1, n1) = results["0"], results["1"]
    assert torch.equal(u0, u1)
    for a, b in zip(g0, g1, strict=True):
        assert torch.isfinite(b).all() and torch.equal(a, b)
    # the layer's parameters' AccumulateGrad nodes and the weights' concatenations remain
    assert n1 < n0 - 10, (n0, n1)


def test_inference_and_row_chunks_compose_the_ops(node_calls):
    from fold_model import ops
    from fold_model.layers.triangle_multiplication import TriangleMultiplication

    layer = TriangleMultiplication(8, 4, outgoing=True).to(DEVICE)
    z = torch.randn(1, 6, 6, 8, device=DEVICE)
    mask = torch.ones(1, 6, 6, device=DEVICE)
    with ops.use_backend("triton"):
        with torch.no_grad():
            plain = layer(z, mask)
        chunked = layer(z.requires_grad_(), mask, chunk_size=4)
        assert not node_calls
        whole = layer(z, mask)
        assert len(node_calls) == 1
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain, whole.detach(), rtol=1e-5, atol=1e-6)
