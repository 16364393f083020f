"""``fold-train predict --input-dir`` over the ranks of a torchrun job
(fold_train.predict_batch_dap), on gloo CPU ranks: real chains that fit one rank are dealt to
the ranks, those that do not (a small ``--memory-limit``) run in DAP groups; every output equals
the one-process batch's and is written once, by its group's writer; a bad file among good ones is
reported and skipped (one refused when sized, one whose MSA fails inside a DAP group: the group
agrees and moves on) with exit status 1 on every rank; only rank 0 prints the table and writes
``batch_summary.json``; a rank that fails inside a DAP prediction ends every rank naming it.

The ranks run ``fold_train.cli.main`` in processes started as torchrun starts them (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``), so that each can record its writes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import gemmi
import numpy as np
import pytest
import torch
from _af3_helpers import CCD, INPUTS
from _train_helpers import DEMO
from fold_train.cli import main
from fold_train.predict_dap import plan_batch

MONO = DEMO / "monomer"
MSA_FILES = ("bfd_uniclust_hits.a3m", "mgnify_hits.sto", "uniref90_hits.sto")
# small MSA samples and one recycle: the tiny model runs in seconds on a CPU rank
AF2_OVERRIDES = ["data.n_clust=5", "data.n_extra=7", "data.n_templ=2", "max_recycling_iters=1"]
# real chains of 38, 70 (mmCIF chains), 73 (FASTA), 84, 93 residues (mmCIF chains)
CHAINS = ("1psm", "2q2k", "4zey", "3u8v")


def _checkpoint(path: Path, preset_name: str, overrides: list[str]) -> Path:
    """A tiny model with every weight moved off its initial value (AF's zero-initialised
    output projections would hide the trunk)."""
    from fold_train.checkpoint import save_checkpoint
    from fold_train.config import apply_overrides, preset
    from fold_train.families import make_family

    cfg = apply_overrides(preset(preset_name), overrides)
    model = make_family(cfg.model.family).build_model(cfg.model_config())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return save_checkpoint(path, {"config": cfg.to_dict(), "model": model.state_dict()})


@pytest.fixture(scope="module")
def af2_ckpt(tmp_path_factory) -> Path:
    if not (MONO / "short.fasta").is_file():
        pytest.skip(f"bundled demo data not found at {MONO}")
    return _checkpoint(tmp_path_factory.mktemp("af2") / "af2.ckpt", "tiny", AF2_OVERRIDES)


def _af2_dir(root: Path) -> tuple[Path, Path]:
    """``(input dir, chain list)``: the bundled FASTA and four mmCIF chains with their real
    MSAs, a FASTA that does not parse, and 4ZEY's chain as a FASTA whose A3M has a row of the
    wrong length (sized fine; fails when featurised)."""
    src = root / "inputs"
    (src / "short").mkdir(parents=True)
    shutil.copy(MONO / "short.fasta", src / "short.fasta")
    for name in MSA_FILES:
        shutil.copy(MONO / name, src / "short" / name)
    for pdb in CHAINS:
        shutil.copy(DEMO / "mmcifs" / f"{pdb}.cif", src / f"{pdb}.cif")
        shutil.copytree(DEMO / "alignments" / f"{pdb}_A", src / f"{pdb}_A")
    (src / "bad.fasta").write_text(">bad\nMKV1234\n")
    from fold_data.mmcif import parse_mmcif

    seq = parse_mmcif(DEMO / "mmcifs" / "4zey.cif").get_chain("A").sequence
    (src / "bad_msa").mkdir()
    (src / "bad_msa.fasta").write_text(f">bad_msa\n{seq}\n")
    (src / "bad_msa" / "hits.a3m").write_text(f">query\n{seq}\n>hit\nMKVLA\n")
    chains = root / "chains.txt"
    chains.write_text("".join(f"{pdb}.cif A\n" for pdb in CHAINS))
    return src, chains


def _budget(ckpt: Path, fits: int, needs_dap: int) -> int:
    """A per-rank budget (bytes) that a chain of ``fits`` residues fits and one of
    ``needs_dap`` does not, estimated as predict estimates them."""
    from fold_train.memory_estimate import af2_estimate
    from fold_train.predict import load_trained_model

    _, cfg = load_trained_model(ckpt, "cpu")

    def peak(n: int) -> int:
        return af2_estimate(n, cfg.model_config(), cfg.data_preset(),
                            precision=cfg.system.precision).peak_bytes

    return (peak(fits) + peak(needs_dap)) // 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, logs: str, argv: list[str],
          crash: tuple[int, str] | None) -> None:
    """One rank, as torchrun starts it: ``fold-train`` ``argv``; its stdout, stderr, exit status
    and every ``write_prediction`` target go to files in ``logs``. ``crash``: ``(rank, input)``
    whose prediction raises an error that is not the input's (a device failure)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    out = open(f"{logs}/stdout{rank}.txt", "w")
    err = open(f"{logs}/stderr{rank}.txt", "w")
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    import fold_train.confidence_outputs as outputs
    import fold_train.predict as predict_module
    from fold_train.predict_af2 import AF2Runner

    real_load = predict_module.load_trained_model

    def load(*a, **k):  # the model is loaded once per DAP degree the rank takes part in
        with open(f"{logs}/loads{rank}.txt", "a") as f:
            f.write("load\n")
        return real_load(*a, **k)

    predict_module.load_trained_model = load
    real_write = outputs.write_prediction

    def write(ranked, path, target):
        with open(f"{logs}/writes{rank}.txt", "a") as f:
            f.write(f"{Path(target).name}\n")
        return real_write(ranked, path, target)

    outputs.write_prediction = write
    if crash is not None and crash[0] == rank:
        real_predict = AF2Runner.predict_item

        def predict_item(self, prepared, **kw):
            if prepared[0] == crash[1]:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return real_predict(self, prepared, **kw)

        AF2Runner.predict_item = predict_item
    rc = main(argv)
    out.flush()
    Path(f"{logs}/rc{rank}.txt").write_text(str(rc))


def _run_ranks(world: int, logs: Path, argv: list[str], crash=None, timeout: float = 400):
    """Start ``world`` ranks of ``fold-train argv`` and wait; returns their exit codes."""
    import torch.multiprocessing as mp

    logs.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(logs), argv, crash))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"ranks still running after {timeout} s"
    return [p.exitcode for p in procs]


def _log(logs: Path, what: str, rank: int) -> str:
    path = logs / f"{what}{rank}.txt"
    return path.read_text() if path.exists() else ""


def _coords(path: Path) -> np.ndarray:
    st = gemmi.read_structure(str(path))
    return np.array([a.pos.tolist() for ch in st[0] for res in ch for a in res])


# -- the policy (no processes) --------------------------------------------------------------------
def test_plan_batch_with_a_given_dap_degree():
    """``--dap D``: an input that does not fit one rank gets D ranks (not the smallest degree
    that fits), or is refused when D ranks do not fit it either."""
    from fold_train.memory_estimate import MemoryEstimate

    def est(n: int) -> MemoryEstimate:  # resident ~ n^2, transient ~ n^3
        return MemoryEstimate("test", f"N={n}", {"pair": 2 * n * n}, {"tri": n ** 3})

    estimates = {"small": est(50), "long": est(100), "longer": est(120)}
    budget = 600_000  # 50 fits one rank; 100 needs 2, 120 needs 4
    assert [(p.dap, p.replicas) for p in plan_batch(estimates, 4, budget).phases] == [
        (1, (("small",), (), (), ())), (2, (("long",), ())), (4, (("longer",),))]
    given = plan_batch(estimates, 4, budget, dap=4)
    assert [(p.dap, p.replicas) for p in given.phases] == [
        (1, (("small",), (), (), ())), (4, (("longer", "long"),))]
    two = plan_batch(estimates, 4, budget, dap=2)
    assert two.refused == ("longer",) and [p.dap for p in two.phases] == [1, 2]
    one = plan_batch(estimates, 4, budget, dap=1)  # every input on one rank, or refused
    assert one.refused == ("long", "longer") and [p.dap for p in one.phases] == [1]
    with pytest.raises(ValueError, match="does not divide the world size 4"):
        plan_batch(estimates, 4, budget, dap=3)


def test_batch_refuses_what_ranks_cannot_share(af2_ckpt, tmp_path, capsys, monkeypatch):
    src, chains = _af2_dir(tmp_path)
    base = ["predict", "--checkpoint", str(af2_ckpt), "--input-dir", str(src), "--out-dir",
            str(tmp_path / "out"), "--chains", str(chains), "--device", "cpu"]
    monkeypatch.setenv("WORLD_SIZE", "4")  # refused before any process group is started
    assert main([*base, "--dap", "3"]) == 2
    assert "--dap 3 with 4 processes" in capsys.readouterr().err
    assert main([*base, "--autochunk", "auto"]) == 2
    assert "--autochunk with --input-dir under torchrun" in capsys.readouterr().err
    assert main([*base, "--bp", "2"]) == 2
    assert "--bp with --input-dir" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([*base, "--dap", "2"]) == 2
    assert "--dap 2 with 1 processes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -- AF2: 4 ranks ---------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.slow
def test_batch_over_4_ranks_equals_one_process(af2_ckpt, tmp_path, capsys):
    src, chains = _af2_dir(tmp_path)
    common = ["predict", "--checkpoint", str(af2_ckpt), "--input-dir", str(src), "--chains",
              str(chains), "--device", "cpu"]
    # one process, all of it on one device
    assert main([*common, "--out-dir", str(tmp_path / "one")]) == 1
    capsys.readouterr()
    one = {r["name"]: r for r in json.loads((tmp_path / "one" / "batch_summary.json").read_text())}
    # 4 ranks: 38, 70 and 73 residues fit one rank; 84 and 93 need DAP 2
    budget = _budget(af2_ckpt, 73, 84)
    logs, out = tmp_path / "logs", tmp_path / "out"
    codes = _run_ranks(4, logs, [*common, "--out-dir", str(out), "--memory-limit", str(budget)])
    assert codes == [0, 0, 0, 0]  # the processes ended normally ...
    rcs = [_log(logs, "rc", r) for r in range(4)]
    assert rcs == ["1", "1", "1", "1"], [_log(logs, "stderr", r)[-2000:] for r in range(4)]
    # ... every rank with the batch's status: two inputs failed

    # the model loaded twice per rank: for DAP 1 (the sizing, and the inputs dealt out) and for
    # DAP 2 (rank 3 has no DAP 1 input, and loads the DAP 1 model for the sizing only)
    assert [_log(logs, "loads", r).count("load") for r in range(4)] == [2, 2, 2, 2]
    # each output written once, by its group's first rank
    writes = {r: _log(logs, "writes", r).split() for r in range(4)}
    assert writes == {0: ["short", "3u8v_A"], 1: ["2q2k_A"], 2: ["1psm_A", "4zey_A"], 3: []}
    assert sorted(p.name for p in out.iterdir()) == ["1psm_A", "2q2k_A", "3u8v_A", "4zey_A",
                                                     "batch_summary.json", "short"]
    # only rank 0 prints the table and says what it skipped
    table = _log(logs, "stdout", 0)
    assert "5 of 7 inputs predicted" in table
    assert all(_log(logs, "stdout", r) == "" for r in (1, 2, 3))
    err0 = _log(logs, "stderr", 0)
    assert "[skip] bad: FAILED:" in err0 and "illegal character '1'" in err0
    assert not any("[skip]" in _log(logs, "stderr", r) for r in (1, 2, 3))
    # the progress line of each input, once, from its writer
    progress = [line for r in range(4) for line in _log(logs, "stderr", r).splitlines()
                if line.startswith("[rank")]
    assert sorted(line.split("] ", 1)[1].split()[0] for line in progress) == [
        "1psm_A", "2q2k_A", "3u8v_A", "4zey_A", "bad_msa", "short"]
    assert any(line.startswith("[ranks 2-3, DAP 2] bad_msa") for line in progress)

    rows = {r["name"]: r for r in json.loads((out / "batch_summary.json").read_text())}
    assert sorted(rows) == sorted(one)
    placed = {n: (r.get("dap"), r.get("ranks")) for n, r in rows.items() if "dap" in r}
    assert placed == {"1psm_A": (1, [2]), "2q2k_A": (1, [1]), "short": (1, [0]),
                      "3u8v_A": (2, [0, 1]), "4zey_A": (2, [2, 3]), "bad_msa": (2, [2, 3])}
    # the bad A3M inside a DAP group: agreed by both ranks, reported with the file and record
    for got in (rows["bad_msa"], one["bad_msa"]):
        assert got["status"] == "failed"
        assert "hits.a3m [record 1 (hit)]: aligned length 5" in got["reason"]
    assert rows["bad"]["status"] == one["bad"]["status"] == "failed"
    # the same structures and scores as one process: DAP 1 is the same computation; DAP 2 sums
    # in another order and pads (fp32 rounding), and mmCIF keeps 3 decimals
    for name in ("short", "1psm_A", "2q2k_A", "3u8v_A", "4zey_A"):
        assert rows[name]["status"] == one[name]["status"] == "ok", name
        assert rows[name]["ranking_score"] == pytest.approx(one[name]["ranking_score"],
                                                            rel=1e-4), name
        np.testing.assert_allclose(_coords(out / name / "model.cif"),
                                   _coords(tmp_path / "one" / name / "model.cif"), atol=2e-3)
    assert rows["3u8v_A"]["mean_plddt"] != rows["4zey_A"]["mean_plddt"]  # not one result twice


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_failing_inside_a_dap_group_ends_every_rank(af2_ckpt, tmp_path):
    """Rank 1 fails with a device error (not the input's) on the DAP 2 input while rank 0 is in
    its collectives: every rank ends naming rank 1; no summary is written."""
    src, chains = _af2_dir(tmp_path)
    for p in [*src.glob("*.cif"), src / "bad.fasta", src / "bad_msa.fasta"]:
        p.unlink()  # short (73) on one rank, and a 73-residue DAP 2 input below
    shutil.copy(src / "short.fasta", src / "again.fasta")
    budget = _budget(af2_ckpt, 50, 73)
    logs = tmp_path / "logs"
    codes = _run_ranks(2, logs, ["predict", "--checkpoint", str(af2_ckpt), "--input-dir",
                                 str(src), "--out-dir", str(tmp_path / "out"), "--device", "cpu",
                                 "--memory-limit", str(budget)], crash=(1, "short"))
    said = {r: _log(logs, "stderr", r) for r in range(2)}
    expected = (f"rank 1 failed to predict the batch: RuntimeError: RuntimeError in the DAP 2 "
                f"prediction of short ({src / 'short.fasta'}): CUDA error: an illegal memory "
                "access was encountered")
    assert expected in said[1]
    assert expected in said[0]  # ended by the watcher (exit 1) or RankFailed
    assert all(c == 1 or _log(logs, "rc", r) == "1" for r, c in enumerate(codes)), codes
    assert not (tmp_path / "out" / "batch_summary.json").exists()
    assert not (tmp_path / "out" / "short").exists()  # nothing half-written


# -- AF3: 2 ranks ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def af3_ckpt(tmp_path_factory) -> Path:
    if not CCD.is_file():
        pytest.skip("bundled AF3 demo data not found")
    return _checkpoint(tmp_path_factory.mktemp("af3") / "af3.ckpt", "af3_tiny", [])


def _af3_dir(root: Path) -> Path:
    """Two AlphaFold3 input JSONs: 1PSM's chain with its real MSA and FK506 (38 + 57 = 95
    tokens), and FKBP51 with FK506 (128 + 57 = 185 tokens, no MSA)."""
    src = root / "inputs"
    src.mkdir(parents=True)
    shutil.copy(INPUTS / "fkbp51_fk506.json", src / "fkbp51.json")
    records = (DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m").read_text().split(">")
    sequence = records[1].splitlines()[1]
    doc = {"name": "1psm_fk506", "dialect": "alphafold3", "version": 2, "modelSeeds": [5],
           "sequences": [{"protein": {"id": "A", "sequence": sequence,
                                      "unpairedMsa": "".join(">" + r for r in records[1:]),
                                      "pairedMsa": ""}},
                         {"ligand": {"id": "B", "ccdCodes": ["FK5"]}}]}
    (src / "1psm.json").write_text(json.dumps(doc))
    return src


@pytest.mark.distributed
@pytest.mark.slow
def test_af3_batch_over_2_ranks_equals_one_process(af3_ckpt, tmp_path, capsys):
    """The 95-token complex on one rank, the 185-token one with DAP 2 (its tokens split, its two
    diffusion samples one per rank): every sample equals the one-process batch's."""
    from fold_train.predict_af3 import AF3Runner
    from fold_train.predict_batch import find_inputs

    src = _af3_dir(tmp_path)
    common = ["predict", "--checkpoint", str(af3_ckpt), "--input-dir", str(src), "--ccd",
              str(CCD), "--samples", "2", "--sampler-steps", "3", "--recycles", "1",
              "--device", "cpu"]
    assert main([*common, "--out-dir", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    runner = AF3Runner(af3_ckpt, ccd_files=[CCD], no_samples=2, cuda_graphs=False)
    items, _ = find_inputs(src, "af3")
    est = {i.name: runner.estimate(i)[1] for i in items}
    budget = (est["1psm"].peak_bytes + est["fkbp51"].peak_bytes) // 2
    plan = plan_batch(est, 2, budget)
    assert [(p.dap, p.replicas) for p in plan.phases] == [(1, (("1psm",), ())),
                                                          (2, (("fkbp51",),))]
    logs, out = tmp_path / "logs", tmp_path / "out"
    codes = _run_ranks(2, logs, [*common, "--out-dir", str(out), "--memory-limit", str(budget)])
    assert codes == [0, 0]
    assert [_log(logs, "rc", r) for r in range(2)] == ["0", "0"], _log(logs, "stderr", 0)[-3000:]
    writes = {r: _log(logs, "writes", r).split() for r in range(2)}
    assert writes == {0: ["1psm_fk506", "FKBP51_FK506"], 1: []}  # the JSONs' names
    assert "2 of 2 inputs predicted" in _log(logs, "stdout", 0) and _log(logs, "stdout", 1) == ""
    rows = {r["name"]: r for r in json.loads((out / "batch_summary.json").read_text())}
    assert (rows["1psm"]["dap"], rows["fkbp51"]["dap"]) == (1, 2)
    for name, seed in (("1psm_fk506", 5), ("FKBP51_FK506", 7)):
        for sample in (0, 1):
            folder = f"{name}/seed-{seed}_sample-{sample}/model.cif"
            a, b = _coords(out / folder), _coords(tmp_path / "one" / folder)
            # mmCIF's 3 decimals, and fp32 rounding of coordinates of ~1e3 A (an untrained
            # model): as test_predict_dap's one-input AF3 comparison
            np.testing.assert_allclose(a, b, atol=5e-3 + 1e-6 * np.abs(b).max())
        # each sample its own draws: a wrong share of the samples over the ranks would show
        s0, s1 = (_coords(out / f"{name}/seed-{seed}_sample-{k}/model.cif") for k in (0, 1))
        assert np.abs(s0 - s1).max() > 0.1
