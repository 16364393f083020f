"""EvoAttention vs a float64 PyTorch reference: outputs and the gradients of q, k, v, bias, gate.

On CPU every kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py).
Tolerances by dtype: see _attention_helpers.py.
"""

from __future__ import annotations

import pytest
import torch
from _attention_helpers import DEVICE, TOL, rel_err
from fold_ops import reference as ref


def _inputs(shape, h, n, dtype, *, bias_shape=None, with_gate=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, gate = (torch.randn(shape, generator=g).to(dtype) for _ in range(4))
    bias = torch.randn(bias_shape if bias_shape is not None else (*shape[:-4], h, n, n),
                       generator=g).to(dtype)
    mask = torch.rand(shape[:-3] + (n,), generator=g) > 0.25  # holes
    mask[..., 1, :] = False  # a fully masked row: its queries average v
    return q, k, v, bias, mask, (gate if with_gate else None)


def _check(q, k, v, bias, mask, gate, dtype, scale=None):
    from fold_kernels import evo_attention

    ins = [t.detach().to(DEVICE).clone().requires_grad_() if t is not None else None
           for t in (q, k, v, bias, gate)]
    qd, kd, vd, bd, gd = ins
    md = mask.to(DEVICE) if mask is not None else None
    o = evo_attention(qd, kd, vd, bd, md, scale=scale, gate=gd)
    assert o.dtype == dtype and o.shape == q.shape
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(7)).to(dtype).to(DEVICE)
    o.backward(do)

    ref_ins = [t.detach().double().requires_grad_() if t is not None else None
               for t in (q, k, v, bias, gate)]
    o_ref = ref.attention(ref_ins[0], ref_ins[1], ref_ins[2], ref_ins[3], mask, scale=scale,
                              gate=ref_ins[4])
    o_ref.backward(do.double().cpu())
    tol = TOL[dtype]
    assert rel_err(o.cpu(), o_ref) < tol
    for name, a, b in zip("q k v bias gate".split(), ins, ref_ins):
        if a is not None:
            assert a.grad is not None and a.grad.shape == a.shape, name
            assert rel_err(a.grad.cpu(), b.grad) < tol, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [8, 16, 32, 64])
def test_matches_reference_dtypes_and_head_dims(dtype, d):
    r, h, n = 3, 2, 37  # N is a multiple of no block size
    _check(*_inputs((1, r, h, n, d), h, n, dtype, seed=d), dtype)


def test_no_bias_no_mask_no_gate_msa_column():
    q, k, v, _, _, _ = _inputs((3, 2, 21, 16), 2, 21, torch.float32, with_gate=False)
    _check(q, k, v, None, None, None, torch.float32)


def test_batch_dims_and_bias_shared_over_batch_custom_scale():
    # bias [H, N, N] shared by both batch entries: its gradient sums over batch and rows
    q, k, v, _, mask, gate = _inputs((2, 3, 2, 19, 16), 2, 19, torch.float32)
    bias = torch.randn(2, 19, 19)
    _check(q, k, v, bias, mask, gate, torch.float32, scale=0.37)


@pytest.mark.parametrize("batch,bias_lead", [((1, 1), (1, 1)), ((1, 1), (1,)), ((2, 3), (2, 1)),
                                              ((2, 3), (3,)), ((1, 2), (1, 2))])
def test_bias_leading_dims_of_every_kind(batch, bias_lead):
    # the bias gradient takes the bias's own shape: more, fewer or broadcast leading dims than
    # q's batch (AF2's template pair stack: q [B, T, R, H, N, N] with a [B, 1, H, N, N] bias)
    h, n = 2, 13
    q, k, v, _, mask, gate = _inputs((*batch, 3, h, n, 8), h, n, torch.float32, seed=5)
    bias = torch.randn(*bias_lead, h, n, n, generator=torch.Generator().manual_seed(6))
    _check(q, k, v, bias, mask, gate, torch.float32)


def test_bias_with_more_leading_dims_than_q_is_rejected():
    from fold_kernels import evo_attention

    q, k, v, _, _, _ = _inputs((1, 3, 2, 13, 8), 2, 13, torch.float32, seed=5)
    with pytest.raises(ValueError, match="more dims than q's batch"):
        evo_attention(*(t.to(DEVICE) for t in (q, k, v)), torch.randn(1, 1, 2, 13, 13).to(DEVICE))


def test_per_batch_bias_and_float_mask():
    q, k, v, bias, mask, _ = _inputs((2, 2, 2, 18, 8), 2, 18, torch.float32, with_gate=False)
    _check(q, k, v, bias, mask.float(), None, torch.float32)


def test_fully_masked_query_gets_mean_of_v():
    from fold_kernels import evo_attention

    q, k, v, bias, mask, _ = _inputs((1, 3, 2, 20, 16), 2, 20, torch.float32, with_gate=False)
    bias = bias * 50  # large logits: an additive mask bias in fp32 would not be uniform
    o = evo_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), bias.to(DEVICE), mask.to(DEVICE))
    torch.testing.assert_close(o[0, 1].cpu(), v[0, 1].mean(-2, keepdim=True).expand(2, 20, 16),
                               rtol=1e-5, atol=1e-5)


def _padded_mask(batch, r, n, lengths, holes=()):
    """A padded input's key mask ``[*batch, R, N]``: row r keeps its first
    ``lengths[r % len(lengths)]`` keys; ``holes``: (row, key) pairs masked inside the runs."""
    lens = torch.tensor([lengths[i % len(lengths)] for i in range(r)])
    mask = (torch.arange(n) < lens[:, None]).expand(*batch, r, n).clone()
    for row, key in holes:
        mask[..., row, key] = False
    return mask


# (N, lengths, holes): the interpreter's tiles are 16 keys, so N 37 and 40 have three blocks
PADDED = [
    (37, (37, 33, 16, 5), ()),  # a whole row, a ragged run, exactly one block, under a block
    (40, (40, 40, 29), ((0, 20),)),  # a hole inside a long run: the blocks after it masked
    (33, (0, 33, 17), ()),  # a row with nothing kept beside a full one (two rows a program)
    (32, (32,), ()),  # all ones, N a multiple of the tiles: every block unmasked
    # padded rows (an MSA padded in depth, a token padded to its bucket): two-row programs
    # with no key kept in either row (the mean of v from V alone; dV from dO alone), one
    # beside a kept row, and the repeated last row of odd R
    (33, (0, 0, 33), ()),
    (32, (0, 0, 19), ()),
]


@pytest.mark.parametrize("n,lengths,holes", PADDED)
def test_key_runs_of_a_mask(n, lengths, holes):
    """``key_runs``: per row the leading kept keys (-1 for a row with nothing kept) and the end
    of the last kept key (N for a row with nothing kept), from a bool, a float and a broadcast
    (stride 0) mask."""
    from fold_kernels.evo_attention import _mask_operand, key_runs

    mask = _padded_mask((2,), 5, n, lengths, holes)
    mask[1, 2, -1] = True  # a kept key past a masked stretch
    want = []
    for row in mask.reshape(-1, n):
        masked = (~row).nonzero()
        kept = row.nonzero()
        lead = int(masked[0]) if len(masked) else n
        want.append((lead if len(kept) else -1, int(kept[-1]) + 1 if len(kept) else n))
    for m in (mask, mask.float()):
        view, strides = _mask_operand(m.to(DEVICE), (2,), 5, n)
        assert key_runs(view, strides, n).cpu().tolist() == [list(w) for w in want]
    shared = mask[0]  # [R, N] for both batch entries: the view's batch stride is 0
    view, strides = _mask_operand(shared.to(DEVICE), (2,), 5, n)
    assert strides[0] == 0
    assert key_runs(view, strides, n).cpu().tolist() == [list(w) for w in want[:5]] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,lengths,holes", PADDED)
@pytest.mark.parametrize("modes", [("atomic", "pass", "query"), ("pass", "atomic", "key")])
def test_padded_masks_match_reference(monkeypatch, dtype, n, lengths, holes, modes):
    """Masks of padded inputs, where the forward and dQ run the blocks inside the rows' leading
    kept run without the mask and skip those past the last kept key, and dK/dV skips key blocks
    past it: outputs and every gradient against float64 (both bias-gradient and dQ modes, both
    dK/dV tile orders; odd R, so a two-row program repeats the last row)."""
    for var, mode in zip(("FOLD_EVO_DBIAS", "FOLD_EVO_DQ", "FOLD_EVO_DKDV"), modes):
        monkeypatch.setenv(var, mode)
    q, k, v, bias, _, gate = _inputs((2, 5, 2, n, 16), 2, n, dtype, seed=n)
    _check(q, k, v, bias, _padded_mask((2,), 5, n, lengths, holes), gate, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,lengths,holes", PADDED)
def test_key_runs_give_the_same_bits(monkeypatch, request, dtype, n, lengths, holes):
    """With key runs the output and every gradient are what masking every block gives
    (``FOLD_EVO_KEY_RUNS=0``): a skipped block's keys have weight exactly 0, and an unmasked
    block's logits are the masked block's where the mask keeps them (deterministic mode: the
    bias gradient and dQ by their own passes). The same bits in the interpreter, which runs
    the same operations in both; compiled for a GPU the two loop structures may order or
    contract fp32 operations differently: on an H200, 1e-8 to 2e-7 relative in fp32 and one
    bf16 element of the bias gradient one unit apart, so there the bound is fp32 rounding.
    Rows that keep no key, where both rows of a program are such, sum v (and dV's dO) directly
    instead of as products with uniform weights: fp32 rounding there too (the uniform weight
    1/l rounded to bf16 as the walk's products round it; dQ, dK and the bias gradient exactly
    0 in both)."""
    from fold_kernels import evo_attention

    request.getfixturevalue("deterministic")
    q, k, v, bias, _, gate = _inputs((1, 5, 2, n, 16), 2, n, dtype, seed=n + 1)
    mask = _padded_mask((1,), 5, n, lengths, holes).to(DEVICE)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("FOLD_EVO_KEY_RUNS", on)
        ins = [t.to(DEVICE).clone().requires_grad_() for t in (q, k, v, bias, gate)]
        o = evo_attention(*ins[:4], mask, gate=ins[4])
        o.backward(do)
        runs[on] = [o.detach()] + [t.grad for t in ins]
    rows = [lengths[i % len(lengths)] for i in range(5)]
    # the interpreter's programs take two rows (0-1, 2-3, 4-4); a GPU's may take one
    empty_pair = any(rows[i] == 0 and rows[min(i + 1, 4)] == 0 for i in range(0, 5, 2))
    empty = empty_pair if DEVICE == "cpu" else 0 in rows
    for name, a, b in zip("o q k v bias gate".split(), runs["1"], runs["0"]):
        assert torch.isfinite(a).all(), name
        if DEVICE == "cpu" and not empty:
            assert torch.equal(a, b), name
        else:
            # bf16 with padded rows: a sum rounded apart flips an element by one unit (2^-8)
            bound = 4e-3 if empty and dtype == torch.bfloat16 else 1e-6
            assert rel_err(a, b) < bound, name


def test_packed_padded_mask_matches_reference():
    """The packed projection's path takes the same key runs (forward and backward)."""
    _check_packed((1,), 3, 37, 2, 16, torch.float32,
                  mask=_padded_mask((1,), 3, 37, (37, 20, 0)))


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("det", [False, True])
def test_auto_modes_follow_torch_determinism(monkeypatch, request, det):
    from fold_kernels.evo_attention import dbias_mode, dq_mode

    monkeypatch.delenv("FOLD_EVO_DBIAS", raising=False)
    monkeypatch.delenv("FOLD_EVO_DQ", raising=False)
    if det:
        request.getfixturevalue("deterministic")
    want = "pass" if torch.are_deterministic_algorithms_enabled() else "atomic"
    assert want == ("pass" if det else "atomic")
    assert dbias_mode() == want
    # dQ by atomics only for head dims under 16 (measured faster there, not at D 32)
    assert dq_mode(8) == want and dq_mode(32) == "pass"
    monkeypatch.setenv("FOLD_EVO_DBIAS", "pass")
    monkeypatch.setenv("FOLD_EVO_DQ", "pass")
    assert dbias_mode() == "pass" and dq_mode(8) == "pass"
    monkeypatch.setenv("FOLD_EVO_DQ", "atomic")
    assert dq_mode(8) == "atomic" and dq_mode(64) == "atomic"


@pytest.mark.parametrize("how", ["env", "torch"])
def test_backward_is_deterministic(monkeypatch, request, how):
    # FOLD_EVO_DBIAS=pass FOLD_EVO_DQ=pass, or the default under
    # torch.use_deterministic_algorithms(True): bit-identical gradients run to run
    from fold_kernels import evo_attention
    from fold_kernels.evo_attention import dbias_mode, dq_mode

    if how == "env":
        monkeypatch.setenv("FOLD_EVO_DBIAS", "pass")
        monkeypatch.setenv("FOLD_EVO_DQ", "pass")
    else:
        monkeypatch.delenv("FOLD_EVO_DBIAS", raising=False)
        monkeypatch.delenv("FOLD_EVO_DQ", raising=False)
        request.getfixturevalue("deterministic")
    assert dbias_mode() == "pass" and dq_mode(8) == "pass"
    q, k, v, bias, mask, gate = _inputs((1, 5, 2, 23, 8), 2, 23, torch.bfloat16)
    grads = []
    for _ in range(2):
        ins = [t.detach().to(DEVICE).clone().requires_grad_() for t in (q, k, v, bias)]
        o = evo_attention(*ins, mask.to(DEVICE))
        o.float().square().sum().backward()
        grads.append([t.grad.clone() for t in ins])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_bad_shapes_are_rejected():
    from fold_kernels import evo_attention

    q = torch.randn(1, 2, 2, 10, 8, device=DEVICE)
    with pytest.raises(ValueError, match="bias must be"):
        evo_attention(q, q, q, bias=torch.randn(2, 10, 9, device=DEVICE))
    with pytest.raises(ValueError, match="k and v must"):  # k's key length is not v's
        evo_attention(q, q[..., :9, :], q)
    with pytest.raises(ValueError, match="one shape"):
        evo_attention(q, q, q[..., :9, :])
    with pytest.raises(ValueError, match="dtype"):
        evo_attention(q.double(), q.double(), q.double())


def test_block_multiple_sizes_and_no_mask_with_bias():
    # N a multiple of every block size takes the select-free path (EVEN); no mask, odd R
    q, k, v, bias, _, gate = _inputs((1, 3, 2, 32, 16), 2, 32, torch.float32)
    _check(q, k, v, bias, None, gate, torch.float32)
    q, k, v, bias, mask, _ = _inputs((1, 3, 2, 32, 16), 2, 32, torch.bfloat16, with_gate=False)
    _check(q, k, v, bias, mask, None, torch.bfloat16)


def test_non_contiguous_inputs_triangle_ending_node_layout():
    # triangle attention around the ending node attends along the other axis: transposed views
    q, k, v, bias, mask, gate = _inputs((1, 20, 2, 20, 16), 2, 20, torch.float32)
    qt, kt, vt, gt = (t.transpose(1, 3) for t in (q, k, v, gate))  # [1, N, H, R, D] views
    assert not qt.is_contiguous()
    _check(qt, kt, vt, bias, mask, gt, torch.float32)


def _heads_view(x: torch.Tensor) -> torch.Tensor:
    """[*, R, H, N, D] data laid out as the model's projections do: a transposed view of a
    contiguous [*, R, N, H, D] tensor (what ``Attention._heads`` passes)."""
    return x.transpose(-2, -3).contiguous().transpose(-2, -3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_heads_layout_read_in_place(dtype):
    """q, k, v, gate as the model's transposed views: the kernel reads them through strides,
    writes o and every gradient in the same layout (so the model's transpose back is a view),
    and agrees with the fp64 reference (odd N, mask with holes and a fully masked row)."""
    from fold_kernels import evo_attention

    q, k, v, bias, mask, gate = _inputs((2, 3, 2, 19, 16), 2, 19, dtype, seed=11)
    q, k, v, gate = (_heads_view(t) for t in (q, k, v, gate))
    assert not q.is_contiguous()
    _check(q, k, v, bias, mask, gate, dtype)
    qd, kd, vd, gd = (t.detach().to(DEVICE).requires_grad_() for t in (q, k, v, gate))
    o = evo_attention(qd, kd, vd, bias.to(DEVICE), mask.to(DEVICE), gate=gd)
    assert o.stride() == qd.stride()  # o in the heads layout: o.transpose(-2, -3) is contiguous
    assert o.transpose(-2, -3).is_contiguous()
    o.backward(torch.randn_like(o).transpose(-2, -3).contiguous().transpose(-2, -3))
    for t in (qd, kd, vd, gd):
        assert t.grad.stride() == qd.stride() and torch.isfinite(t.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_last_bias_view(dtype):
    """The model's pair bias is a projection ``[*, N, N, H]`` viewed as ``[*, H, N, N]``
    (movedim): read as given (the kernel copies it to a contiguous layout once), it agrees with
    the fp64 reference in the output and every gradient, the bias's included."""
    q, k, v, bias, mask, gate = _inputs((1, 5, 3, 23, 16), 3, 23, dtype, seed=13)
    bias = bias.movedim(-3, -1).contiguous().movedim(-1, -3)
    assert bias.stride(-1) == 3
    _check(_heads_view(q), _heads_view(k), _heads_view(v), bias, mask, _heads_view(gate), dtype)


def test_mixed_and_non_dense_layouts_fall_back_to_copies():
    """k contiguous while q is a transposed view, v a strided slice (not dense), the output
    gradient a broadcast (stride 0): still equal to the reference."""
    q, k, v, bias, mask, gate = _inputs((1, 3, 2, 21, 8), 2, 21, torch.float32, seed=12)
    q = _heads_view(q)
    v_wide = torch.randn(1, 3, 2, 21, 16, generator=torch.Generator().manual_seed(3))
    v = v_wide[..., ::2]  # D stride 2
    assert v.stride(-1) == 2
    _check(q, k, v, bias, mask.float(), gate, torch.float32)
    from fold_kernels import evo_attention

    qd = q.detach().to(DEVICE).requires_grad_()
    o = evo_attention(qd, k.to(DEVICE), v.to(DEVICE), bias.to(DEVICE), mask.to(DEVICE))
    o.sum().backward()  # dO = ones expanded: stride 0 everywhere
    q64 = q.detach().double().requires_grad_()
    ref.attention(q64, k.double(), v.double(), bias.double(), mask).sum().backward()
    assert rel_err(qd.grad.cpu(), q64.grad) < TOL[torch.float32]


# ---------------------------------------------------------------- packed q | k | v | gate


def _check_packed(batch, r, n, h, d, dtype, *, gated=True, with_gate_bias=True, bias_lead=None,
                  seed=0, mask=None):
    """evo_attention_packed: the output [*, R, N, H*D] and the gradients of proj, bias and
    gate_bias vs the float64 reference (``mask``: holes and a fully masked row if None)."""
    from fold_kernels import evo_attention_packed

    parts = 4 if gated else 3
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(*batch, r, n, parts * h * d, generator=g).to(dtype)
    lead = batch if bias_lead is None else bias_lead
    bias = torch.randn(*lead, h, n, n, generator=g).to(dtype)
    if mask is None:
        mask = torch.rand(*batch, r, n, generator=g) > 0.25  # holes
        mask[..., 0, :] = False  # a fully masked row
    gate_bias = (torch.randn(h * d, generator=g) if gated and with_gate_bias else None)

    ins = [t.detach().to(DEVICE).clone().requires_grad_() if t is not None else None
           for t in (proj, bias, gate_bias)]
    o = evo_attention_packed(ins[0], h, ins[1], mask.to(DEVICE), gate_bias=ins[2], gated=gated)
    assert o.shape == (*batch, r, n, h * d) and o.dtype == dtype
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(11)).to(dtype).to(DEVICE)
    o.backward(do)

    ref_ins = [t.detach().double().requires_grad_() if t is not None else None
               for t in (proj, bias, gate_bias)]
    o_ref = ref.attention_packed(ref_ins[0], h, ref_ins[1], mask, gate_bias=ref_ins[2],
                                     gated=gated)
    o_ref.backward(do.double().cpu())
    tol = TOL[dtype]
    assert rel_err(o.cpu(), o_ref) < tol
    for name, a, b in zip(("proj", "bias", "gate_bias"), ins, ref_ins):
        if a is not None:
            assert a.grad is not None and a.grad.shape == a.shape, name
            assert rel_err(a.grad.cpu(), b.grad) < tol, name
    # the packed gradient is one dense tensor in proj's layout (no concatenation of parts)
    assert ins[0].grad.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [8, 32])
def test_packed_matches_reference(dtype, d):
    _check_packed((1,), 3, 37, 2, d, dtype, seed=d)


@pytest.mark.parametrize("d", [8, 32])
def test_atomic_buffers_zeroed_for_every_tuner_run(monkeypatch, d):
    """The backward preprocess zeroes the fp32 buffers dK/dV's atomics add the bias gradient
    and (dQ atomics) dQ into, for the first dK/dV launch; a tuner that runs the kernel again
    and again on the same buffers must find them zeroed each time (stand-in tuner: every
    candidate launched twice, then the first one for real), or the gradients would double."""
    import importlib

    from fold_kernels import tuning

    mod = importlib.import_module("fold_kernels.evo_attention")
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic")
    monkeypatch.setenv("FOLD_EVO_DQ", "atomic")
    runs = []

    def tuner(kernel, key, candidates, launch):
        for cfg in candidates[:2]:
            for _ in range(2):
                launch(cfg)
                runs.append(kernel)
        return candidates[0]

    monkeypatch.setattr(tuning, "pick", tuner)
    _check(*_inputs((1, 5, 2, 29, d), 2, 29, torch.float32, seed=d), torch.float32)
    assert any(r.startswith("evo_dkdv") for r in runs)
    assert mod.dq_mode(d) == "atomic" and mod.dbias_mode() == "atomic"


@pytest.mark.parametrize("d", [8, 32])
def test_backward_writes_every_buffer_it_allocates(monkeypatch, d):
    """Every buffer the kernels' Python allocates with ``torch.empty`` starts as NaN here: the
    atomics' fp32 buffers must be zeroed by the preprocess (no memset of their own), and no
    other buffer may be read before it is written."""
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic")
    monkeypatch.setenv("FOLD_EVO_DQ", "atomic")
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    _check(*_inputs((1, 5, 2, 29, d), 2, 29, torch.float32, seed=d + 1), torch.float32)


@pytest.mark.parametrize("path", ["preprocess", "column_sum", "no_one_pass", "no_gate_sums"])
def test_packed_gate_bias_gradient_on_each_path(monkeypatch, path):
    """The gate bias's gradient, reduced in the backward preprocess's own launch (one partial
    row per program, two levels of groups under the interpreter), or by a separate column sum
    when the counters do not fit, one-pass reductions are off or ``FOLD_KERNELS_GATE_SUMS=0``:
    each against float64, with batch dims and odd N."""
    from fold_kernels import one_pass

    if path == "column_sum":
        monkeypatch.setattr(one_pass, "SLOTS", 3)
    elif path == "no_one_pass":
        monkeypatch.setenv("FOLD_KERNELS_ONE_PASS", "0")
    elif path == "no_gate_sums":
        monkeypatch.setenv("FOLD_KERNELS_GATE_SUMS", "0")
    _check_packed((2,), 3, 37, 2, 8, torch.float32, seed=5)
    _check_packed((2,), 3, 37, 2, 8, torch.bfloat16, seed=6)


def test_packed_gate_bias_gradient_is_deterministic():
    """Two backward passes give the same bits (the partial rows are added in a fixed order,
    whichever program finishes last)."""
    from fold_kernels import evo_attention_packed

    g = torch.Generator().manual_seed(3)
    proj = torch.randn(1, 5, 29, 4 * 2 * 16, generator=g).to(DEVICE)
    gate_bias = torch.randn(2 * 16, generator=g).to(DEVICE).requires_grad_()
    grads = []
    for _ in range(2):
        o = evo_attention_packed(proj, 2, gate_bias=gate_bias)
        (dgb,) = torch.autograd.grad(o, gate_bias, torch.ones_like(o))
        grads.append(dgb)
    assert torch.isfinite(grads[0]).all()
    assert torch.equal(grads[0], grads[1])


def test_packed_without_gate_bias_and_ungated():
    _check_packed((1,), 2, 13, 3, 16, torch.float32, with_gate_bias=False, seed=1)
    _check_packed((1,), 2, 13, 3, 16, torch.float32, gated=False, seed=2)


def test_packed_batch_dims_and_shared_bias():
    # bias [1, H, N, N] shared by two batch entries: its gradient sums over batch and rows
    _check_packed((2,), 3, 19, 2, 16, torch.float32, bias_lead=(1,), seed=3)


def test_packed_equals_separate_projections():
    """The packed op is the plain op on the four parts: same output and gradients."""
    from fold_kernels import evo_attention, evo_attention_packed

    g = torch.Generator().manual_seed(5)
    r, n, h, d = 3, 21, 2, 16
    proj = torch.randn(1, r, n, 4 * h * d, generator=g).to(DEVICE).requires_grad_()
    bias = torch.randn(1, h, n, n, generator=g).to(DEVICE)
    mask = (torch.rand(1, r, n, generator=g) > 0.2).to(DEVICE)
    out = evo_attention_packed(proj, h, bias, mask)
    q, k, v, gate = (proj.detach()[..., i * h * d:(i + 1) * h * d].unflatten(-1, (h, d))
                     .transpose(-2, -3).requires_grad_() for i in range(4))
    sep = evo_attention(q, k, v, bias, mask, gate=gate).transpose(-2, -3).flatten(-2)
    assert rel_err(out, sep) < 1e-6
    dy = torch.randn(out.shape, generator=g).to(DEVICE)
    out.backward(dy)
    sep.backward(dy)
    grads = torch.cat([t.grad.transpose(-2, -3).flatten(-2) for t in (q, k, v, gate)], -1)
    assert rel_err(proj.grad, grads) < 1e-6


def test_packed_bad_input_errors():
    from fold_kernels import evo_attention_packed

    proj = torch.randn(1, 2, 5, 4 * 2 * 8, device=DEVICE)
    with pytest.raises(ValueError, match="not 4 x H=3"):
        evo_attention_packed(proj, 3)
    with pytest.raises(ValueError, match="gate_bias must be"):
        evo_attention_packed(proj, 2, gate_bias=torch.zeros(7, device=DEVICE))
    with pytest.raises(ValueError, match="bias must be"):
        evo_attention_packed(proj, 2, torch.zeros(1, 2, 5, 4, device=DEVICE))


# ----------------------------------------------------------------------------- FOLD_EVO_DBIAS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [8, 32])
@pytest.mark.parametrize("dbias", ["pass", "atomic"])
@pytest.mark.parametrize("dq", ["pass", "atomic"])
@pytest.mark.parametrize("tiles", ["query", "key"])
def test_dkdv_tiles_and_dbias_modes_match_reference(monkeypatch, dtype, d, dbias, dq, tiles):
    # dK/dV on query-major and key-major tiles, bias gradient by its own pass or by atomics,
    # dQ by its own pass or by atomics in dK/dV's pass; odd R (5): the two-row programs repeat
    # the last row, which must count once in dbias and add its dQ once
    monkeypatch.setenv("FOLD_EVO_DBIAS", dbias)
    monkeypatch.setenv("FOLD_EVO_DQ", dq)
    monkeypatch.setenv("FOLD_EVO_DKDV", tiles)
    r, h, n = 5, 2, 29
    _check(*_inputs((1, r, h, n, d), h, n, dtype, seed=11 + d), dtype)


@pytest.mark.parametrize("stagger", ["0", "1"])
@pytest.mark.parametrize("tiles", ["query", "key"])
def test_staggered_query_walk_matches_reference(monkeypatch, stagger, tiles):
    # dK/dV's programs start their walk over the query blocks at (row pair + key block) mod the
    # block count (FOLD_EVO_STAGGER=1) or at 0: N 37 gives three query blocks in the
    # interpreter (16-query tiles, the last ragged), so every start and the wrap-around occur
    monkeypatch.setenv("FOLD_EVO_STAGGER", stagger)
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic")
    monkeypatch.setenv("FOLD_EVO_DQ", "pass")  # the walk is staggered only with dQ's own pass
    monkeypatch.setenv("FOLD_EVO_DKDV", tiles)
    r, h, n = 7, 2, 37
    _check(*_inputs((1, r, h, n, 16), h, n, torch.float32, seed=21), torch.float32)


@pytest.mark.parametrize("bias_batch", ["shared", "per_batch"])
@pytest.mark.parametrize("tiles", ["query", "key"])
def test_atomic_dbias_batch_and_broadcast_bias(monkeypatch, bias_batch, tiles):
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic")
    monkeypatch.setenv("FOLD_EVO_DKDV", tiles)
    q, k, v, bias, mask, gate = _inputs((2, 3, 2, 19, 16), 2, 19, torch.float32, seed=3)
    if bias_batch == "shared":  # [H, N, N] for both batch entries: summed over b and r
        bias = torch.randn(2, 19, 19, generator=torch.Generator().manual_seed(4))
    _check(q, k, v, bias, mask, gate, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tiles", ["query", "key"])
def test_atomic_dbias_packed(monkeypatch, dtype, tiles):
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic")
    monkeypatch.setenv("FOLD_EVO_DKDV", tiles)
    _check_packed((1,), 3, 23, 2, 8, dtype)


def test_atomic_and_pass_agree(monkeypatch):
    # same function, different summation order (and tiles on a GPU): fp32 rounding apart
    from fold_kernels import evo_attention

    q, k, v, bias, mask, _ = _inputs((1, 7, 2, 26, 16), 2, 26, torch.float32, seed=9)
    grads = {}
    for mode in ("pass", "atomic"):
        monkeypatch.setenv("FOLD_EVO_DBIAS", mode)
        monkeypatch.setenv("FOLD_EVO_DQ", mode)
        ins = [t.detach().to(DEVICE).clone().requires_grad_() for t in (q, k, v, bias)]
        evo_attention(*ins, mask.to(DEVICE)).square().sum().backward()
        grads[mode] = [t.grad.cpu() for t in ins]
    for a, b in zip(grads["atomic"], grads["pass"]):
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("var", ["FOLD_EVO_DBIAS", "FOLD_EVO_DKDV", "FOLD_EVO_DQ"])
def test_unknown_modes_are_rejected(monkeypatch, var):
    from fold_kernels import evo_attention

    monkeypatch.setenv(var, "fast")
    q, k, v, bias, mask, _ = _inputs((1, 2, 2, 9, 8), 2, 9, torch.float32)
    ins = [t.to(DEVICE).requires_grad_() for t in (q, k, v, bias)]
    o = evo_attention(*ins, mask.to(DEVICE))
    with pytest.raises(ValueError, match=var):
        o.sum().backward()


@pytest.mark.parametrize("dq", ["pass", "atomic"])
def test_dq_mode_picks_the_kernels(monkeypatch, dq):
    """FOLD_EVO_DQ=atomic launches no separate dQ kernel; pass launches it (so the parametrized
    reference tests above really cover both paths)."""
    import importlib

    from fold_kernels import evo_attention

    mod = importlib.import_module("fold_kernels.evo_attention")  # the module, not the function
    launched = []

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launched.append(grid)
            return self.kernel[grid]

    monkeypatch.setattr(mod, "_bwd_dq", Spy(mod._bwd_dq))
    monkeypatch.setenv("FOLD_EVO_DQ", dq)
    q, k, v, bias, mask, _ = _inputs((1, 3, 2, 11, 8), 2, 11, torch.float32, with_gate=False)
    ins = [t.to(DEVICE).requires_grad_() for t in (q, k, v, bias)]
    evo_attention(*ins, mask.to(DEVICE)).sum().backward()
    assert bool(launched) == (dq == "pass")
    assert all(torch.isfinite(t.grad).all() for t in ins)


# ----------------------------------------------------------------------------- forward tiles


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("n", [29, 32])
def test_forward_rows_per_program_match_reference(dtype, rows, n):
    """The forward with 1 or 2 rows of R per program (each bias tile shared by them), on
    R = 5 (the last program repeats row 4), N odd (masked key tiles) or a multiple of the
    blocks (the unmasked-load path), a mask with holes and a fully masked row: the output and
    every gradient against float64."""
    from fold_kernels import tuning

    # blocks of 16 (interpreter) or 32 (GPU): N 32 is a multiple of both, N 29 of neither
    cfg = tuning.Config(16, 16, 1, 1, rows=rows) if tuning.interpreting() else tuning.Config(
        32, 32, 2, 2, rows=rows)
    with tuning.pinned("evo_fwd", cfg):
        _check(*_inputs((1, 5, 2, n, 32), 2, n, dtype, seed=rows + n), dtype)


@pytest.mark.parametrize("rows", [1, 2])
def test_forward_rows_without_mask_or_bias(rows):
    """No key mask (no select in the loop) and no bias (MSA column attention), two batch
    entries, a head dim padded to BLOCK_D (D 24 < 32: masked loads)."""
    from fold_kernels import tuning

    cfg = tuning.Config(16, 16, 1, 1, rows=rows) if tuning.interpreting() else tuning.Config(
        64, 64, 4, 2, rows=rows)
    with tuning.pinned("evo_fwd", cfg):
        q, k, v, bias, _, gate = _inputs((2, 3, 2, 32, 24), 2, 32, torch.float32, seed=3)
        _check(q, k, v, bias, None, gate, torch.float32)
        _check(q, k, v, None, None, None, torch.float32)


def test_rows_a_kernel_cannot_run_are_refused():
    """A pinned configuration with rows the kernel does not run (the grid would skip rows) is a
    clear error, not silently missing rows."""
    from fold_kernels import evo_attention, tuning

    q, k, v, bias, mask, _ = _inputs((1, 5, 2, 16, 16), 2, 16, torch.float32, with_gate=False)
    ins = [t.to(DEVICE).requires_grad_() for t in (q, k, v, bias)]
    for rows in (3, 4):
        with tuning.pinned("evo_fwd", tuning.Config(16, 16, 1, 1, rows=rows)):
            with pytest.raises(ValueError, match=r"forward kernel runs \(1, 2\) rows"):
                evo_attention(*ins, mask.to(DEVICE))
    o = evo_attention(*ins, mask.to(DEVICE))
    with tuning.pinned("evo_dq", tuning.Config(16, 16, 1, 1, rows=4)):
        with pytest.raises(ValueError, match="dQ kernel runs"):
            o.sum().backward()


def test_fully_masked_rows_are_uniform_for_every_rows_setting():
    """A fully masked row averages v exactly (weights exp2(0) = 1 for every key: the replaced
    logit -2^100 times log2(e) is exact), whatever the bias, in each rows-per-program setting."""
    from fold_kernels import evo_attention, tuning

    q, k, v, bias, mask, _ = _inputs((1, 5, 2, 20, 16), 2, 20, torch.float32, with_gate=False)
    mask[0, 3] = False
    bias = bias * 50
    for rows in (1, 2):
        with tuning.pinned("evo_fwd", tuning.Config(16, 16, 1, 1, rows=rows)
                           if tuning.interpreting() else tuning.Config(64, 64, 4, 2, rows=rows)):
            o = evo_attention(*(t.to(DEVICE) for t in (q, k, v, bias, mask))).cpu()
        for r in (1, 3):
            torch.testing.assert_close(o[0, r], v[0, r].mean(-2, keepdim=True).expand(2, 20, 16),
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="launch candidates need a GPU")
@pytest.mark.parametrize("kernel,d", [("fwd", 32), ("fwd", 8), ("dkdv_atomic_dq", 32),
                                      ("dkdv_atomic_dq", 8), ("dkdv_dq", 32), ("dq", 32)])
def test_every_launch_candidate_matches_reference(monkeypatch, kernel, d):
    """Each tuner candidate of the forward and of the dK/dV(+dQ) pass (tiles, warps, stages,
    one or two rows, query- or key-major), not only the default the other tests run on a GPU:
    bf16, odd N and R, holes and a fully masked row. A candidate that does not fit the device
    (shared memory) is skipped, as the tuner skips it."""
    import importlib

    from fold_kernels import tuning
    from triton.runtime.errors import OutOfResources

    mod = importlib.import_module("fold_kernels.evo_attention")
    monkeypatch.setenv("FOLD_EVO_DBIAS", "atomic" if "atomic" in kernel else "pass")
    monkeypatch.setenv("FOLD_EVO_DQ", "pass" if kernel == "dq" else "atomic")
    monkeypatch.setenv("FOLD_EVO_DKDV", "auto")
    cands = tuning._attention_configs(kernel, tuning.arch(), d,
                                      2 if kernel == "fwd" else 4)  # bf16 below
    assert len(cands) > 1
    default = mod._cfg
    ran = 0
    # N 93: every tile has keys past N; N 256: a multiple of every block (unpredicated loads)
    sizes = (93, 256) if kernel == "fwd" else (93,)
    for cand in cands:
        # *variant: the switches _cfg keys apart (the staggered walk); c keyword-only
        monkeypatch.setattr(mod, "_cfg", lambda k, lp, launch, *variant, c=cand: (
            c if k == kernel else default(k, lp, launch, *variant)))
        try:
            for n in sizes:
                _check(*_inputs((1, 5, 2, n, d), 2, n, torch.bfloat16, seed=ran), torch.bfloat16)
        except OutOfResources:
            continue
        ran += 1
    assert ran >= len(cands) // 2
