"""Every kernel on a CUDA GPU with tensors just past 2**31 elements (issue 23), vs references.

A 4608-residue pair tensor ``[N, N, 128]`` has 2.7e9 elements: an offset computed in int32
wraps past 2**31. Each test runs one op family in bf16 on an input of 2.15e9-3.2e9 elements
(under ~22 GB of GPU memory each) and compares slices whose offsets lie past 2**31 (the last
rows, the last batch entry or channel) and the first ones with the float64 reference on those
slices; a reduction over the whole input (a bias or weight gradient, a norm) is compared with
the reference computed in chunks. Tolerances are the kernels' CPU tests' (bf16: one rounding
of the output, eps 3.9e-3, plus the inputs' own: 1.5e-2; attention, whose P and dS are
rounded again before two more products: 2.5e-2); fp32 sums over 2**24 rows in another order:
1e-3.

The last test checks PyTorch's own GEMMs (cuBLAS) at the pair sizes of triangle
multiplication, to tell a fold kernel's failure from one outside fold.

Run on a GPU: ``python -m pytest -c pytest.ini --rootdir . -q -m gpu
packages/fold-kernels/tests/test_large_offsets_gpu.py`` (2-4 minutes on an H100, most of it
Triton compiling; the CPU interpreter's tests of the same offsets are test_large_offsets.py).
"""

from __future__ import annotations

import fold_kernels as fk
import pytest
import torch
from fold_kernels.reduce import column_sum, sum_partials
from fold_kernels.reference import adam_ema_step
from fold_ops import reference as ref

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
BF16 = torch.bfloat16
C = 128
ROWS = 2**24 + 8192  # [ROWS, C] has 2**31 + 2**20 elements; rows from 2**24 start past 2**31
EDGES = (slice(0, 4096), slice(ROWS - 4096, ROWS))
TOL = 1.5e-2
TOL_ATTENTION = 2.5e-2
TOL_SUM = 1e-3
CHUNK = 2**21  # rows per chunk of a chunked reference


@pytest.fixture(autouse=True)
def _release_memory():
    yield
    torch.cuda.empty_cache()  # one test's ~20 GB gone before the next allocates


def _randn(*shape, seed, dtype=BF16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(shape, generator=g, device=DEV, dtype=dtype)


def _holes(*shape, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.rand(shape, generator=g, device=DEV) > 0.3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all(), "NaN/inf in the kernel's result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy that takes gradients (a reference input)."""
    return t.detach().double().requires_grad_()


def test_layer_norm():
    x = _randn(ROWS, C, seed=1).requires_grad_()
    w, b = _randn(C, seed=2).requires_grad_(), _randn(C, seed=3).requires_grad_()
    y = fk.layer_norm(x, w, b)
    dy = _randn(ROWS, C, seed=4)
    y.backward(dy)
    for rows in EDGES:
        xs = _leaf(x[rows])
        ys = ref.layer_norm(xs, w.detach().double(), b.detach().double())
        ys.backward(dy[rows].double())
        assert rel_err(y[rows], ys) < TOL
        assert rel_err(x.grad[rows], xs.grad) < TOL
    dw = torch.zeros(C, device=DEV, dtype=torch.float64)
    db = torch.zeros_like(dw)
    for i in range(0, ROWS, CHUNK):  # dweight = sum dy * xhat, dbias = sum dy (fp32 chunks)
        xc, dyc = x.detach()[i:i + CHUNK].float(), dy[i:i + CHUNK].float()
        var, mean = torch.var_mean(xc, -1, unbiased=False, keepdim=True)
        dw += (dyc * (xc - mean) * torch.rsqrt(var + 1e-5)).sum(0).double()
        db += dyc.sum(0).double()
    assert rel_err(w.grad, dw) < TOL and rel_err(b.grad, db) < TOL


def test_layer_norm_channel_first_product():
    """Issue 23's failure: triangle multiplication's ``layer_norm_out(x.movedim(-3, -1))``
    reads the channel-first product ``[c, N, N]`` through its strides; channel 127 starts at
    127 * N * N elements, past 2**31 from N = 4113 (4096 ran, 4608 gave non-finite output).
    N = 4160 here, unchunked; forward, and the backward's x and dx (in x's layout)."""
    n = 4160
    x_cf = _randn(C, n, n, seed=48).requires_grad_()  # [c, N_i, N_j]: 2.2e9 elements
    w, b = _randn(C, seed=49).requires_grad_(), _randn(C, seed=50).requires_grad_()
    y = fk.layer_norm(x_cf.movedim(0, -1), w, b)  # [N_i, N_j, c]
    dy = _randn(n, n, C, seed=51)
    y.backward(dy)
    for i in (0, n - 1):
        xs = _leaf(x_cf[:, i].t())  # [N_j, c]
        ys = ref.layer_norm(xs, w.detach().double(), b.detach().double())
        ys.backward(dy[i].double())
        assert rel_err(y[i], ys) < TOL
        assert rel_err(x_cf.grad[:, i].t(), xs.grad) < TOL
    dw = torch.zeros(C, device=DEV, dtype=torch.float64)
    db = torch.zeros_like(dw)
    for i in range(0, n, 256):
        xc, dyc = x_cf.detach()[:, i:i + 256].movedim(0, -1).float(), dy[i:i + 256].float()
        var, mean = torch.var_mean(xc, -1, unbiased=False, keepdim=True)
        dw += (dyc * (xc - mean) * torch.rsqrt(var + 1e-5)).sum((0, 1)).double()
        db += dyc.sum((0, 1)).double()
    assert rel_err(w.grad, dw) < TOL and rel_err(b.grad, db) < TOL


def test_softmax_mask_bias():
    r, h, n = 129, 4, 2048  # logits [R, H, N, N]: 2.16e9 elements; row 128 starts past 2**31
    logits = _randn(r, h, n, n, seed=5)
    bias = _randn(h, n, n, seed=6).requires_grad_()
    mask = _holes(r, 1, 1, n, seed=7)
    p = fk.softmax_mask_bias(logits, mask, bias)
    for i in (0, r - 1):
        want = ref.softmax_mask_bias(logits[i].double(), mask[i], bias.detach().double())
        assert rel_err(p[i], want) < TOL
    dp = _randn(r, h, n, n, seed=8)
    dbias = torch.zeros(h, n, n, device=DEV, dtype=torch.float64)
    for i in range(0, r, 8):  # the bias gradient sums every row: reference in fp32 chunks
        bs = bias.detach().float().requires_grad_()
        ref.softmax_mask_bias(logits[i:i + 8].float(), mask[i:i + 8], bs).backward(
            dp[i:i + 8].float())
        dbias += bs.grad.double()
    del logits  # not saved by the op: room for its fp32 backward buffer
    p.backward(dp)
    assert rel_err(bias.grad, dbias) < TOL


def test_gating():
    """bias_sigmoid_gate and bias_dropout_residual; dY is the output itself (no sixth
    pair-sized tensor)."""
    x = _randn(ROWS, C, seed=9).requires_grad_()
    g = _randn(ROWS, C, seed=10).requires_grad_()
    bias = _randn(C, seed=11).requires_grad_()
    y = fk.bias_sigmoid_gate(x, g, bias)
    y.backward(y.detach())
    dbias = torch.zeros(C, device=DEV, dtype=torch.float64)
    for i in range(0, ROWS, CHUNK):  # d(gate) = dY x sig'(gate + bias), summed over rows
        xs, gs, dys = (t.detach()[i:i + CHUNK].float() for t in (x, g, y))
        sig = torch.sigmoid(gs + bias.detach().float())
        dbias += (dys * xs * sig * (1 - sig)).sum(0).double()
    assert rel_err(bias.grad, dbias) < TOL
    for rows in EDGES:
        xs, gs, bs = _leaf(x[rows]), _leaf(g[rows]), _leaf(bias)
        ys = ref.bias_sigmoid_gate(xs, gs, bs)
        ys.backward(y.detach()[rows].double())
        assert rel_err(y[rows], ys) < TOL
        assert rel_err(x.grad[rows], xs.grad) < TOL and rel_err(g.grad[rows], gs.grad) < TOL
    del x, g, y

    x = _randn(ROWS, C, seed=12).requires_grad_()
    res = _randn(ROWS, C, seed=13).requires_grad_()
    keep = (_holes(1, C, seed=14) / 0.7).to(BF16)  # a dropout mask shared by the rows
    y = fk.bias_dropout_residual(x, res, bias.detach(), keep)
    y.backward(y.detach())
    for rows in EDGES:
        xs, rs = _leaf(x[rows]), _leaf(res[rows])
        ys = ref.bias_dropout_residual(xs, rs, bias.detach().double(), keep.double())
        ys.backward(y.detach()[rows].double())
        assert rel_err(y[rows], ys) < TOL
        assert rel_err(x.grad[rows], xs.grad) < TOL and rel_err(res.grad[rows], rs.grad) < TOL


def test_column_sum():
    """Contiguous ``[ROWS, C]`` and the transposed view of ``[C, ROWS]`` (column 127 starts at
    2.1e9 elements)."""
    x = _randn(ROWS, C, seed=15)
    want = sum(x[i:i + CHUNK].double().sum(0) for i in range(0, ROWS, CHUNK))
    assert rel_err(column_sum(x, torch.float32), want) < TOL_SUM
    xt = x.view(C, ROWS)
    want = sum(xt[:, i:i + CHUNK].double().sum(1) for i in range(0, ROWS, CHUNK))
    assert rel_err(column_sum(xt.t(), torch.float32), want) < TOL_SUM


def test_sum_partials():
    """One fp32 partial row of 2**31 + 2**20 (an EvoAttention bias gradient of 2.1e9 entries)
    stored as bf16: the sum of one row is the row, rounded to bf16 (within one bf16 step,
    2**-7 relative, whatever the rounding mode; a misplaced column is off by about 1)."""
    m = 2**31 + 2**20
    partials = _randn(1, m, seed=16, dtype=torch.float32)
    out = sum_partials(partials, BF16)
    for cols in (slice(0, 2**20), slice(m - 2**20, m)):
        torch.testing.assert_close(out[cols].float(), partials[0, cols], rtol=2**-7, atol=0)


def test_evo_attention_packed():
    """Triangle attention's shape: proj ``[R, N, 4*H*D]`` of 2.15e9 elements, pair bias and key
    mask; the last row's projection starts past 2**31."""
    r, n, h, d = 2049, 2048, 4, 32
    proj = _randn(r, n, 4 * h * d, seed=17).requires_grad_()
    bias = _randn(h, n, n, seed=18).requires_grad_()
    mask = _holes(r, n, seed=19)
    gate_bias = _randn(h * d, seed=20).requires_grad_()
    o = fk.evo_attention_packed(proj, h, bias, mask, gate_bias=gate_bias)
    dy = _randn(r, n, h * d, seed=21)
    o.backward(dy)
    for i in (0, r - 1):  # rows are independent: output and projection gradient per row
        ps = _leaf(proj[i:i + 1])
        want = ref.attention_packed(ps, h, bias.detach().double(), mask[i:i + 1], d**-0.5,
                                    gate_bias.detach().double())
        want.backward(dy[i:i + 1].double())
        assert rel_err(o[i:i + 1], want) < TOL_ATTENTION
        assert rel_err(proj.grad[i:i + 1], ps.grad) < TOL_ATTENTION
    dbias = torch.zeros(h, n, n, device=DEV, dtype=torch.float64)
    dgate_bias = torch.zeros(h * d, device=DEV, dtype=torch.float64)
    for i in range(0, r, 16):  # the bias gradients sum every row: reference in fp32 chunks
        bs, gs = (t.detach().float().requires_grad_() for t in (bias, gate_bias))
        out = ref.attention_packed(proj.detach()[i:i + 16].float(), h, bs, mask[i:i + 16],
                                   d**-0.5, gs)
        out.backward(dy[i:i + 16].float())
        dbias += bs.grad.double()
        dgate_bias += gs.grad.double()
    assert rel_err(bias.grad, dbias) < TOL_ATTENTION
    assert rel_err(gate_bias.grad, dgate_bias) < TOL_ATTENTION


def test_evo_attention_batched_bias():
    """A bias per batch entry ``[B=3, H=64, N, N]`` (3.2e9 elements, 6.5 GB): entry 2 starts at
    2.15e9, so ``b * stride`` passes 2**31 in the forward, dK/dV and dQ bias tiles."""
    b, h, n, d = 3, 64, 4100, 16
    q, k, v = (_randn(b, 1, h, n, d, seed=s).requires_grad_() for s in (22, 23, 24))
    bias = _randn(b, h, n, n, seed=25)
    mask = _holes(b, 1, n, seed=26)
    o = fk.evo_attention(q, k, v, bias, mask)
    do = _randn(b, 1, h, n, d, seed=27)
    o.backward(do)
    for hh in (0, h - 1):  # batch entry 2, first and last head
        sl = (slice(2, 3), slice(None), slice(hh, hh + 1))
        qs, ks, vs = (_leaf(t[sl]) for t in (q, k, v))
        want = ref.attention(qs, ks, vs, bias[2:3, hh:hh + 1].double(), mask[2:3], d**-0.5)
        want.backward(do[sl].double())
        assert rel_err(o[sl], want) < TOL_ATTENTION
        for t, ts in ((q, qs), (k, ks), (v, vs)):
            assert rel_err(t.grad[sl], ts.grad) < TOL_ATTENTION


def test_triangle_projection_gate():
    c, n = 128, 2049  # proj [1, 4c, N, N]: 2.15e9 elements; the last channels past 2**31
    proj = _randn(1, 4 * c, n, n, seed=28).requires_grad_()
    bias = _randn(4 * c, seed=29).requires_grad_()
    mask = _holes(1, n, n, seed=30)
    a, b = fk.triangle_projection_gate(proj, bias, mask)
    da, db = _randn(1, c, n, n, seed=31), _randn(1, c, n, n, seed=32)
    torch.autograd.backward((a, b), (da, db))
    dbias = torch.zeros(4 * c, device=DEV, dtype=torch.float64)
    for ch0 in range(0, c, 16):  # channels ch of a and b read proj rows ch, c+ch, 2c+ch, 3c+ch
        idx = torch.cat([torch.arange(ch0, ch0 + 16) + k * c for k in range(4)]).to(DEV)
        ps, bs = proj.detach()[:, idx].float(), bias.detach()[idx].float().requires_grad_()
        ra, rb = ref.triangle_projection_gate(ps, bs, mask)
        torch.autograd.backward((ra, rb), (da[:, ch0:ch0 + 16].float(),
                                           db[:, ch0:ch0 + 16].float()))
        dbias[idx] = bs.grad.double()
    assert rel_err(bias.grad, dbias) < TOL
    for ch in (0, c - 1):
        idx = [ch, c + ch, 2 * c + ch, 3 * c + ch]
        ps = _leaf(proj[:, idx])
        ra, rb = ref.triangle_projection_gate(ps, bias.detach()[idx].double(), mask)
        torch.autograd.backward((ra, rb), (da[:, ch:ch + 1].double(), db[:, ch:ch + 1].double()))
        assert rel_err(a[:, ch:ch + 1], ra) < TOL and rel_err(b[:, ch:ch + 1], rb) < TOL
        assert rel_err(proj.grad[:, idx], ps.grad) < TOL


def test_layer_norm_linear_and_swiglu():
    """Forward of LN+Linear (its backward is LayerNorm's kernels, cuBLAS and column_sum, all
    tested above); SwiGLU forward and backward (the bias gradient sums 2**24 rows)."""
    x = _randn(ROWS, C, seed=33)
    lw, lb = _randn(C, seed=34), _randn(C, seed=35)
    w = _randn(C, C, seed=36) * C**-0.5
    y = fk.layer_norm_linear(x, lw, lb, w, _randn(C, seed=37))
    for rows in EDGES:
        want = ref.layer_norm_linear(x[rows].double(), lw.double(), lb.double(), w.double(),
                                     _randn(C, seed=37).double())
        assert rel_err(y[rows], want) < TOL
    del y

    x.requires_grad_()
    w2 = (_randn(2 * C, C, seed=38) * C**-0.5).requires_grad_()
    b2 = _randn(2 * C, seed=39).requires_grad_()
    y = fk.swiglu(x, w2, b2)
    y.backward(y.detach())
    for rows in EDGES:
        xs = _leaf(x[rows])
        want = ref.swiglu(xs, w2.detach().double(), b2.detach().double())
        want.backward(y.detach()[rows].double())
        assert rel_err(y[rows], want) < TOL and rel_err(x.grad[rows], xs.grad) < TOL
    dbias = torch.zeros(2 * C, device=DEV, dtype=torch.float64)
    for i in range(0, ROWS, CHUNK):
        bs = b2.detach().float().requires_grad_()
        ref.swiglu(x.detach()[i:i + CHUNK].float(), w2.detach().float(), bs).backward(
            y.detach()[i:i + CHUNK].float())
        dbias += bs.grad.double()
    assert rel_err(b2.grad, dbias) < TOL


def test_fused_adam_and_grad_norm():
    """Flat buffers of 2**31 + 2**20: fp32 parameters (so the update is not lost to bf16
    rounding), bf16 gradient and moments; the ends compared with the reference step."""
    n = 2**31 + 2**20
    param = _randn(n, seed=40, dtype=torch.float32)
    grad = _randn(n, seed=41)
    exp_avg, exp_avg_sq = torch.zeros(n, device=DEV, dtype=BF16), torch.zeros(n, device=DEV,
                                                                              dtype=BF16)
    ends = (slice(0, 2**20), slice(n - 2**20, n))
    before = [(param[s].clone(), grad[s].float()) for s in ends]
    want = sum((grad[i:i + 2**28].float() ** 2).sum().double() for i in range(0, n, 2**28))
    assert rel_err(fk.global_grad_norm(grad), want.sqrt()) < TOL_SUM
    fk.fused_adam_ema_(param, grad, exp_avg, exp_avg_sq, step=1, lr=1e-2)
    for s, (p0, g0) in zip(ends, before):
        p, m, v = p0.clone(), torch.zeros_like(g0), torch.zeros_like(g0)
        adam_ema_step(p, g0, m, v, None, step=1, lr=1e-2)
        assert rel_err(param[s] - p0, p - p0) < 1e-4  # the update, fp32 throughout
        assert rel_err(exp_avg[s], m) < TOL and rel_err(exp_avg_sq[s], v) < TOL


def test_torch_gemms_at_pair_sizes():
    """Not fold's kernels: cuBLAS through PyTorch at triangle multiplication's sizes (N 4100,
    c 128: every operand 2.15e9 elements), ``linear_channel_first`` (the projections) and the
    batched product over k, and a linear layer whose output passes 2**31 elements (the pair
    transition's). If the kernels' tests pass and a long input still fails, these are the next
    suspects."""
    n = 4100
    x = _randn(1, n, n, C, seed=42).requires_grad_()
    w = _randn(C, C, seed=43) * C**-0.5
    y = fk.linear_channel_first(x, w)  # [1, C, N, N]
    for i in (0, n - 1):
        want = torch.einsum("oc,jc->oj", w.double(), x.detach()[0, i].double())
        assert rel_err(y[0, :, i], want) < TOL
    y.backward(y.detach())
    for i in (0, n - 1):
        want = torch.einsum("oj,oc->jc", y.detach()[0, :, i].double(), w.double())
        assert rel_err(x.grad[0, i], want) < TOL
    del x, y
    a, b = _randn(C, n, n, seed=44), _randn(C, n, n, seed=45)
    out = torch.matmul(a, b.transpose(-1, -2))  # [C, N_i, N_j] = sum_k a[c, i, k] b[c, j, k]
    for ch in (0, C - 1):
        want = a[ch, -8:].double() @ b[ch].double().t()
        assert rel_err(out[ch, -8:], want) < TOL
    del a, b, out
    x = _randn(2**22 + 2048, C, seed=46)  # the pair transition's first layer: C -> 4C
    w = _randn(4 * C, C, seed=47) * C**-0.5
    y = torch.nn.functional.linear(x, w)  # [N*N, 4C]: 2.15e9 elements
    for rows in (slice(0, 8), slice(x.shape[0] - 8, x.shape[0])):
        assert rel_err(y[rows], x[rows].double() @ w.double().t()) < TOL
