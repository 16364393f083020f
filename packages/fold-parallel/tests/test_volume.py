"""Communication per Evoformer block, counted from the collectives actually issued (DAP-2 and
BP-2, one block forward + backward), against HelixFold Table 4 (calls) and FastFold Table 3
(bytes)."""

from __future__ import annotations

import pytest
import torch
from _dist import ok, run_ranks

pytestmark = pytest.mark.distributed

P = 2
S, N = 6, 8  # divisible: no padding, so the formulas apply to the whole sizes


def _count(rank: int, world: int) -> dict:
    import _models
    from fold_parallel import Collectives, DapComm, enable_bp, enable_dap
    from fold_parallel.volume import CommRecorder

    _models.N_SEQ, _models.N_RES, _models.B = S, N, 1
    out = {}
    for mode in ("dap", "bp"):
        stack = _models.build("evoformer", "parallel" if mode == "bp" else "af2", n_blocks=1)
        args = _models.inputs("evoformer", stack)
        if mode == "dap":
            enable_dap(stack, DapComm(None, "fallback"), check_shapes=False)
        else:
            enable_bp(stack, Collectives(None, impl="fallback"))
        with CommRecorder() as fwd:
            res = stack(*args)
        loss = sum((o * torch.randn_like(o)).sum() for o in res)
        with CommRecorder() as bwd:
            loss.backward()
        out[mode] = (fwd.counts(), bwd.counts(), fwd.sent_by_op(), bwd.sent_by_op(),
                     [(r.op, r.shape) for r in fwd.records])
    blk = stack.blocks[0]
    out["dims"] = (blk.outer_product_mean.c_hidden, blk.tri_mul_out.linear_a_p.out_features,
                   blk.msa_att_row.layer_norm_m.dim, blk.tri_mul_out.layer_norm_in.dim)
    return out


def test_volume_matches_papers():
    from fold_parallel.volume import HELIXFOLD_TABLE4, fastfold_table3

    res = ok(run_ranks(_count, P))[0]
    c_opm, c_mul, c_m, c_z = res["dims"]
    f_cnt, b_cnt, f_sent, b_sent, f_records = res["dap"]
    # Stack entry/exit: gather of m and z at the end of the stack (not per block) - remove them.
    assert f_cnt["all_gather"] == 7 + 2
    # HelixFold Table 4 (DAP, per block, fwd + bwd): 12 all-to-all, 6 all-gather, 6 reduce-scatter
    # (+1 all-gather of the OPM mask in fold-model's column-layout OPM, which has no backward).
    table = HELIXFOLD_TABLE4["DAP"]
    n_a2a = sum(v.get("all_to_all", 0) for k, v in table.items() if k != "total")
    n_ag = sum(v.get("all_gather", 0) for k, v in table.items() if k != "total")
    assert f_cnt["all_to_all"] + b_cnt["all_to_all"] == n_a2a == 12
    assert f_cnt["all_gather"] - 2 == n_ag + 1  # +1: the mask
    assert b_cnt["reduce_scatter"] - 2 == n_ag  # -2: the stack-exit gathers' backward
    # FastFold Table 3 (bytes per device, fp64 here): the transposes, 6 fwd + 6 bwd all-to-all
    # of the MSA (2 + 2) and the pair (4 + 4); K = the whole activation.
    k_m, k_z = S * N * c_m * 8, N * N * c_z * 8
    a2a = f_sent["all_to_all"] + b_sent["all_to_all"]
    assert abs(a2a - (4 * k_m + 8 * k_z) * (P - 1) / P**2) < 1e-6
    # Outer product mean and triangle updates: one all-gather each of the right projection.
    opm = [s for op, s in f_records if op == "all_gather" and s[-1] == c_opm]
    # the triangle updates gather a channel-first projection [*, c, rows, cols]
    tri = [s for op, s in f_records if op == "all_gather" and len(s) > 3 and s[-3] == c_mul]
    assert len(opm) == 1 and len(tri) == 2
    k_opm = S * N * c_opm * 8
    k_tri = N * N * c_mul * 8
    ff = fastfold_table3(1.0, P)
    sent_opm = (P - 1) * torch.Size(opm[0]).numel() * 8
    sent_tri = sum((P - 1) * torch.Size(s).numel() * 8 for s in tri)
    assert abs(sent_opm - ff["outer_product_mean"] * k_opm) < 1e-6
    assert abs(sent_tri - ff["triangle_update"] * k_tri) < 1e-6
    # BP: one pair all-reduce per block in forward and one in backward (HelixFold counts 4
    # calls: it also broadcasts the MSA and the OPM every block), plus the MSA broadcast once
    # at the end of the stack.
    f_cnt, b_cnt, f_sent, b_sent, _ = res["bp"]
    assert f_cnt == {"all_reduce": 1, "broadcast": 1}
    assert b_cnt == {"all_reduce": 2}  # pair gradient + the MSA broadcast's backward
    assert f_sent["all_reduce"] == 2 * (P - 1) / P * k_z
