"""EvoAttention's forward with its own key length (N_q != N_k: AF3's atom windows, inference)
against a float64 PyTorch reference: odd sizes, masks with holes, a fully masked row, the bias
shared by the rows and broadcast over batch dims, the gate, the model's strided head layouts,
each dtype. Tolerances by dtype: _attention_helpers.py. On CPU the kernel runs in Triton's
interpreter."""

from __future__ import annotations

import pytest
import torch
from _attention_helpers import DEVICE, TOL, rel_err
from fold_ops import reference as ref


def _inputs(batch, r, h, nq, nk, d, dtype, *, bias_lead=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, gate = (torch.randn(*batch, r, h, nq, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(*batch, r, h, nk, d, generator=g).to(dtype) for _ in range(2))
    lead = tuple(batch) if bias_lead is None else bias_lead
    bias = torch.randn(*lead, h, nq, nk, generator=g).to(dtype)
    mask = torch.rand(*batch, r, nk, generator=g) > 0.3  # holes
    mask[..., 1, :] = False  # a fully masked row: its queries average v
    return q, k, v, bias, mask, gate


def _check(q, k, v, bias, mask, gate, dtype, scale=None):
    from fold_kernels import evo_attention

    dev = [t.to(DEVICE) if t is not None else None for t in (q, k, v, bias, mask, gate)]
    with torch.no_grad():
        o = evo_attention(*dev[:5], scale=scale, gate=dev[5])
    assert o.dtype == dtype and o.shape == q.shape
    d64 = [t.double() if t is not None else None for t in (q, k, v, bias, gate)]
    o_ref = ref.attention(d64[0], d64[1], d64[2], d64[3], mask, scale=scale, gate=d64[4])
    assert rel_err(o.cpu(), o_ref) < TOL[dtype]
    return o


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("nq,nk,d", [(7, 13, 8), (20, 9, 32), (32, 48, 16), (1, 5, 8)])
def test_matches_reference(dtype, nq, nk, d):
    _check(*_inputs((2,), 3, 2, nq, nk, d, dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_key_windows(monkeypatch, dtype):
    """Key windows whose last keys are padding (each row keeps a prefix of its keys: the blocks
    inside it run without the mask, those past it are skipped), a row with nothing kept
    included: against float64, and what masking every block gives (``FOLD_EVO_KEY_RUNS=0``):
    the same bits in the interpreter, within fp32 rounding compiled (test_evo_attention's
    test_key_runs_give_the_same_bits says why)."""
    from fold_kernels import evo_attention

    q, k, v, bias, _, gate = _inputs((2,), 3, 2, 7, 45, 16, dtype)
    mask = (torch.arange(45) < torch.tensor([45, 0, 19])[:, None]).expand(2, 3, 45)
    o = _check(q, k, v, bias, mask, gate, dtype)
    monkeypatch.setenv("FOLD_EVO_KEY_RUNS", "0")
    dev = [t.to(DEVICE) for t in (q, k, v, bias, mask, gate)]
    with torch.no_grad():
        off = evo_attention(*dev[:5], gate=dev[5])
    if DEVICE == "cpu":
        assert torch.equal(o, off)
    else:
        assert rel_err(o, off) < 1e-6


def test_atom_window_layout_bias_shared_by_samples():
    """The atom transformer's call: q, gate ``[B, K, S, H, n_q, D]`` as transposed views of a
    ``[.., n_q, H*D]`` projection, k, v likewise with 4x the keys, the bias ``[B, K, H, n_q,
    n_k]`` shared by the S samples (the rows), the key mask expanded over the samples (stride
    0); the output is the merged-heads view, no copy needed for the output projection."""
    dtype, (b, kw, s, h, nq, nk, d) = torch.bfloat16, (1, 5, 3, 2, 8, 32, 16)
    g = torch.Generator().manual_seed(3)

    def heads(n):  # [B, K, S, n, H*D] -> [B, K, S, H, n, D], the model's view
        x = torch.randn(b, kw, s, n, h * d, generator=g).to(dtype)
        return x.unflatten(-1, (h, d)).transpose(-2, -3)

    q, gate, k, v = heads(nq), heads(nq), heads(nk), heads(nk)
    bias = torch.randn(b, kw, h, nq, nk, generator=g).to(dtype)
    key_valid = torch.rand(b, kw, nk, generator=g) > 0.2
    key_valid[:, 2] = False  # a window whose keys are all masked
    mask = key_valid.unsqueeze(-2).expand(-1, -1, s, -1)  # [B, K, S, n_k]
    o = _check(q, k, v, bias, mask, gate, dtype)
    merged = o.transpose(-2, -3).flatten(-2)  # [B, K, S, n_q, H*D]: the model's next step
    assert merged.is_contiguous()


def test_bias_shared_over_batch_no_mask_no_gate_custom_scale():
    q, k, v, _, _, _ = _inputs((2, 3), 2, 3, 5, 11, 8, torch.float32)
    bias = torch.randn(3, 5, 11)  # [H, N_q, N_k]: every batch entry
    _check(q, k, v, bias, None, None, torch.float32, scale=0.3)
    _check(q, k, v, None, None, None, torch.float32)


def test_strided_keys_and_values_are_copied_to_one_layout():
    q, k, v, bias, mask, gate = _inputs((2,), 2, 2, 6, 10, 8, torch.float32)
    v_strided = torch.randn(2, 2, 2, 8, 10).transpose(-1, -2)  # D not contiguous
    _check(q, k, v_strided, bias, mask, gate, torch.float32)


def test_training_is_refused_with_the_reason():
    from fold_kernels import evo_attention

    q, k, v, bias, mask, gate = _inputs((1,), 2, 2, 4, 8, 8, torch.float32)
    q = q.to(DEVICE).requires_grad_()
    with pytest.raises(ValueError, match="inference only"):
        evo_attention(q, k.to(DEVICE), v.to(DEVICE), bias.to(DEVICE), mask.to(DEVICE))
    with torch.no_grad():  # the same call without autograd is served
        evo_attention(q, k.to(DEVICE), v.to(DEVICE), bias.to(DEVICE), mask.to(DEVICE))


@pytest.mark.parametrize("what", ["bias", "mask", "v", "gate"])
def test_bad_shapes_name_what_was_expected(what):
    from fold_kernels import evo_attention

    q, k, v, bias, mask, gate = _inputs((1,), 2, 2, 4, 8, 8, torch.float32)
    if what == "bias":
        bias = bias[..., :5]
    elif what == "mask":
        mask = mask[..., :5]
    elif what == "v":
        v = v[..., :5, :]
    else:
        gate = gate[..., :3, :]
    args = [t.to(DEVICE) for t in (q, k, v, bias, mask, gate)]
    with torch.no_grad(), pytest.raises(ValueError, match=what if what != "v" else "k and v"):
        evo_attention(*args[:5], gate=args[5])


def test_registry_serves_it_for_inference_only(monkeypatch):
    from fold_kernels import registration

    monkeypatch.setattr(registration, "_on_gpu", lambda *t: True)  # CPU: interpreter
    q, k, v, bias, mask, gate = _inputs((1,), 2, 2, 4, 8, 8, torch.float32)
    with torch.no_grad():
        assert registration.supports_attention(q, k, v, bias, mask, None, gate)
        assert not registration.supports_attention(q, k, v, bias[..., :5], mask, None, gate)
        assert not registration.supports_attention(q, k, v, bias, mask[..., :5], None, gate)
    with torch.no_grad():
        monkeypatch.setenv("FOLD_EVO_CROSS", "0")  # left to PyTorch, for comparisons
        assert not registration.supports_attention(q, k, v, bias, mask, None, gate)
        monkeypatch.setenv("FOLD_EVO_CROSS", "1")
        assert registration.supports_attention(q, k, v, bias, mask, None, gate)
    assert not registration.supports_attention(q.requires_grad_(), k, v, bias, mask, None, gate)
