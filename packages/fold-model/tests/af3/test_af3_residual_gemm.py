"""The pair transition's residual added by its output GEMM in inference
(:mod:`fold_model.layers.residual_gemm`): the same sums as ``x + transition(x)``, written into the
block's own stream, never into the caller's tensor, and only where no autograd is recorded."""

from __future__ import annotations

import copy

import pytest
import torch
from _af3_helpers import holes, randomize_, rel_err
from fold_model.af3.config import config
from fold_model.af3.pairformer import PairformerStack
from fold_model.layers import SwiGLUTransition
from fold_model.layers import transitions as transitions_module
from fold_model.layers.residual_gemm import add_matmul_, residual_gemm

CFG = config("tiny")
C_S, C_Z = CFG.c_s, CFG.c_z


def _exact(x, h, w):
    return x.double() + h.double() @ w.double().T


def test_add_matmul_float64_in_place():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    h = torch.randn(3, 5, 11, generator=g, dtype=torch.float64)
    w = torch.randn(7, 11, generator=g, dtype=torch.float64)
    ref = _exact(x, h, w)
    ptr = x.data_ptr()
    out = add_matmul_(x, h, w)
    assert out is x and x.data_ptr() == ptr
    assert rel_err(x, ref) < 1e-14


def test_add_matmul_under_autocast_fp32_stream():
    """fp32 x, fp32 weight under bf16 autocast (the predictor's setting): the product in bf16
    (as F.linear's under autocast), the sum in fp32, within bf16 error of the exact sum."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 16, generator=g)
    h = torch.randn(37, 24, generator=g).to(torch.bfloat16)  # swiglu's output under autocast
    w = torch.randn(16, 24, generator=g) * 24 ** -0.5
    ref = _exact(x, h, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        add_matmul_(x, h, w)
    assert x.dtype == torch.float32 and torch.isfinite(x).all()
    assert rel_err(x, ref) < 1e-2


def test_swiglu_add_into_equals_the_residual():
    t = randomize_(SwiGLUTransition(C_Z, 3)).double().eval()
    x = torch.randn(2, 5, 3, C_Z, dtype=torch.float64)
    with torch.no_grad():
        ref = x + t(x)
        got = t.add_into(x.clone())
    assert rel_err(got, ref) < 1e-13


def _stack() -> PairformerStack:
    cfg = copy.deepcopy(CFG.pairformer)
    return randomize_(PairformerStack(cfg, C_S, C_Z), scale=0.5).double().eval()


def _inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n, C_S, generator=g, dtype=torch.float64)
    z = torch.randn(2, n, n, C_Z, generator=g, dtype=torch.float64)
    mask = holes((2, n), seed=seed).double()
    return s, z, mask, mask[:, :, None] * mask[:, None, :]


def test_stack_inference_equals_two_ops_and_keeps_callers_tensors(monkeypatch):
    """The Pairformer in inference (the GEMM adds into the stream) gives the sums of the two-op
    path to fp64 rounding; the caller's s and z are left as they were."""
    stack = _stack()
    s, z, m, pm = _inputs(7, seed=3)
    s0, z0 = s.clone(), z.clone()
    calls = []
    real = add_matmul_

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(transitions_module, "add_matmul_", spy)
    with torch.no_grad():
        got = stack(s, z, m, pm)
    assert len(calls) == 2 * len(stack.blocks)  # the pair and the single transition per block
    assert torch.equal(s, s0) and torch.equal(z, z0)
    monkeypatch.setenv("FOLD_RESIDUAL_GEMM", "0")
    with torch.no_grad():
        ref = stack(s, z, m, pm)
    assert len(calls) == 2 * len(stack.blocks)  # switched off: the two ops
    assert rel_err(got[0], ref[0]) < 1e-12 and rel_err(got[1], ref[1]) < 1e-12


def test_msa_module_inference_equals_two_ops(monkeypatch):
    """The AF3 MSA module's MSA and pair transitions add into their own streams in inference:
    the two-op sums to fp64 rounding, the caller's pair and MSA features untouched."""
    from test_af3_msa_template import _module, _msa_inputs

    mod = _module(blocks=2)
    args = _msa_inputs(seed=5)
    before = [a.clone() for a in args]
    calls = []
    real = add_matmul_
    monkeypatch.setattr(transitions_module, "add_matmul_",
                        lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        got = mod(*args)
    # the first block's MSA transition and both blocks' pair transitions (the last block
    # updates the pair only)
    assert len(calls) == 3
    assert all(torch.equal(a, b) for a, b in zip(args, before, strict=True))
    monkeypatch.setenv("FOLD_RESIDUAL_GEMM", "0")
    with torch.no_grad():
        ref = mod(*args)
    assert len(calls) == 3 and rel_err(got, ref) < 1e-12


def test_inference_blocks_trace_with_fx():
    """Traced under no_grad in eval mode (as AutoChunk traces a stack), the blocks take the two
    ops: the guard asks about tracing before it reads the (proxy) stream's layout."""
    from fold_model.af3.msa_module import MSAModule
    from fold_model.af3.pairformer import PairformerBlock

    block = randomize_(PairformerBlock(C_S, C_Z, 9, 4, 2, 3, 2, dropout=0.0),
                       scale=0.5).double().eval()
    s, z, m, pm = _inputs(6, seed=5)
    with torch.no_grad():
        gm = torch.fx.symbolic_trace(block)
        ref, got = block(s, z, m, pm), gm(s, z, m, pm)
    assert rel_err(got[0], ref[0]) < 1e-12 and rel_err(got[1], ref[1]) < 1e-12
    from test_af3_msa_template import _module, _msa_inputs

    mod: MSAModule = _module(blocks=2)
    args = _msa_inputs(seed=6)
    with torch.no_grad():
        gm = torch.fx.symbolic_trace(mod)
        assert rel_err(gm(*args), mod(*args)) < 1e-12


def test_not_under_autograd_training_or_for_views():
    x = torch.randn(4, 6, 8)
    with torch.no_grad():
        assert residual_gemm(x, training=False)
        assert not residual_gemm(x, training=True)
        assert not residual_gemm(x.transpose(0, 1), training=False)  # not one dense tensor
    assert not residual_gemm(x, training=False)  # autograd on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLAS's fp32-C GEMM needs CUDA")
def test_add_matmul_cuda_fp32_accumulator():
    """On CUDA an fp32 x adds the GEMM's fp32 accumulator (``addmm(out_dtype=float32)``): at
    fp32 accuracy of the exact sum, where the two ops add the bf16-rounded update."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1000, 128, generator=g).cuda()
    h = torch.randn(1000, 512, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(128, 512, generator=g) * 512 ** -0.5).cuda()
    ref = _exact(x, h, w.to(torch.bfloat16))
    two = x + (h @ w.to(torch.bfloat16).T)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        add_matmul_(x, h, w)
    assert x.dtype == torch.float32
    assert rel_err(x, ref) < 1e-5
    assert rel_err(x, ref) <= rel_err(two, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fp32-C GEMM is CUDA's")
def test_add_matmul_falls_back_where_the_fp32_c_gemm_is_refused(monkeypatch):
    """A BLAS without the fp32-C GEMM (addmm refusing out_dtype): the bf16 update is added in
    place instead, and the refusal is remembered for the device."""
    from fold_model.layers import residual_gemm as rg

    real = torch.addmm

    def refuse(*args, **kwargs):
        if "out_dtype" in kwargs:
            raise RuntimeError("addmm: out_dtype is not supported here")
        return real(*args, **kwargs)

    monkeypatch.setattr(rg.torch, "addmm", refuse)
    monkeypatch.setattr(rg, "_FP32_C", {})
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 16, generator=g).cuda()
    h = torch.randn(64, 24, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(16, 24, generator=g) * 24 ** -0.5).cuda()
    ref = _exact(x, h, w.to(torch.bfloat16))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        add_matmul_(x, h, w)
    assert rg._FP32_C == {x.device: False}
    assert rel_err(x, ref) < 1e-2
