"""torch.fx tracing of every block (the AutoChunk seam) and the placement of the axial seam calls
(the DAP seam)."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from _trunk_helpers import holes, randomize_, rel_err
from fold_model.af2 import config
from fold_model.af2.evoformer import make_block
from fold_model.af2.template import TemplatePairBlock
from fold_model.seams import AxialComm, BranchSeam


def _inputs(seed=0, c_m=16):
    g = torch.Generator().manual_seed(seed)
    m, z = torch.randn(2, 5, 7, c_m, generator=g), torch.randn(2, 7, 7, 12, generator=g)
    seq = holes((2, 7), seed=seed)
    return m, z, holes((2, 5, 7), seed=seed + 1), seq[:, :, None] * seq[:, None, :]


def _only_torch_ops(gm: torch.fx.GraphModule) -> None:
    """torch ops and the leaves of the op contract (fold_model.ops.leaves), nothing else of
    fold-model (no layer function, no seam call on one device)."""
    from fold_model.ops import leaves

    for node in gm.graph.nodes:
        if node.op == "call_function":
            mod = getattr(node.target, "__module__", "") or ""
            is_leaf = leaves.LEAVES.get(getattr(node.target, "fold_op", None)) is node.target
            assert is_leaf or "fold_model" not in mod, f"{node.target} leaked into the graph"


@pytest.mark.parametrize("order", ["af2", "multimer", "parallel"])
@pytest.mark.parametrize("extra", [False, True])
def test_trace_evoformer_and_extra_msa_blocks(order, extra):
    cfg = config("tiny")
    c_m = cfg.extra_msa.c_e if extra else cfg.evoformer.c_m
    block = randomize_(make_block(cfg.extra_msa if extra else cfg.evoformer, c_m, 12, order,
                                  extra)).eval()
    gm = torch.fx.symbolic_trace(block)
    _only_torch_ops(gm)
    m, z, mm, pm = _inputs(c_m=c_m)
    ref = block(m, z, mm, pm)
    out = gm(m, z, mm, pm)
    assert rel_err(out[0], ref[0]) < 1e-6 and rel_err(out[1], ref[1]) < 1e-6


def test_trace_template_pair_block():
    block = randomize_(TemplatePairBlock(10, 4, 2, 6, 2, 0.25)).eval()
    gm = torch.fx.symbolic_trace(block)
    _only_torch_ops(gm)
    t = torch.randn(2, 3, 7, 7, 10)
    _, _, _, pm = _inputs(1)
    assert rel_err(gm(t, pm), block(t, pm)) < 1e-6


def test_trace_in_training_mode_keeps_dropout():
    block = randomize_(make_block(config("tiny").evoformer, 16, 12, "af2")).train()
    gm = torch.fx.symbolic_trace(block)
    m, z, mm, pm = _inputs(2)
    torch.manual_seed(0)
    a = gm(m, z, mm, pm)
    torch.manual_seed(0)
    b = block(m, z, mm, pm)
    assert torch.equal(a[1], b[1])


class RecordingComm(AxialComm):
    """An identity comm that logs the seam calls with the dims they move."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def gather(self, x, dim):
        self.calls.append(f"gather{dim}")
        return x

    def scatter(self, x, dim):
        self.calls.append(f"scatter{dim}")
        return x

    def reduce_scatter(self, x, dim):
        self.calls.append(f"reduce_scatter{dim}")
        return x

    def row_to_col(self, x):
        self.calls.append("row_to_col")
        return x

    def col_to_row(self, x):
        self.calls.append("col_to_row")
        return x

    def all_gather_for_outer_product(self, x):
        self.calls.append("gather_opm")
        return x

    def all_gather_for_triangle(self, x, dim=-3):
        self.calls.append("gather_tri")
        return x


def _layout_trace(order: str) -> list[str]:
    comm = RecordingComm()
    block = make_block(config("tiny").evoformer, 16, 12, order, comm=comm).eval()
    block(*_inputs(3))
    return [c for c in comm.calls if not c.startswith("scatter")]


def test_dap_seam_calls_af2_order():
    # Row attention gathers its heads-first pair bias [*, H, N_i/P, N_j] along i (-2); the MSA
    # goes to column layout for column attention and the outer product mean (right operand
    # gathered); the pair alternates layouts through the triangle updates / attention (FastFold
    # section 4.2).
    assert _layout_trace("af2") == [
        "gather-2", "row_to_col", "gather_opm", "gather_opm", "col_to_row",
        "gather_tri", "row_to_col", "gather_tri", "col_to_row", "gather-2", "row_to_col",
        "gather-2", "col_to_row",
    ]


def test_dap_seam_calls_other_orders():
    multimer = _layout_trace("multimer")
    assert multimer[0] == "reduce_scatter-3"  # OPM on the row-split MSA, partial sums reduced
    assert multimer.count("row_to_col") == 3 and multimer.count("col_to_row") == 3
    parallel = _layout_trace("parallel")
    assert parallel[-1] == "reduce_scatter-3"  # OPM of the new MSA at the block end
    assert parallel.count("row_to_col") == parallel.count("col_to_row") == 3


def test_identity_comm_and_branch_seam_protocol():
    comm = AxialComm()
    x = torch.randn(3, 4, 5, 6)
    assert comm.size == 1 and comm.rank == 0
    for fn in (comm.row_to_col, comm.col_to_row, comm.all_gather_for_outer_product,
               comm.all_gather_for_triangle):
        assert fn(x) is x
    assert comm.wait(comm.row_to_col_async(x)) is x
    assert comm.wait(comm.col_to_row_async(x)) is x
    assert comm.gather(x, -3) is x and comm.scatter(x, -2) is x and comm.reduce_scatter(x, 1) is x
    assert isinstance(make_block(config("tiny").evoformer, 16, 12, "parallel"), BranchSeam)
    assert not isinstance(make_block(config("tiny").evoformer, 16, 12, "af2"), BranchSeam)
