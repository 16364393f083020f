"""Evoformer sub-layers against float64 formulas of the AF2 algorithms, the three block orders,
masks with holes, padding invariance and dropout."""

from __future__ import annotations

import pytest
import torch
from _trunk_helpers import holes, randomize_, rel_err
from fold_model.af2 import config
from fold_model.af2.evoformer import (
    EvoformerBlock,
    EvoformerStack,
    ParallelEvoformerBlock,
    make_block,
)
from fold_model.layers import (
    MSAColumnAttention,
    MSARowAttentionWithPairBias,
    MSATransition,
    OuterProductMean,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
)

B, S, N, C_M, C_Z = 2, 5, 7, 16, 12  # odd, mutually distinct sizes


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(B, S, N, C_M, generator=g, dtype=dtype)
    z = torch.randn(B, N, N, C_Z, generator=g, dtype=dtype)
    seq = holes((B, N), seed=seed)
    msa_mask = holes((B, S, N), seed=seed + 1) * seq[:, None, :]
    pair_mask = seq[:, :, None] * seq[:, None, :]
    return m, z, msa_mask.to(dtype), pair_mask.to(dtype)


def _as64(mod):
    return randomize_(mod).double()


def test_outer_product_mean_alg10():
    mod = _as64(OuterProductMean(C_M, C_Z, 6))
    m, _, msa_mask, _ = _inputs(dtype=torch.float64)
    mm = mod.layer_norm(m)
    a = mod.linear_1(mm) * msa_mask[..., None]
    b = mod.linear_2(mm) * msa_mask[..., None]
    outer = torch.einsum("bsic,bsjd->bijcd", a, b).flatten(-2)
    norm = torch.einsum("bsi,bsj->bij", msa_mask, msa_mask)[..., None]
    ref = mod.linear_out(outer / (1e-3 + norm))
    for layout in ("col", "row"):
        out = mod(m, msa_mask, layout=layout)
        assert out.shape == (B, N, N, C_Z)
        assert rel_err(out, ref) < 1e-12


@pytest.mark.parametrize("outgoing", [True, False])
def test_triangle_multiplication_alg11_alg12(outgoing):
    cls = TriangleMultiplicationOutgoing if outgoing else TriangleMultiplicationIncoming
    mod = _as64(cls(C_Z, 10))
    _, z, _, pair_mask = _inputs(1, torch.float64)
    zz = mod.layer_norm_in(z)
    mask = pair_mask[..., None]
    a = torch.sigmoid(mod.linear_a_g(zz)) * mod.linear_a_p(zz) * mask
    b = torch.sigmoid(mod.linear_b_g(zz)) * mod.linear_b_p(zz) * mask
    if outgoing:
        x = torch.einsum("bikc,bjkc->bijc", a, b)
    else:
        x = torch.einsum("bkic,bkjc->bijc", a, b)
    ref = torch.sigmoid(mod.linear_g(zz)) * mod.linear_z(mod.layer_norm_out(x))
    out = mod(z, pair_mask)
    assert out.shape == z.shape
    assert rel_err(out, ref) < 1e-12


def _attn64(mha, q_x, mask, bias):
    H, D = mha.no_heads, mha.c_hidden
    q = mha.linear_q(q_x).unflatten(-1, (H, D))
    k = mha.linear_k(q_x).unflatten(-1, (H, D))
    v = mha.linear_v(q_x).unflatten(-1, (H, D))
    logits = torch.einsum("...qhd,...khd->...hqk", q, k) / D**0.5
    if bias is not None:
        logits = logits + bias.unsqueeze(-4)
    # Masked keys get exactly -1e9 (fully masked rows become uniform), as the registry specifies.
    logits = logits.masked_fill(mask[..., None, None, :] == 0, -1e9)
    o = torch.einsum("...hqk,...khd->...qhd", torch.softmax(logits, -1), v)
    o = o * torch.sigmoid(mha.linear_g(q_x)).unflatten(-1, (H, D))
    return mha.linear_o(o.flatten(-2))


def test_triangle_attention_alg13_alg14():
    _, z, _, pair_mask = _inputs(2, torch.float64)
    start = _as64(TriangleAttentionStartingNode(C_Z, 4, 3))
    zz = start.layer_norm(z)
    bias = start.linear_bias(zz).permute(0, 3, 1, 2)  # b_jk: [B, H, N_j, N_k]
    assert rel_err(start(z, pair_mask), _attn64(start.mha, zz, pair_mask, bias)) < 1e-12

    end = _as64(TriangleAttentionEndingNode(C_Z, 4, 3))
    zz = end.layer_norm(z)
    # Alg. 14: for column j, query i attends over k with keys z_kj and bias b_ki.
    zt = zz.transpose(1, 2)  # [B, j, i, C]
    bias = end.linear_bias(zz).permute(0, 3, 2, 1)  # [B, H, i, k] = b_ki
    ref = _attn64(end.mha, zt, pair_mask.transpose(1, 2), bias).transpose(1, 2)
    assert rel_err(end(z, pair_mask), ref) < 1e-12


@pytest.mark.parametrize("starting", [True, False])
def test_triangle_attention_output_bias_in_the_residual_op(starting):
    """The pair stack leaves linear_o's bias out of the update and hands it to the residual
    op (``out_bias=False``): the same sum and the same gradients, the bias's included."""
    from fold_model.layers.primitives import dropout_residual

    _, z, _, pair_mask = _inputs(3, torch.float64)
    cls = TriangleAttentionStartingNode if starting else TriangleAttentionEndingNode
    att = _as64(cls(C_Z, 4, 3))
    z = z.requires_grad_()
    dy = torch.randn(z.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    outs = []
    for out_bias in (True, False):
        update, z_res = att.forward_residual(z, pair_mask, out_bias=out_bias)
        bias = None if out_bias else att.out_bias
        y = dropout_residual(update, z_res, 0.0, -3, False, bias)
        outs.append((y, *torch.autograd.grad(y, (z, att.out_bias, att.mha.linear_o.weight), dy)))
    for a, b in zip(*outs, strict=True):
        assert rel_err(a, b) < 1e-12
    assert outs[0][2].abs().sum() > 0  # the bias's gradient is not trivially zero


def test_msa_attention_alg7_alg8_and_transition():
    m, z, msa_mask, _ = _inputs(3, torch.float64)
    row = _as64(MSARowAttentionWithPairBias(C_M, C_Z, 4, 2))
    bias = row.linear_z(row.layer_norm_z(z)).permute(0, 3, 1, 2)
    ref = _attn64(row.mha, row.layer_norm_m(m), msa_mask, bias)
    assert rel_err(row(m, z, msa_mask), ref) < 1e-12

    col = _as64(MSAColumnAttention(C_M, 4, 2))
    mt = col.layer_norm_m(m.transpose(1, 2))
    ref = _attn64(col.mha, mt, msa_mask.transpose(1, 2), None).transpose(1, 2)
    assert rel_err(col(m, msa_mask), ref) < 1e-12

    tr = _as64(MSATransition(C_M, 4))
    ref = tr.linear_2(torch.relu(tr.linear_1(tr.layer_norm(m))))
    assert rel_err(tr(m), ref) < 1e-12


def _block(order, seed=0):
    return randomize_(make_block(config("tiny").evoformer, C_M, C_Z, order), seed)


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
def test_block_orders_fp32_vs_fp64(order):
    block = _block(order).eval()
    block64 = _block(order).double().eval()
    m, z, msa_mask, pair_mask = _inputs(4)
    m_out, z_out = block(m, z, msa_mask, pair_mask)
    m_ref, z_ref = block64(m.double(), z.double(), msa_mask.double(), pair_mask.double())
    assert m_out.shape == m.shape and z_out.shape == z.shape
    assert rel_err(m_out, m_ref) < 1e-5 and rel_err(z_out, z_ref) < 1e-5


def test_block_orders_compose_differently():
    m, z, msa_mask, pair_mask = _inputs(5)
    outs = {o: _block(o).eval()(m, z, msa_mask, pair_mask) for o in ("af2", "multimer", "parallel")}
    af2 = outs["af2"]
    blk = _block("af2").eval()
    # af2: the pair stack sees z + OPM(m after the MSA stack).
    m_col, z_out = blk._msa_stack(m, z, msa_mask)
    assert torch.equal(z_out, z)  # the pair passed on by the row attention's LayerNorm
    z_ref = blk._pair_stack(z + blk.outer_product_mean(m_col, msa_mask), pair_mask)
    assert rel_err(af2[1], z_ref) < 1e-6 and rel_err(af2[0], m_col) < 1e-6
    # multimer: OPM of the input MSA first; the MSA stack sees the updated pair.
    z1 = z + blk.outer_product_mean(m, msa_mask)
    m_ref = blk._msa_stack(m, z1, msa_mask)[0]
    assert rel_err(outs["multimer"][0], m_ref) < 1e-6
    assert rel_err(outs["multimer"][1], blk._pair_stack(z1, pair_mask)) < 1e-6
    # parallel: both branches read the block inputs; OPM of the new MSA joins at the end.
    m_par = blk._msa_stack(m, z, msa_mask)[0]
    z_par = blk._pair_stack(z, pair_mask) + blk.outer_product_mean(m_par, msa_mask)
    assert rel_err(outs["parallel"][0], m_par) < 1e-6
    assert rel_err(outs["parallel"][1], z_par) < 1e-6
    assert rel_err(outs["parallel"][1], af2[1]) > 1e-3  # the orders really differ


def test_parallel_branch_seam_independence():
    block = _block("parallel").eval()
    assert isinstance(block, ParallelEvoformerBlock)
    m, z, msa_mask, pair_mask = _inputs(6)
    m.requires_grad_()
    z_new = block.pair_branch(z, pair_mask)
    m_new = block.msa_branch(m, z, msa_mask)
    # The pair branch reads nothing of the MSA.
    assert torch.autograd.grad(z_new.sum(), m, allow_unused=True)[0] is None
    assert torch.autograd.grad(m_new.sum(), m, retain_graph=True)[0] is not None
    dz = block.outer_product_update(m_new, msa_mask)
    joined = block.join(m_new, z_new, msa_mask, dz)
    full = block(m, z, msa_mask, pair_mask)
    assert torch.equal(joined[0], full[0]) and torch.equal(joined[1], full[1])


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
def test_padding_does_not_leak(order):
    """Changing the features of padded residues leaves every real position unchanged."""
    block = _block(order).eval()
    m, z, msa_mask, pair_mask = _inputs(7)
    seq = pair_mask.diagonal(dim1=1, dim2=2)  # [B, N]
    pad = seq == 0
    assert pad.any()
    m2 = m.clone()
    z2 = z.clone()
    m2[pad[:, None, :].expand(B, S, N)] += 5.0
    z2[pad[:, :, None].expand(B, N, N) | pad[:, None, :].expand(B, N, N)] -= 3.0
    out1 = block(m, z, msa_mask, pair_mask)
    out2 = block(m2, z2, msa_mask, pair_mask)
    real_m = msa_mask.bool()
    real_z = pair_mask.bool()
    assert rel_err(out2[0][real_m], out1[0][real_m]) < 1e-6
    assert rel_err(out2[1][real_z], out1[1][real_z]) < 1e-6


def test_dropout_is_shared_and_seeded():
    block = _block("af2").train()
    m, z, msa_mask, pair_mask = _inputs(8)
    torch.manual_seed(0)
    a = block(m, z, msa_mask, pair_mask)
    torch.manual_seed(0)
    b = block(m, z, msa_mask, pair_mask)
    c = block.eval()(m, z, msa_mask, pair_mask)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert rel_err(a[1], c[1]) > 1e-3


def test_stack_shapes_and_gradients():
    cfg = config("tiny").evoformer
    stack = randomize_(EvoformerStack(cfg, "af2"))
    m, z, msa_mask, pair_mask = _inputs(9)
    m_out, z_out, s = stack(m, z, msa_mask, pair_mask)
    assert m_out.shape == m.shape and z_out.shape == z.shape and s.shape == (B, N, cfg.c_s)
    (m_out.square().mean() + z_out.square().mean() + s.square().mean()).backward()
    for n, p in stack.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_block_rejects_unknown_order():
    with pytest.raises(ValueError, match="order"):
        make_block(config("tiny").evoformer, C_M, C_Z, "sideways")
    with pytest.raises(ValueError, match="order"):
        EvoformerBlock(C_M, C_Z, 4, 2, 6, 10, 4, 3, 2, 0.15, 0.25, order="parallel")
