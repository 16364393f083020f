"""fold-model's blocks with every op on fold-kernels' Triton backend vs the float64 torch path.

The kernels' own tests check each op alone; this checks them composed as the model calls them:
the layouts the model passes (channel-first triangle products read by LayerNorm through strides,
head-last pair-bias views, transposed heads), and every gradient (inputs and each parameter).
AF2 Evoformer block, AF3 Pairformer block and diffusion transformer block at odd sizes with
masks that have holes, fp32 against fp64 (the kernels' fp32 products are exact: 1e-5).

On a machine without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by
the noxfile); the registry's Triton backend only accepts GPU tensors, so here it is told that
CPU tensors are fine.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

# fold-model's test helpers: parameter re-draw, masks with holes, NaN-refusing relative error
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "fold-model" / "tests"))
from _trunk_helpers import holes, randomize_, rel_err  # noqa: E402

fold_kernels = pytest.importorskip("fold_kernels")
from _triton_backend import DEVICE, register_triton  # noqa: E402
from fold_model import ops  # noqa: E402

TOL = 1e-5


@pytest.fixture
def triton_backend(monkeypatch):
    register_triton(monkeypatch)
    q = torch.randn(1, 2, 2, 5, 8, device=DEVICE)
    assert ops.resolve("attention", q, q, q) is fold_kernels.evo_attention
    p = torch.randn(1, 8, 3, 3, device=DEVICE)
    assert ops.resolve("triangle_projection_gate", p, p[0, :, 0, 0], p[:, 0]) is \
        fold_kernels.triangle_projection_gate
    x = torch.randn(1, 3, 3, 4, device=DEVICE)
    assert ops.resolve("linear_channel_first", x, x[0, 0]) is fold_kernels.linear_channel_first
    assert ops.resolve("triangle_projection", x, p[0, :, :, 0].reshape(8, 3)[:, :1].expand(8, 4),
                       p[0, :, 0, 0], x[..., 0]) is fold_kernels.triangle_projection
    proj = torch.randn(1, 2, 5, 4 * 2 * 8, device=DEVICE)
    assert ops.resolve("attention_packed", proj, 2) is fold_kernels.evo_attention_packed
    w = torch.randn(4, device=DEVICE)
    assert ops.resolve("layer_norm_fork", x, w, w, 1e-5, 2) is fold_kernels.layer_norm_fork
    cond = torch.randn(1, 3, 3, 8, device=DEVICE)
    assert ops.resolve("adaptive_layer_norm", x, cond, w) is fold_kernels.adaptive_layer_norm


def _compare(block: torch.nn.Module, inputs: list, float_inputs: list[int]) -> None:
    """fp32 block on the Triton backend vs its fp64 copy on torch: outputs and every grad."""
    block = randomize_(block).eval()  # eval: no dropout, the two paths see the same function
    ref = copy.deepcopy(block).double()
    block = block.to(DEVICE)

    def prep(dtype, device):
        out = []
        for i, x in enumerate(inputs):
            x = x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
            out.append(x.clone().requires_grad_(i in float_inputs))
        return out

    ins = prep(torch.float32, DEVICE)
    out = block(*ins)  # auto: Triton wherever it supports the call (all but a few small ops)
    outs = out if isinstance(out, tuple) else (out,)
    gens = [torch.randn(o.shape, generator=torch.Generator().manual_seed(9 + k),
                        dtype=torch.float64) for k, o in enumerate(outs)]
    torch.autograd.backward(outs, [g.to(DEVICE, torch.float32) for g in gens])

    ref_ins = prep(torch.float64, "cpu")
    with ops.use_backend("torch"):
        ref_out = ref(*ref_ins)
    ref_outs = ref_out if isinstance(ref_out, tuple) else (ref_out,)
    torch.autograd.backward(ref_outs, gens)

    for o, r in zip(outs, ref_outs):
        assert rel_err(o.cpu(), r) < TOL
    for i in float_inputs:
        assert rel_err(ins[i].grad.cpu(), ref_ins[i].grad) < TOL, f"input {i}"
    for (name, p), (_, q) in zip(block.named_parameters(), ref.named_parameters()):
        assert p.grad is not None, name
        if q.grad.norm() < 1e-9:
            # zero by symmetry (e.g. the bias of the LayerNorm before a bias-free pair-bias
            # projection shifts every logit of a row alike): fp32 rounding noise only
            assert torch.isfinite(p.grad).all() and p.grad.norm() < 1e-4, name
            continue
        assert rel_err(p.grad.cpu(), q.grad) < TOL, name


N = 13  # odd: no kernel block divides it


def _evoformer_case(seed: int):
    """``(block, inputs, float_inputs)``: a tiny AF2 Evoformer block, MSA and pair with holes."""
    from fold_model.af2 import config
    from fold_model.af2.evoformer import make_block

    cfg = config("tiny").evoformer
    block = make_block(cfg, cfg.c_m, cfg.c_z, "af2")
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(1, 5, N, cfg.c_m, generator=g)
    z = torch.randn(1, N, N, cfg.c_z, generator=g)
    seq = holes((1, N), seed=seed + 1)
    msa_mask = holes((1, 5, N), seed=seed + 2) * seq[:, None]
    return block, [m, z, msa_mask, seq[:, :, None] * seq[:, None]], [0, 1]


def _pairformer_case(seed: int):
    """A tiny AF3 Pairformer block, s and z, a token mask with holes."""
    from fold_model.af3.config import config
    from fold_model.af3.pairformer import PairformerBlock

    cfg = config("tiny")
    p = cfg.pairformer
    block = PairformerBlock(cfg.c_s, cfg.c_z, p.c_hidden_mul, p.c_hidden_tri_att,
                            p.no_heads_tri_att, p.no_heads_single, p.transition_n, p.dropout)
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, N, cfg.c_s, generator=g)
    z = torch.randn(1, N, N, cfg.c_z, generator=g)
    mask = holes((1, N), seed=seed + 1)
    return block, [s, z, mask, mask[:, :, None] * mask[:, None]], [0, 1]


def _diffusion_case(seed: int):
    """A tiny AF3 diffusion transformer block over 3 samples: a, s, z and a token mask."""
    from fold_model.af3.config import config
    from fold_model.af3.diffusion import DiffusionTransformerBlock

    cfg = config("tiny")
    d = cfg.diffusion
    block = DiffusionTransformerBlock(d.c_token, cfg.c_s, cfg.c_z, d.no_heads, d.transition_n)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(1, 3, N, d.c_token, generator=g)
    s = torch.randn(1, 3, N, cfg.c_s, generator=g)
    z = torch.randn(1, N, N, cfg.c_z, generator=g)
    return block, [a, s, z, holes((1, N), seed=seed + 1)], [0, 1, 2]


class _AtomStack(torch.nn.Module):
    """An AF3 atom transformer over its windows of ``atom_mask`` (AtomWindows is not a tensor)."""

    def __init__(self, transformer, n_q: int, n_k: int) -> None:
        super().__init__()
        self.transformer, self.n_q, self.n_k = transformer, n_q, n_k

    def forward(self, q, c, p, atom_mask):
        from fold_model.af3.embedders import AtomWindows

        return self.transformer(q, c, p, AtomWindows(atom_mask, self.n_q, self.n_k))


def _atom_case(seed: int):
    """A tiny AF3 atom transformer (two blocks) over 3 samples of 37 atoms with holes: q
    ``[1, 3, A, C]``, the conditioning c ``[1, A, C]`` shared by the samples (its AdaLN
    projection ``[1, 1, A, 2C]`` broadcasts), the windows' pair p and the atom mask."""
    from fold_model.af3.config import config
    from fold_model.af3.embedders import AtomTransformer

    a = config("tiny").atom
    n_q, n_k, atoms = 8, 16, 37  # windows smaller than AF3's 32 / 128: several, a partial one
    block = _AtomStack(AtomTransformer(a.c_atom, a.c_atompair, 2, a.no_heads,
                                       key_norm=a.key_norm), n_q, n_k)
    g = torch.Generator().manual_seed(seed)
    k = -(-atoms // n_q)
    q = torch.randn(1, 3, atoms, a.c_atom, generator=g)
    c = torch.randn(1, atoms, a.c_atom, generator=g)
    p = torch.randn(1, k, n_q, n_k, a.c_atompair, generator=g)
    return block, [q, c, p, holes((1, atoms), seed=seed + 1)], [0, 1, 2]


def test_evoformer_block(triton_backend):
    _compare(*_evoformer_case(1))


def test_atom_transformer(triton_backend):
    _compare(*_atom_case(2))


def test_atom_transformer_inference(triton_backend, monkeypatch):
    """Inference (no autograd): the windowed attention (8 queries, 16 keys a window) runs on
    the forward kernel with its own key length, the samples sharing each window's bias; fp32
    against the fp64 torch path."""
    from fold_kernels import evo_attention_cross

    block, inputs, _ = _atom_case(5)
    block = randomize_(block).eval()
    ref = copy.deepcopy(block).double()
    calls = []
    cross = evo_attention_cross.cross_attention
    monkeypatch.setattr(evo_attention_cross, "cross_attention",
                        lambda *a, **k: calls.append(1) or cross(*a, **k))
    with torch.no_grad():
        out = block.to(DEVICE)(*[x.to(DEVICE) for x in inputs])
        with ops.use_backend("torch"):
            want = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
    assert len(calls) == 2  # one per block
    assert rel_err(out.cpu(), want) < TOL


def test_pairformer_block(triton_backend):
    _compare(*_pairformer_case(4))


def test_diffusion_transformer_block(triton_backend):
    _compare(*_diffusion_case(6))


def _saved_bytes_outside_checkpoints(block, inputs, backend: str) -> int:
    """Bytes autograd keeps for backward after one training-mode forward under bf16 autocast
    (each storage once, inputs and parameters left out): with per-sub-layer checkpointing,
    what stays between the forward and the backward of a whole stack."""
    keep = {t.untyped_storage().data_ptr() for t in [*inputs, *block.parameters()]}
    seen: set[int] = set()
    total = 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in keep and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with ops.use_backend(backend), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = block(*[x.clone().requires_grad_(x.is_floating_point()) for x in inputs])
    del out
    return total


def test_pairformer_block_saves_no_more_than_torch(triton_backend):
    """The kernel path must not keep more activations alive than eager PyTorch: with
    checkpointing per sub-layer, only the sub-layer inputs and the (broadcast) dropout masks.
    The fused bias-dropout-residual once saved its update operand for its shape alone, which
    pinned one pair-sized tensor per sub-layer (about 8 GiB of an AF3 step at 384 tokens)."""
    from fold_model.af3.config import config
    from fold_model.af3.pairformer import PairformerBlock

    cfg = config("tiny")
    p = cfg.pairformer
    block = PairformerBlock(cfg.c_s, cfg.c_z, p.c_hidden_mul, p.c_hidden_tri_att,
                            p.no_heads_tri_att, p.no_heads_single, p.transition_n, 0.25,
                            use_checkpoint=True)
    block = randomize_(block).to(DEVICE).train()  # train: dropout masks are saved too
    g = torch.Generator().manual_seed(8)
    mask = holes((1, N), seed=9)
    inputs = [torch.randn(1, N, cfg.c_s, generator=g), torch.randn(1, N, N, cfg.c_z, generator=g),
              mask, mask[:, :, None] * mask[:, None]]
    inputs = [x.to(DEVICE) for x in inputs]
    torch_bytes = _saved_bytes_outside_checkpoints(block, inputs, "torch")
    kernel_bytes = _saved_bytes_outside_checkpoints(block, inputs, "auto")
    pair_bytes = N * N * cfg.c_z * 4
    assert torch_bytes >= 5 * pair_bytes  # the five pair sub-layers' inputs, at least
    assert kernel_bytes <= torch_bytes, (kernel_bytes, torch_bytes)


def test_extra_msa_block(triton_backend):
    """Global column attention (its LayerNorm forked) and the extra MSA's small C_e."""
    from fold_model.af2 import config
    from fold_model.af2.evoformer import make_block

    cfg = config("tiny")
    c_z = cfg.evoformer.c_z
    block = make_block(cfg.extra_msa, cfg.extra_msa.c_e, c_z, "af2", extra_msa=True)
    g = torch.Generator().manual_seed(11)
    e = torch.randn(1, 7, N, cfg.extra_msa.c_e, generator=g)
    z = torch.randn(1, N, N, c_z, generator=g)
    seq = holes((1, N), seed=12)
    msa_mask = holes((1, 7, N), seed=13) * seq[:, None]
    _compare(block, [e, z, msa_mask, seq[:, :, None] * seq[:, None]], [0, 1])


def test_af3_msa_module_block(triton_backend):
    """The AF3 MSA module's block: outer product mean, pair-weighted averaging (its MSA
    LayerNorm read by the values and the gate) and the pair updates."""
    from fold_model.af3.config import config
    from fold_model.af3.msa_module import MSAModuleBlock

    cfg = config("tiny")
    block = MSAModuleBlock(cfg.msa, cfg.c_z, last=False)
    g = torch.Generator().manual_seed(14)
    m = torch.randn(1, 6, N, cfg.msa.c_m, generator=g)
    z = torch.randn(1, N, N, cfg.c_z, generator=g)
    tokens = holes((1, N), seed=15)
    _compare(block, [m, z, holes((1, 6, N), seed=16) * tokens[:, None],
                     tokens[:, :, None] * tokens[:, None], tokens], [0, 1])


# ---------------------------------------------------------------------------------------------
# Mixed precision, as fold-train runs the stacks: fp32 streams (and fp32 or bf16 weights) under
# bf16 autocast. The LayerNorm forks hand bf16 y to the projections and the dispatcher lowers the
# projections' inputs (fold_ops.autocast), so every op with a kernel is served by it.

def _mixed_run(block, inputs, float_inputs, backend, seed=21):
    ins = [x.to(DEVICE).clone().requires_grad_(i in float_inputs) for i, x in enumerate(inputs)]
    with ops.use_backend(backend), torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = block(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    gens = [torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + k),
                        dtype=torch.float64) for k, o in enumerate(outs)]
    torch.autograd.backward(outs, [g.to(DEVICE, o.dtype) for g, o in zip(gens, outs)])
    grads = [ins[i].grad for i in float_inputs] + [p.grad for p in block.parameters()]
    return outs, grads, gens


def _compare_mixed(block, inputs, float_inputs, weights, monkeypatch, shape_refusals=()):
    """Every op with a kernel served by it (none left to the reference by its dtypes), and the
    outputs and every gradient against float64 within bf16's reach: each stored activation and
    gradient is rounded to bf16 (2^-9 relative) some twenty times along a block's forward and
    backward, and a parameter's gradient summed over many pairs cancels, so the yardstick is
    PyTorch's own autocast path on the same block (6e-2 for one LayerNorm weight's gradient
    here): at most 4x its error plus 2e-2. A dtype mix-up (bf16 bytes read as fp32, a missing
    cast) is off by O(1). ``shape_refusals``: ops whose calls here the kernels do not cover
    for their shapes (tests/integration/test_product_precision.py)."""
    from fold_kernels.registration import SUPPORTS
    from fold_model.ops import registry

    block = randomize_(block).eval()
    ref = copy.deepcopy(block).double()
    chosen = []
    select = registry._select

    def spy(op, args, kwargs, backend, fake):
        name = select(op, args, kwargs, backend, fake)
        chosen.append((op, name))
        return name

    monkeypatch.setattr(registry, "_select", spy)
    outs, grads, gens = _mixed_run(copy.deepcopy(block).to(DEVICE, weights), inputs,
                                   float_inputs, "auto")
    refused = sorted({op for op, name in chosen if name == "torch" and op in SUPPORTS
                      and op not in shape_refusals})
    assert chosen and not refused, f"left to the reference under autocast: {refused}"
    t_outs, t_grads, _ = _mixed_run(copy.deepcopy(block).to(DEVICE, weights), inputs,
                                    float_inputs, "torch")

    r_ins = [x.double().clone().requires_grad_(i in float_inputs) for i, x in enumerate(inputs)]
    with ops.use_backend("torch"):
        r_out = ref(*r_ins)
    r_outs = r_out if isinstance(r_out, tuple) else (r_out,)
    torch.autograd.backward(r_outs, gens)
    r_grads = [r_ins[i].grad for i in float_inputs] + [p.grad for p in ref.parameters()]
    names = ([f"output {k}" for k in range(len(outs))] + [f"input {i}" for i in float_inputs]
             + [n for n, _ in block.named_parameters()])
    for name, o, t, r in zip(names, [*outs, *grads], [*t_outs, *t_grads], [*r_outs, *r_grads]):
        assert o.dtype == t.dtype, f"{name}: {o.dtype}, the torch path's {t.dtype}"
        if r.norm() < 1e-9:  # zero by symmetry (see _compare)
            continue
        err, base = rel_err(o.cpu(), r), rel_err(t.cpu(), r)
        assert err < 4 * base + 2e-2, (name, err, base)


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_pairformer_block_mixed_precision(triton_backend, monkeypatch, weights):
    _compare_mixed(*_pairformer_case(14), weights, monkeypatch)


def test_evoformer_block_mixed_precision(triton_backend, monkeypatch):
    _compare_mixed(*_evoformer_case(16), torch.float32, monkeypatch)


def test_diffusion_transformer_block_mixed_precision(triton_backend, monkeypatch):
    """The token stream a and s in fp32, the AdaLN's conditioning projection in bf16."""
    _compare_mixed(*_diffusion_case(19), torch.float32, monkeypatch)


def test_atom_transformer_mixed_precision(triton_backend, monkeypatch):
    """The atom stream q and c in fp32 under autocast: the AdaLN's bf16 conditioning projection
    broadcasts over the samples and is served by the kernel; the sequence-local attention (8
    queries, 16 keys a window) is left to PyTorch for its shape."""
    _compare_mixed(*_atom_case(23), torch.float32, monkeypatch, shape_refusals=("attention",))
