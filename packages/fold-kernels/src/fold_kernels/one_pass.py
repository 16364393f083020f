"""One-pass deterministic reductions: the programs that finish last add the partial rows.

fold's reductions over many rows (the LayerNorm's weight and bias gradients, a linear layer's
bias gradient) have each program of a fixed grid write one fp32 partial row; a second launch
(:func:`fold_kernels.reduce.sum_partials`, a tree of one or two launches) adds the rows in a
fixed order. In an eager step every launch costs tens of microseconds of host time, and a
Pairformer step at 256 tokens runs 38 of these second-stage launches (an Evoformer step, 58).

Here the first stage finishes the sum itself, without atomics on the data (the classic
"last block" reduction, made two-level so that no single program walks hundreds of rows):

1. each program stores its partial row, then arrives on its group's counter (``GROUP``
   consecutive programs share one; an ``atomic_add`` with acquire-release order, after a
   barrier so that every thread's stores are ordered before it);
2. the program that arrives last in its group adds the group's rows, in order, into a group row
   (or, with one group, into the output) and resets the counter to 0;
3. it then arrives on the top counter; the last group to arrive adds the group rows, in order,
   into the output, in the output's dtype, and resets that counter.

Which program does the adding depends on timing; what is added, and in which order, does not:
the result has the same bits on every call (for a given grid). The counters live in a small
int32 buffer per device and stream (:func:`counters`), zero between kernels; kernels on one
stream run one after another, so they never share a counter at the same time. Under the
interpreter each call gets a fresh buffer (programs run one after another there too, and an
exception in the middle of a grid must not leave a counter behind).

``FOLD_KERNELS_ONE_PASS=0`` restores the two-launch path (for comparisons).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fold_ops.env import EnvVar

from fold_kernels.launch import raw_stream
from fold_kernels.tuning import interpreting

__all__ = ["finish_sum", "counters", "enabled", "group_size", "slots", "fits", "partials",
           "SLOTS"]

_ENABLED = EnvVar("FOLD_KERNELS_ONE_PASS", lambda v: (v if v is not None else "1") != "0")
SLOTS = 4096  # counters per (device, stream): 16 KB
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def enabled() -> bool:
    """One-pass reductions are in use (``FOLD_KERNELS_ONE_PASS`` is not ``0``)."""
    return _ENABLED.get()


def group_size() -> int:
    """Programs per group: 32 compiled (a group's rows are one ``[32, BLOCK_M]`` load), 2 in
    the interpreter (its small grids still take both levels)."""
    return 2 if interpreting() else 32


def slots(n_prog: int) -> int:
    """Counters one reduction over ``n_prog`` programs uses: the top one and one per group."""
    return 1 + triton.cdiv(n_prog, group_size())


def fits(reductions: int, n_prog: int) -> bool:
    """One-pass reductions are on and ``reductions`` of them over ``n_prog`` programs each
    (e.g. one per column block or per head) fit the counters of one kernel."""
    return enabled() and reductions * slots(n_prog) <= SLOTS


def partials(n_prog: int, width: int, device: torch.device) -> torch.Tensor:
    """The fp32 ``[n_prog + groups, width]`` buffer of one reduction: a partial row per program,
    then one row per group for :func:`finish_sum`'s first level."""
    rows = n_prog + triton.cdiv(n_prog, group_size())
    return torch.empty((rows, width), device=device, dtype=torch.float32)


def counters(device: torch.device) -> torch.Tensor:
    """``[SLOTS]`` int32 counters, all zero, for kernels launched now on ``device``'s current
    stream. A kernel leaves the counters it used at zero."""
    if interpreting() or device.type != "cuda":
        return torch.zeros(SLOTS, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, raw_stream(index))
    buf = _COUNTERS.get(key)
    if buf is None:  # under CUDA-graph capture, the graph's pool holds it and replays zero it
        buf = _COUNTERS[key] = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _rows_sum(P, Dst, row0, n_rows, ld, col0, n_cols,
              BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr):
    """``Dst[col0 + j] = sum_r P[row0 + r, col0 + j]`` for ``r < n_rows``, ``j < n_cols``, in
    fp32, rows in order; stored in Dst's dtype. P's rows are ``ld`` apart. The loads bypass L1
    (``.cg``): other programs wrote these rows during this kernel."""
    offs_s = tl.arange(0, BLOCK_S)
    for c0 in range(col0, col0 + n_cols, BLOCK_M):
        offs_m = c0 + tl.arange(0, BLOCK_M)
        m_valid = offs_m < col0 + n_cols
        acc = tl.zeros([BLOCK_S, BLOCK_M], tl.float32)
        for s0 in range(row0, row0 + n_rows, BLOCK_S):  # fixed order: deterministic
            rows = s0 + offs_s
            mask = (rows < row0 + n_rows)[:, None] & m_valid[None, :]
            acc += tl.load(P + rows.to(tl.int64)[:, None] * ld + offs_m[None, :], mask=mask,
                           other=0.0, cache_modifier=".cg")
        tl.store(Dst + offs_m, tl.sum(acc, 0).to(Dst.dtype.element_ty), mask=m_valid)


@triton.jit
def _sets_sum(P, Dst, row0, n_rows, ld, col0, n_cols, set_stride, N_SETS: tl.constexpr,
              BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr):
    """:func:`_rows_sum` over ``N_SETS`` column ranges ``set_stride`` apart."""
    for k in tl.static_range(N_SETS):
        _rows_sum(P, Dst, row0, n_rows, ld, col0 + k * set_stride, n_cols, BLOCK_S, BLOCK_M)


@triton.jit
def finish_sum(P, Out, Cnt, pid, n_prog, ld, col0, n_cols,
               GROUP: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
               N_SETS: tl.constexpr = 1, set_stride=0):
    """Called by each of the ``n_prog`` programs of one reduction (``pid`` in ``[0, n_prog)``)
    once it has stored its partial row ``P[pid, col0:col0 + n_cols]`` (fp32, rows ``ld``
    apart). P has ``cdiv(n_prog, GROUP)`` more rows after the programs' rows, for the group
    sums. The last program to arrive stores ``sum(P[:n_prog, cols], 0)`` at ``Out[cols]`` in
    Out's dtype. ``Cnt``: this reduction's ``1 + cdiv(n_prog, GROUP)`` counters, all zero,
    left zero (the top counter first, then one per group). With ``N_SETS`` > 1 the reduction
    covers that many column ranges, ``set_stride`` apart (e.g. one channel of several stacked
    projections), under the one set of counters."""
    n_groups = tl.cdiv(n_prog, GROUP)
    g = pid // GROUP
    g_rows = tl.minimum(GROUP, n_prog - g * GROUP)
    tl.debug_barrier()  # every thread's partial stores come before this program's arrival
    if tl.atomic_add(Cnt + 1 + g, 1, sem="acq_rel", scope="gpu") == g_rows - 1:
        tl.store(Cnt + 1 + g, 0)  # every program of the group has arrived: reset
        if n_groups == 1:
            _sets_sum(P, Out, 0, n_prog, ld, col0, n_cols, set_stride, N_SETS, BLOCK_S,
                      BLOCK_M)
        else:
            _sets_sum(P, P + (n_prog + g).to(tl.int64) * ld, g * GROUP, g_rows, ld, col0,
                      n_cols, set_stride, N_SETS, BLOCK_S, BLOCK_M)
            tl.debug_barrier()  # the group row is stored before the group arrives
            if tl.atomic_add(Cnt, 1, sem="acq_rel", scope="gpu") == n_groups - 1:
                tl.store(Cnt, 0)
                _sets_sum(P + n_prog.to(tl.int64) * ld, Out, 0, n_groups, ld, col0, n_cols,
                          set_stride, N_SETS, BLOCK_S, BLOCK_M)
