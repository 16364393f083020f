"""The peers benchmark (benchmarks/model/peers.py) runs end to end on CPU in its tiny mode (fold
alone), and a peer that is missing or fails gets its error text in its row, never a number."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from benchmarks.common import peer_blocks as pb
from benchmarks.common import peer_runs
from benchmarks.model import peers


def test_tiny_fold_rows_and_results_files(tmp_path):
    out = tmp_path / "res" / "peers.json"
    rows = peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0",
                       "--out", str(out)])
    assert [(r["block"], r["contender"]) for r in rows] == [
        ("evoformer", "fold"), ("pairformer", "fold"), ("diffusion", "fold")]
    for r in rows:
        assert not r["errors"] and "error" not in r
        assert all(math.isfinite(r[f"{m}_ms"]) and r[f"{m}_ms"] > 0 for m in peers.MODES)
    doc = json.loads(out.read_text())
    assert doc["rows"] == rows and doc["meta"]["versions"]["torch"] == torch.__version__
    # no peer ran: every ratio names none and carries no number
    assert len(doc["ratios"]) == 3 * len(peers.MODES)
    assert all(e["best_peer"] is None and e["fold_over_peer"] is None for e in doc["ratios"])
    table = out.with_suffix(".md").read_text()
    assert table.count("| fold this tree |") == 3 and "none measured" in table


def test_missing_peer_row_has_error_not_numbers(monkeypatch):
    monkeypatch.setitem(peers.pb.PEERS, "boltz",
                        ("no-such-distribution-fold-test",) + peers.pb.PEERS["boltz"][1:])
    rows = peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0",
                       "--contenders", "fold,boltz", "--blocks", "diffusion:13x3",
                       "--modes", "fwd_eager"])
    fold, boltz = rows
    assert fold["contender"] == "fold" and fold["fwd_eager_ms"] > 0
    assert boltz["contender"] == "boltz" and boltz["error"].startswith("not installed")
    assert not any(k.endswith("_ms") for k in boltz)
    ratio = peers.ratios(rows, ("fwd_eager",))[0]
    assert ratio["best_peer"] is None and ratio["peer_ms"] is None


def test_failing_forward_records_error():
    def broken():
        raise RuntimeError("kernel exploded")

    case = peers.pb.Case(torch.nn.Linear(2, 2), (torch.zeros(1, 2, requires_grad=True),), broken)
    res = peers.measure(case, torch.device("cpu"), peers.MODES, 0, 1)
    assert res == {"error": "forward failed: RuntimeError: kernel exploded"}


def test_output_gradients_same_values_whatever_the_layout():
    a = torch.zeros(1, 3, 4, 5, dtype=torch.bfloat16)
    b = torch.zeros(3, 4, 5, dtype=torch.float32)
    (ga,), (gb,) = pb.output_grads((a,)), pb.output_grads((b,))
    assert ga.dtype == torch.bfloat16 and gb.dtype == torch.float32
    assert ga.shape == a.shape and gb.shape == b.shape
    torch.testing.assert_close(ga.float().reshape(-1), gb.bfloat16().float().reshape(-1))
    assert gb.abs().sum() > 0


def test_block_spec_parsing():
    shapes = peer_runs.parse_rows("evoformer:128x256,pairformer:384,diffusion:768x48")
    assert shapes == [peers.pb.Shape("evoformer", 256, n_seq=128),
                      peers.pb.Shape("pairformer", 384),
                      peers.pb.Shape("diffusion", 768, samples=48)]
    with pytest.raises(SystemExit):
        peer_runs.parse_rows("msa:12")


def test_append_keeps_measured_rows(tmp_path):
    out = tmp_path / "peers.json"
    common = ["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0", "--modes",
              "fwd_eager", "--out", str(out)]
    first = peers.main(common + ["--blocks", "pairformer:13"])
    rows = peers.main(common + ["--append", "--blocks", "pairformer:13,diffusion:13x3"])
    assert [r["block"] for r in rows] == ["pairformer", "diffusion"]
    assert rows[0] == first[0]  # kept, not measured again
    assert json.loads(out.read_text())["rows"] == rows


def test_pin_cpu_pins_the_run_and_says_so(tmp_path):
    """``--pin-cpu`` restricts the process to the listed CPUs and the results record it; the
    affinity is restored afterwards (pytest's process is shared)."""
    import os

    from benchmarks.common.machine import parse_cpus

    assert parse_cpus("2") == [2] and parse_cpus("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ValueError, match="not a number"):
        parse_cpus("a")
    with pytest.raises(ValueError, match="bad range"):
        parse_cpus("3-1")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    out = tmp_path / "pinned.json"
    try:
        peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0",
                    "--blocks", "diffusion:13x3", "--modes", "fwd_eager",
                    "--pin-cpu", str(cpu), "--out", str(out)])
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
    assert json.loads(out.read_text())["meta"]["cpus_pinned"] == [cpu]
    assert f"pinned to [{cpu}]" in out.with_suffix(".md").read_text()
    with pytest.raises(ValueError, match="may run on"):
        peers.main(["--device", "cpu", "--tiny", "--pin-cpu", str(max(before) + 1000)])


def test_peers_match_folds_precision_by_default():
    """Like with like: bf16 peers against fold's bf16 streams, fp32 peers against fold's fp32
    streams under autocast; an explicit choice is kept. The header says which."""
    assert peer_runs.peer_weights("match", "bf16") == "bf16"
    assert peer_runs.peer_weights("match", "mixed") == "fp32"
    assert peer_runs.peer_weights("match", "mixed-bf16-weights") == "fp32"
    assert peer_runs.peer_weights("fp32", "bf16") == "fp32"
    meta = {"device": "NVIDIA H200", "fold_dtype": "torch.float32", "fold_precision": "mixed"}
    assert "inputs under bf16 autocast (mixed)" in peers._fold_setting(meta)
    assert peers._fold_setting({**meta, "device": "cpu"}) == "torch.float32 weights and inputs"


@pytest.mark.parametrize("pattern", ["holes", "padded", "none"])
def test_token_mask_patterns(pattern):
    """``--mask``: every contender's token mask from ``pattern_mask``'s draws; "holes" keeps the
    earlier rows' values (~5% holes), "padded" masks the last tenth, "none" keeps all; the
    first token is always kept and the pair mask is the outer product."""
    shape = pb.Shape("pairformer", 40)
    x = pb.base_inputs(shape, pb.fold_sizes(True), pattern)
    m = x["mask"]
    assert m.shape == (1, 40) and m[0, 0] == 1
    if pattern == "padded":
        assert m[0, :36].all() and not m[0, 36:].any()
    elif pattern == "none":
        assert m.all()
    else:
        gen = torch.Generator().manual_seed(0)
        want = (torch.rand(1, 40, generator=gen) > 0.05).float()
        want[:, 0] = 1
        assert torch.equal(m, want)
    assert torch.equal(x["pair_mask"], m[:, :, None] * m[:, None])


def test_mask_option_recorded(tmp_path):
    out = tmp_path / "peers.json"
    peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0", "--blocks",
                "pairformer:13", "--modes", "fwd_eager", "--mask", "padded", "--out", str(out)])
    assert json.loads(out.read_text())["meta"]["mask"] == "padded"
    assert "Token mask: padded." in out.with_suffix(".md").read_text()


def _captures(stale):
    """A stand-in for CUDA-graph capture on the CPU: the replay writes the body's outputs into
    the captured buffers, or (``stale``) leaves them as capture left them, as a graph does for
    a kernel launched outside the capturing stream. ``stale`` may be a test on the body's
    outputs: stale for the bodies it holds for only."""
    def capture_fn(body, device):
        static = tuple(t.clone() for t in body())
        missing = stale(static) if callable(stale) else stale

        def replay():
            if not missing:
                for s, t in zip(static, body()):
                    s.copy_(t)
        replay.missing = missing  # marks a replay for _counts
        return replay, static
    return capture_fn


def _counts(lost: dict[str, int]):
    """A stand-in for the profiler's kernel census: an eager call runs six LayerNorm and three
    GEMM launches; a replay (a function from :func:`_captures`) runs ``lost`` fewer, and one
    fill of its own."""
    from collections import Counter

    def counts_fn(fn):
        eager = Counter({"void LayerNormForwardV2<c10::BFloat16, float4>(float*, int)": 6,
                         "nvjet_sm90_tst_128x256": 3})
        if not hasattr(fn, "missing"):
            return eager
        return eager - Counter(lost) + Counter({"fill": 1})
    return counts_fn


def _linear_case():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5, requires_grad=True)
    return peers.pb.Case(lin, (x,), lambda: (lin(x), torch.dropout(lin(x), 0.5, lin.training)))


def test_replay_differences_find_work_outside_the_graph_and_restore_inputs():
    from benchmarks.common.graphs import largest, replay_differences

    def replay_difference(*args):
        compared = replay_differences(*args)
        return None if compared is None else largest(compared[0])

    case = _linear_case()
    before = case.inputs[0].detach().clone()
    case.module.eval()

    def fwd():
        with torch.no_grad():
            return case.forward()
    cpu = torch.device("cpu")
    assert replay_difference(fwd, case.inputs, cpu) is None  # no graphs on CPU
    assert replay_difference(fwd, case.inputs, cpu, _captures(stale=False)) == 0.0
    assert replay_difference(fwd, case.inputs, cpu, _captures(stale=True)) > 0.1
    assert torch.equal(case.inputs[0].detach(), before)

    def nan_body():
        return (case.inputs[0] * float("nan"),)
    assert replay_difference(nan_body, case.inputs, cpu, _captures(stale=False)) == math.inf


def test_check_replay_flags_an_incomplete_graph_and_the_ratio_says_so():
    case = _linear_case()
    cpu = torch.device("cpu")
    assert peer_runs.check_replay(case, cpu) == {}
    whole = _counts({})
    good = peer_runs.check_replay(case, cpu, _captures(stale=False), whole)
    assert good == {"replay_diff": 0.0, "replay_diff_steps": {"forward": 0.0, "train": 0.0},
                    "replay_eager_spread": {"forward": 0.0, "train": 0.0}, "replay_off": {},
                    "replay_missing_kernels": {}, "replay_incomplete": False}
    bad = peer_runs.check_replay(case, cpu, _captures(stale=True), whole)
    assert bad["replay_incomplete"] and bad["replay_diff"] > peer_runs.REPLAY_TOLERANCE
    # a graph whose forward is whole but whose backward misses work (the training step's
    # outputs are the three gradients of x, W and b; the forward's are its two outputs)
    backward = peer_runs.check_replay(case, cpu, _captures(stale=lambda outs: len(outs) == 3),
                                      whole)
    assert backward["replay_diff_steps"]["forward"] == 0.0
    assert backward["replay_incomplete"] and backward["replay_diff_steps"]["train"] > 0.1
    assert "eval training step off by" in peer_runs.replay_verdict(backward)
    assert "eval forward" not in peer_runs.replay_verdict(backward)
    # results that match while launches are missing (Protenix's forward replay on the H200):
    # the census flags it; the graph's own fill is no missing work
    ln = "void LayerNormForwardV2<c10::BFloat16, float4>(float*, int)"
    census = peer_runs.check_replay(case, cpu, _captures(stale=False), _counts({ln: 6}))
    assert census["replay_diff"] == 0.0
    assert census["replay_missing_kernels"] == {ln: 6} and census["replay_incomplete"]
    assert "6 launches not in it, of LayerNormForwardV2 x6" in peer_runs.replay_verdict(census)
    assert case.module.training  # back in training mode (dropout on for the timed steps)
    rows = [{"block": "pairformer", "n": 13, "n_seq": 0, "samples": 0, "contender": "fold",
             "kernels": "-", "train_graph_ms": 1.0},
            {"block": "pairformer", "n": 13, "n_seq": 0, "samples": 0, "contender": "protenix",
             "kernels": "on", "train_graph_ms": 2.0, "train_eager_ms": 3.0, **bad}]
    graph, eager = peers.ratios(rows, ("train_graph", "train_eager"))
    assert graph["best_peer"] == "protenix (kernels on), replay incomplete"
    assert eager["best_peer"] == "protenix (kernels on)"


def test_check_replay_allows_each_outputs_own_rounding_spread():
    from benchmarks.common.graphs import replay_differences

    def eager_spreads(body, inputs):  # the spreads beside a replay that holds everything
        return replay_differences(body, inputs, torch.device("cpu"), _captures(stale=False))[1]

    # a step that sums in a varying order (atomic adds) differs between eager calls and from
    # its replay by its rounding alone: a stand-in whose first output jitters by up to 0.5% a
    # call, and whose second is all rounding (an exact zero computed with noise, as the
    # gradient of a bias that a softmax's shift invariance cancels): relative spread O(1)
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5, requires_grad=True)

    def jittered():
        y = lin(x)
        return y * (1 + 5e-3 * torch.rand(y.shape)), lin.bias * 0.0 + 1e-6 * torch.randn(3)
    case = peers.pb.Case(lin, (x,), jittered)
    cpu = torch.device("cpu")
    fwd = peer_runs.forward_step(case)
    spread, zero = eager_spreads(fwd, case.inputs)
    assert 0.0 < spread < 0.02 and zero > 0.5
    plain = _linear_case()
    plain.module.eval()  # (no dropout)
    assert eager_spreads(peer_runs.forward_step(plain), plain.inputs) == [0.0, 0.0]
    whole = _counts({})
    ok = peer_runs.check_replay(case, cpu, _captures(stale=False), whole)
    assert ok["replay_diff_steps"]["forward"] > 0.5  # the rounding-only output
    assert ok["replay_off"] == {} and not ok["replay_incomplete"]
    # one output that is all rounding does not excuse another that misses work
    stale_first = peer_runs.check_replay(case, cpu, _captures(stale=True), whole)
    assert stale_first["replay_incomplete"]
    assert stale_first["replay_off"]["forward"]["output"] in (0, 1)
    assert "eval forward off by" in peer_runs.replay_verdict(stale_first)
    assert "its eager calls:" in peer_runs.replay_verdict(stale_first)

    case2 = peers.pb.Case(lin, (x,), lambda: (lin(x), lin.bias * 0.0 + 1e-6 * torch.randn(3)))

    def capture_first_stale(body, device):
        """The forward's first output (of its two) stays as capture left it; every other
        output (the noisy one, the training step's three gradients) is refreshed."""
        static = tuple(t.clone() for t in body())

        def replay():
            for k, (s, t) in enumerate(zip(static, body())):
                if k > 0 or len(static) != 2:
                    s.copy_(t)
        return replay, static
    part = peer_runs.check_replay(case2, cpu, capture_first_stale, whole)
    assert part["replay_off"]["forward"]["output"] == 0  # the stale output, not the noisy one
    assert part["replay_incomplete"]
    # the allowance: the tolerance at least, a multiple of the spread, nothing for a NaN
    assert peer_runs.allowed_difference(None) == peer_runs.REPLAY_TOLERANCE
    assert peer_runs.allowed_difference(0.0) == peer_runs.REPLAY_TOLERANCE
    assert peer_runs.allowed_difference(0.01) == pytest.approx(peer_runs.SPREAD_FACTOR * 0.01)
    assert peer_runs.allowed_difference(math.nan) == peer_runs.REPLAY_TOLERANCE
    assert peer_runs.allowed_difference(math.inf) == peer_runs.REPLAY_TOLERANCE
    # older rows: without spreads the plain tolerance, with a step's spread that allowance
    row = {"replay_diff_steps": {"train": 0.012}}
    assert "eval training step off by 0.012" in peer_runs.replay_verdict(row)
    assert "eval training step" not in peer_runs.replay_verdict(
        {**row, "replay_eager_spread": {"train": 0.01}})


def test_activity_names_match_between_eager_calls_and_replays():
    from benchmarks.common.kernel_time import activity_name

    # the profiler's names for the same memset, eager and in a replay (H200)
    assert activity_name("Memset (Device)") == activity_name("Memset (Unknown)") == "Memset"
    assert activity_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    kernel = "void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>(int)"
    assert activity_name(kernel) == kernel


def test_check_replay_runs_untuned_and_puts_the_setting_back(monkeypatch):
    case = _linear_case()
    seen = []

    def capture_fn(body, device):
        seen.append(os.environ.get("FOLD_KERNELS_AUTOTUNE"))
        return _captures(stale=False)(body, device)
    for before in ("1", None):
        if before is None:
            monkeypatch.delenv("FOLD_KERNELS_AUTOTUNE", raising=False)
        else:
            monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", before)
        peer_runs.check_replay(case, torch.device("cpu"), capture_fn, _counts({}))
        assert os.environ.get("FOLD_KERNELS_AUTOTUNE") == before
    assert seen and set(seen) == {"0"}  # every capture of the check ran untuned
    assert len(seen) == 4  # per check: the forward and the training step, each captured once



def test_kernel_modes_sum_an_eager_steps_kernels(tmp_path):
    out = tmp_path / "kernels.json"
    rows = peers.main(["--device", "cpu", "--tiny", "--reps", "3", "--warmup", "0",
                       "--blocks", "pairformer:13", "--modes", "train_kernels,fwd_kernels",
                       "--out", str(out)])
    (fold,) = rows
    assert not fold["errors"]
    # (CPU: operators' self times, so no order between the two is asserted: timing noise)
    assert all(math.isfinite(fold[f"{m}_ms"]) and fold[f"{m}_ms"] > 0
               for m in ("train_kernels", "fwd_kernels"))
    assert "'kernels' modes: the summed kernel time" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="--modes"):
        peers.main(["--device", "cpu", "--tiny", "--modes", "train_kernel"])


def test_kernel_times_merge_and_sum():
    from benchmarks.common.kernel_time import kernel_counts, kernel_ms, kernel_times

    cpu = torch.device("cpu")
    a = torch.randn(64, 64)

    def step():
        return (a @ a) @ a + 1.0
    times = kernel_times(step, cpu)
    assert times == sorted(times, key=lambda k: -k["ms"]) and all(k["ms"] > 0 for k in times)
    assert kernel_counts(step, cpu)["aten::mm"] == 2
    assert kernel_ms(step, cpu, reps=3) > 0


class _ZeroOutput(torch.nn.Module):
    """``x + out(h(x))`` with ``out`` zero-initialised, as the blocks' output layers are.
    ``frozen``: ``h``'s value from capture time, as a replay keeps the result of a kernel
    launched outside the graph."""

    def __init__(self):
        super().__init__()
        self.h = torch.nn.Linear(5, 5)
        self.out = torch.nn.Linear(5, 5)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.frozen = None

    def forward(self, x):
        return x + self.out(self.h(x) if self.frozen is None else self.frozen)


def test_check_replay_sees_past_zero_initialised_output_layers():
    torch.manual_seed(0)
    block = _ZeroOutput()
    x = torch.randn(4, 5, requires_grad=True)
    case = peers.pb.Case(block, (x,), lambda: (block(x),))
    weights = [p.detach().clone() for p in block.parameters()]

    def capture_fn(body, device):  # h outside the graph: the replay keeps its capture value
        static = tuple(t.clone() for t in body())
        frozen = block.h(x).detach()

        def replay():
            block.frozen = frozen
            try:
                for s, t in zip(static, body()):
                    if t is not None:  # (h's gradients: none with h frozen)
                        s.copy_(t)
            finally:
                block.frozen = None
        return replay, static
    res = peer_runs.check_replay(case, torch.device("cpu"), capture_fn, _counts({}))
    # zero output weights would hide the stale h from the forward; the noise shows it
    assert res["replay_diff_steps"]["forward"] > peer_runs.REPLAY_TOLERANCE
    assert res["replay_incomplete"]
    assert all(torch.equal(p, w) for p, w in zip(block.parameters(), weights))  # put back
    assert not block.out.weight.any()


def test_noised_parameters_leave_no_zero_output_layer(tmp_path):
    import argparse

    args = argparse.Namespace(fold_precision="bf16", peer_weights="match",
                              protenix_layernorm=None, tiny=True, params="init")
    cpu = torch.device("cpu")
    peer_runs.settle_precision(args, cpu)
    sizes = pb.fold_sizes(True)
    shape = pb.Shape("pairformer", 13)

    def zero_params(case):
        return sum(not p.any() for p in case.module.parameters())
    init = peer_runs.build("fold", None, shape, sizes, pb.base_inputs(shape, sizes, "holes"),
                           cpu, args)
    args.params = "noised"
    noised = peer_runs.build("fold", None, shape, sizes, pb.base_inputs(shape, sizes, "holes"),
                             cpu, args)
    assert zero_params(init) > 0 and zero_params(noised) == 0  # the output layers start at zero
    out = tmp_path / "noised.json"
    (row,) = peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0",
                         "--blocks", "pairformer:13", "--modes", "train_eager",
                         "--params", "noised", "--out", str(out)])
    assert row["train_eager_ms"] > 0
    assert json.loads(out.read_text())["meta"]["params"] == "noised"
    assert "Parameters noised" in out.with_suffix(".md").read_text()


def test_every_contenders_eager_modes_run_before_any_replay(monkeypatch):
    """The first phase measures every contender's eager modes, the second the replays; each
    contender keeps one row with both phases' results (a peer's eager step was slower after
    CUDA-graph captures in the same process). A contender that is not built in the first phase
    is not tried again."""
    calls = []

    def fake_run_one(name, kernels, shape, sizes, device, args, modes):
        calls.append((name, modes))
        if name == "boltz":
            return {"block": shape.block, "n": shape.n, "n_seq": shape.n_seq,
                    "samples": shape.samples, "contender": name, "kernels": "on",
                    "error": "not installed: test"}
        return {"block": shape.block, "n": shape.n, "n_seq": shape.n_seq,
                "samples": shape.samples, "contender": name,
                "kernels": "-" if kernels is None else "on",
                "errors": {m: "failed" for m in modes if m == "fwd_graph"},
                **{f"{m}_ms": 1.0 for m in modes if m != "fwd_graph"}}

    monkeypatch.setattr(peers, "run_one", fake_run_one)
    monkeypatch.setattr(peers, "contenders", lambda names, shape, settings: [
        ("fold", None), ("protenix", True), ("boltz", True)])
    rows = peers.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "0",
                       "--blocks", "pairformer:13", "--modes",
                       "train_graph,train_eager,fwd_graph,fwd_eager"])
    eager, rest = ("train_eager", "fwd_eager"), ("train_graph", "fwd_graph")
    assert calls == [("fold", eager), ("protenix", eager), ("boltz", eager),
                     ("fold", rest), ("protenix", rest)]
    assert [r["contender"] for r in rows] == ["fold", "protenix", "boltz"]
    for r in rows[:2]:
        assert all(r[f"{m}_ms"] == 1.0 for m in ("train_eager", "fwd_eager", "train_graph"))
        assert r["errors"] == {"fwd_graph": "failed"}
    assert rows[2]["error"] == "not installed: test"
    assert peers.phases(("fwd_graph",)) == [("fwd_graph",)]
