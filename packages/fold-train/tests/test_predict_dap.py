"""``fold-train predict`` under DAP (fold_train.predict_dap), on gloo CPU ranks: the prediction of
2 and 4 ranks equals the one-process prediction (AF2: Evoformer, extra MSA and template stacks
split; AF3: MSA module, Pairformer, template embedder split and the diffusion samples shared),
with residues / tokens / MSA rows padded to a multiple of the ranks and masks with holes; one rank
failing ends every rank with an error naming it; only rank 0 writes. Plus the per-rank memory
plan and the batch dispatch policy (no processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _af3_helpers import CCD
from _train_helpers import DEMO
from fold_train.memory_estimate import MemoryEstimate
from fold_train.predict_dap import (
    PredictParallel,
    RankFailed,
    choose_dap,
    plan_batch,
    rank_estimate,
)

MONOMER = DEMO / "monomer"
FASTA = MONOMER / "short.fasta"  # 73 residues: odd, padded to 74 (2 ranks) / 76 (4 ranks)
MSAS = [MONOMER / n for n in ("bfd_uniclust_hits.a3m", "mgnify_hits.sto", "uniref90_hits.sto")]
# its template hits: 3U8V_A, 4ZEY_A, 1PSM_A, 3ZEE_A are bundled (aligned rows only: masks with
# holes); the first two hits' mmCIFs are not, and are skipped with a warning
TEMPLATES = {"template_hits": MONOMER / "pdb70_hits.hhr", "template_mmcif_dir": DEMO / "mmcifs"}
pytestmark = pytest.mark.filterwarnings("ignore:2 template hits skipped")
# odd MSA depths: N_seq = n_clust + n_templ = 5 + 2 and N_extra = 7 are padded too
AF2_OVERRIDES = ["data.n_clust=5", "data.n_extra=7", "data.n_templ=2", "max_recycling_iters=1"]


# -- memory plan and dispatch (no processes) ------------------------------------------------------
def _est(n: int) -> MemoryEstimate:
    """A made-up estimate of an input of ``n`` residues: resident ~ n^2, transient ~ n^3."""
    return MemoryEstimate("test", f"N={n}", {"pair": 2 * n * n}, {"tri": n ** 3})


def test_rank_estimate_splits_transients_and_half_of_the_resident():
    est = _est(100)
    assert rank_estimate(est, 1) is est
    r4 = rank_estimate(est, 4)
    assert r4.transient == {"tri": 100 ** 3 // 4}
    assert r4.resident == {"pair": int(2 * 100 * 100 * (1 + 1 / 4) / 2)}
    assert r4.peak_bytes < est.peak_bytes and "DAP 4" in r4.what
    with pytest.raises(ValueError, match="DAP degree"):
        rank_estimate(est, 0)


def test_choose_dap_picks_the_smallest_degree_that_fits():
    est = _est(100)  # peak 20_000 + 1_000_000
    assert choose_dap(est, 2_000_000, 8) == 1
    assert choose_dap(est, 600_000, 8) == 2  # 15_000 + 500_000
    assert choose_dap(est, 300_000, 8) == 4
    assert choose_dap(est, 300_000, 6) == 6  # the degrees are the divisors of the world: 1 2 3 6
    assert choose_dap(est, 100_000, 8) is None  # not even on 8 ranks (8 * 100_000 < 1e6)


def test_preflight_refusal_names_the_gpus_that_would_fit(af2_ckpt):
    """An input too large for one device is refused with the DAP degree that would fit it."""
    from fold_data.limits import InputTooLarge
    from fold_train.memory_estimate import af2_estimate
    from fold_train.predict import load_trained_model
    from fold_train.predict_size import check_af2_input

    _, cfg = load_trained_model(af2_ckpt, "cpu")
    kw = dict(fasta=FASTA, msas=MSAS, model_config=cfg.model_config(),
              data_preset=cfg.data_preset(), precision="fp32", device="cpu")
    est = af2_estimate(73, cfg.model_config(), cfg.data_preset())
    budget = int(rank_estimate(est, 3).peak_bytes / 0.75)  # fits 3 ranks (no warning), not 2
    assert rank_estimate(est, 2).peak_bytes > budget
    with pytest.raises(InputTooLarge, match=r"split it over 3 GPUs with DAP.*--nproc-per-node 3"):
        check_af2_input(**kw, memory_limit=budget)
    check_af2_input(**kw, memory_limit=budget, dap=3)  # the per-rank plan fits
    # under DAP the chunking a refusal suggests is the chunk size per rank, not AutoChunk
    with pytest.raises(InputTooLarge, match="chunk each rank's shard: --chunk-size 64") as info:
        check_af2_input(**kw, memory_limit=budget, dap=2)
    assert "--autochunk" not in str(info.value)
    with pytest.raises(InputTooLarge, match="not even 64"):
        check_af2_input(**kw, memory_limit=1000)


def test_plan_batch_distributes_inputs_that_fit_and_gives_dap_to_the_others():
    budget = 600_000
    estimates = {f"s{i}": _est(n) for i, n in enumerate((50, 60, 40, 70, 30))}  # fit one rank
    estimates["long"] = _est(100)  # needs DAP 2
    estimates["longer"] = _est(120)  # 1.7e6 / 4 + ...: needs DAP 4 (of 4)
    estimates["huge"] = _est(400)  # does not fit 4 ranks
    plan = plan_batch(estimates, 4, budget)
    assert [p.dap for p in plan.phases] == [1, 2, 4]
    assert plan.refused == ("huge",)
    singles = plan.phases[0].replicas
    assert len(singles) == 4 and sorted(n for r in singles for n in r) == \
        ["s0", "s1", "s2", "s3", "s4"]
    # largest first to the least loaded rank: 70 -> 0, 60 -> 1, 50 -> 2, 40 -> 3, 30 -> 3
    assert singles == (("s3",), ("s1",), ("s0",), ("s2", "s4"))
    assert plan.phases[1].replicas == (("long",), ())  # replica 0 = ranks 0, 1
    assert list(plan.phases[1].ranks(1)) == [2, 3]
    assert plan.phases[2].replicas == (("longer",),)
    # every rank knows its own work, in phase order
    assert plan.work_of(3) == [(1, 3, "s2"), (1, 3, "s4"), (4, 0, "longer")]
    assert plan.work_of(0) == [(1, 0, "s3"), (2, 0, "long"), (4, 0, "longer")]
    # one rank: everything that fits runs there, in order of size
    one = plan_batch(estimates, 1, 10 ** 9)
    assert one.phases[0].replicas == (("huge", "longer", "long", "s3", "s1", "s0", "s2", "s4"),)
    with pytest.raises(ValueError, match="world_size"):
        plan_batch(estimates, 0, budget)


def test_sample_share_covers_every_sample_once():
    for dap in (1, 2, 3, 4):
        for s in (1, 2, 3, 5, 8):
            shares = [PredictParallel(r, r, dap).sample_share(s) for r in range(dap)]
            assert shares[0][1] == s and shares[0][0] < s  # the writer always has a sample
            ordered = sorted(shares)
            assert ordered[0][0] == 0 and ordered[-1][1] == s
            assert all(a[1] == b[0] for a, b in zip(ordered, ordered[1:]))


# -- checkpoints of tiny models with every weight off its initial value ------------------------
def _checkpoint(path: Path, preset_name: str, overrides: list[str]) -> Path:
    from fold_train.checkpoint import save_checkpoint
    from fold_train.config import apply_overrides, preset
    from fold_train.families import make_family

    cfg = apply_overrides(preset(preset_name), overrides)
    model = make_family(cfg.model.family).build_model(cfg.model_config())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # AF's zero-initialised output projections would hide the trunk
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return save_checkpoint(path, {"config": cfg.to_dict(), "model": model.state_dict()})


@pytest.fixture(scope="module")
def af2_ckpt(tmp_path_factory) -> Path:
    if not FASTA.is_file():
        pytest.skip(f"bundled demo data not found at {MONOMER}")
    return _checkpoint(tmp_path_factory.mktemp("af2") / "af2.ckpt", "tiny", AF2_OVERRIDES)


@pytest.fixture(scope="module")
def af2_parallel_ckpt(tmp_path_factory) -> Path:
    """The same tiny AF2 with the Parallel Evoformer block order (what BP splits)."""
    if not FASTA.is_file():
        pytest.skip(f"bundled demo data not found at {MONOMER}")
    return _checkpoint(tmp_path_factory.mktemp("af2p") / "af2p.ckpt", "tiny",
                       [*AF2_OVERRIDES, "model.block_order=parallel"])


@pytest.fixture(scope="module")
def af3_json(tmp_path_factory) -> Path:
    """An AlphaFold3 input JSON of 1PSM's chain with its real MSA less its last row (11 rows:
    padded to 12 on 4 ranks) and FK506 (57 atoms, one token each): 38 + 57 = 95 tokens."""
    a3m = DEMO / "alignments" / "1psm_A" / "bfd_uniclust_hits.a3m"
    if not a3m.is_file() or not CCD.is_file():
        pytest.skip("bundled demo data not found")
    records = a3m.read_text().split(">")[1:]
    text = "".join(">" + r for r in records[:-1])
    sequence = records[0].splitlines()[1]
    doc = {"name": "1psm_fk506", "dialect": "alphafold3", "version": 2, "modelSeeds": [5],
           "sequences": [{"protein": {"id": "A", "sequence": sequence, "unpairedMsa": text,
                                      "pairedMsa": ""}},
                         {"ligand": {"id": "B", "ccdCodes": ["FK5"]}}]}
    path = tmp_path_factory.mktemp("af3_json") / "input.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def af3_ckpt(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("af3") / "af3.ckpt", "af3_tiny", [])


# -- what one rank (or the one process) computes ------------------------------------------------
def _af2_batch(cfg, holes: bool = True, templates: bool = True) -> dict[str, torch.Tensor]:
    """The inference sample of the bundled 73-residue query with its MSAs and templates, with
    holes punched into the MSA masks (20% of the cluster and extra MSA positions of real
    residues)."""
    from fold_data.af2 import make_sample
    from fold_train.data import collate
    from fold_train.predict import make_raw_features

    _, raw, _ = make_raw_features(fasta=FASTA, msas=MSAS, **(TEMPLATES if templates else {}))
    batch = collate([make_sample(raw, cfg.data_preset(), seed=0, training=False)])
    g = torch.Generator().manual_seed(9)
    for k in ("msa_mask", "extra_msa_mask") if holes else ():
        keep = (torch.rand(batch[k].shape, generator=g) > 0.2).float()
        keep[..., 0, :] = 1.0  # the query row stays whole
        batch[k] = batch[k] * keep
    return batch


def _predict_af2(ckpt: Path, parallel: PredictParallel | None, holes: bool = True,
                 chunk_size: int | None = None, templates: bool = True
                 ) -> dict[str, torch.Tensor]:
    from fold_train.families import make_family
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model
    from fold_train.predict_graphs import AF2Predictor

    model, cfg = load_trained_model(ckpt, "cpu")
    parallel = parallel or PredictParallel(0, 0, 1)
    done = parallelize(model, make_family("af2", cfg.model_config()),
                       parallel.adjust(Techniques(chunk_size=chunk_size)))
    # DAP: Evoformer, extra MSA and template stacks; BP: Evoformer and extra MSA stacks
    assert len(done.parallel_handles) == 3 * (parallel.dap > 1) + 2 * (parallel.bp > 1)
    batch = _af2_batch(cfg, holes, templates)
    assert batch["template_mask"][0, 0].tolist() == ([1.0, 1.0] if templates else [0.0, 0.0])
    out = AF2Predictor(model, "cpu", cuda_graphs=False)(batch)
    return {k: v.detach().clone() for k, v in out.items()}


def _predict_af3(ckpt: Path, source: Path, parallel: PredictParallel | None):
    from fold_data.af3 import Ccd, make_sample
    from fold_train.data import collate
    from fold_train.families import make_family
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model
    from fold_train.predict_af3 import make_af3_inputs, predict_af3
    from fold_train.predict_graphs import AF3Predictor

    model, cfg = load_trained_model(ckpt, "cpu", family="af3")
    parallel = parallel or PredictParallel(0, 0, 1)
    done = parallelize(model, make_family("af3", cfg.model_config()),
                       parallel.adjust(Techniques()))
    assert len(done.parallel_handles) == (3 if parallel.dap > 1 else 0)
    _, raw = make_af3_inputs(source, Ccd([CCD], use_biotite=False))
    pred = predict_af3(model, raw, seed=5, device="cpu", no_samples=3, no_steps=3,
                       no_cycles=2, cuda_graphs=False, parallel=parallel)
    # every sample, and the trunk's distogram: what predict_af3 does before it keeps the best
    batch = parallel.pad_af3(collate([make_sample(raw, "af3_predict", seed=5)]))
    share = parallel.sample_share(3) if parallel.dap > 1 else None
    out = AF3Predictor(model, "cpu", cuda_graphs=False)(
        batch, generator=torch.Generator().manual_seed(5), no_cycles=2, no_samples=3,
        no_steps=3, sample_share=share)
    samples = parallel.gather_samples(out, AF3Predictor.PER_SAMPLE)
    return {"positions": torch.from_numpy(pred.positions), "plddt": torch.from_numpy(pred.plddt),
            "sample_plddt": torch.from_numpy(pred.sample_plddt), "x": samples["x"],
            "sample_atom_plddt": samples["plddt"], "distogram_logits": out["distogram_logits"],
            "n_token": int(len(raw["asym_id"])), "n_msa": int(raw["msa"].shape[0]),
            "padded": (batch["token_mask"].shape[-1], batch["msa_mask"].shape[-2])}


def _worker(rank: int, world: int, init: str, out_dir: str, kind: str, args: tuple,
            bp: int = 1) -> None:
    import torch.distributed as dist
    from fold_train.distributed import DistContext, model_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ctx = model_parallel(DistContext(rank, world, torch.device("cpu"), None),
                             dap=world // bp, bp=bp)
        g = ctx.groups
        parallel = PredictParallel(rank, g.dap_index, world // bp, g, bp=bp,
                                   bp_rank=g.bp_index)
        if kind == "af2":
            ckpt, chunk_size = args
            out = _predict_af2(ckpt, parallel, chunk_size=chunk_size)
        else:
            out = _predict_af3(*args, parallel)
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _spawn(kind: str, world: int, tmp_path: Path, *args, bp: int = 1) -> list[dict]:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, f"file://{tmp_path}/store", str(tmp_path), kind, args, bp),
             nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b - mean(b)|``: relative to the reference's variation (pLDDT sits near 50
    with little spread in an untrained model; its offset would hide errors)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b - b.mean()).norm().clamp_min(1e-30))


# fp32 prediction: DAP sums the outer product mean and the triangle updates over another split
# and pads; each differs from the one-process value by rounding (measured: ~2e-7 of the
# coordinates' and logits' spread, ~4e-5 of pLDDT's tiny spread in an untrained model). 2e-4 is
# far below a real difference: the MSA holes alone move every output by > 100x that.
TOL = 2e-4


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world, chunk_size", [(2, None), (4, None), (2, 8)])
def test_af2_dap_prediction_equals_one_process(af2_ckpt, tmp_path, world, chunk_size):
    """Also with each rank's shard chunked (--chunk-size 8: 37-row shards in 5 chunks)."""
    torch.set_num_threads(1)
    ref = _predict_af2(af2_ckpt, None)
    assert ref["final_atom_positions"].shape[1] == 73  # unpadded: DAP's padding is cropped
    got = _spawn("af2", world, tmp_path, af2_ckpt, chunk_size)
    for rank, out in enumerate(got):  # every rank holds the whole result
        assert sorted(out) == sorted(ref)
        for k, v in ref.items():
            assert out[k].shape == v.shape, (rank, k)
            assert torch.isfinite(out[k]).all(), (rank, k)
            err = _rel(out[k], v)
            assert err < TOL, (rank, k, err)
    # the MSA and the templates (what DAP splits) reach every output: without the holes or the
    # templates they move by far more than TOL, so agreeing within TOL is not agreeing on a
    # trunk that does nothing
    for other in (_predict_af2(af2_ckpt, None, holes=False),
                  _predict_af2(af2_ckpt, None, templates=False)):
        for k, v in ref.items():
            if k != "final_atom_mask":  # the atoms of the sequence: no function of the MSA
                assert _rel(other[k], v) > 100 * TOL, k


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_af2_bp_prediction_equals_one_process(af2_parallel_ckpt, tmp_path, world):
    """Branch Parallelism (Parallel Evoformer): BP 2 on 2 ranks, BP 2 x DAP 2 on 4."""
    torch.set_num_threads(1)
    ref = _predict_af2(af2_parallel_ckpt, None)
    got = _spawn("af2", world, tmp_path, af2_parallel_ckpt, None, bp=2)
    for rank, out in enumerate(got):
        for k, v in ref.items():
            err = _rel(out[k], v)
            assert err < TOL, (rank, k, err)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_af3_dap_prediction_equals_one_process(af3_ckpt, af3_json, tmp_path, world):
    torch.set_num_threads(1)
    ref = _predict_af3(af3_ckpt, af3_json, None)
    assert ref["n_token"] == 95 and ref["n_msa"] == 11  # padded to 96 and 12 under DAP
    assert ref["sample_plddt"].shape == (3,)  # 3 samples: 2+1 on 2 ranks, 1+1+1+0 on 4
    got = _spawn("af3", world, tmp_path, af3_ckpt, af3_json)
    assert ref["padded"] == (95, 11)
    for rank, out in enumerate(got):
        assert out["padded"] == (96, 12)  # tokens and MSA rows: multiples of 2 and 4
        for k in ("x", "sample_atom_plddt", "distogram_logits"):  # every sample
            assert out[k].shape == ref[k].shape, (rank, k)
            err = _rel(out[k], ref[k])
            assert err < TOL, (rank, k, err)
        # mean pLDDT per sample: equal to rounding (an untrained head gives all samples ~50)
        torch.testing.assert_close(out["sample_plddt"], ref["sample_plddt"], rtol=1e-6, atol=0)
        # the structure kept is one of the one-process samples (which of samples whose
        # ranking scores tie to rounding, as an untrained model's do, is kept is rounding too)
        assert min(_rel(out["positions"], ref["x"][0, s].double()) for s in range(3)) < TOL
    x = ref["x"][0]  # [S, N_atom, 3]: each sample its own draws, so a wrong share would show
    assert _rel(x[1], x[0]) > 1e-2 and _rel(x[2], x[1]) > 1e-2


# -- failures ------------------------------------------------------------------------------------
def _failing_worker(rank: int, world: int, init: str, out_dir: str, fail_rank: int) -> None:
    """Rank ``fail_rank`` raises (a bad input only it sees); the others block in a collective
    it never joins; their stderr goes to a file per rank."""
    import torch.distributed as dist
    from fold_train.distributed import DistContext
    from fold_train.predict_dap import fail_together

    err = open(f"{out_dir}/stderr{rank}.txt", "w")
    os.dup2(err.fileno(), 2)
    sys.stderr = err
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=120))
    ctx = DistContext(rank, world, torch.device("cpu"), None)
    try:
        with fail_together(ctx, "predict"):
            if rank == fail_rank:
                raise ValueError(f"/data/q{rank}.a3m, record 3: expected an A3M sequence")
            dist.all_reduce(torch.ones(3))  # waits for the failed rank
        result = "finished"
    except RankFailed as e:
        result = f"RankFailed: {e}"
    Path(f"{out_dir}/result{rank}.txt").write_text(result)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_one_rank_failing_ends_every_rank_with_its_name(tmp_path, world):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    init = f"file://{tmp_path}/store"
    procs = [ctx.Process(target=_failing_worker, args=(r, world, init, str(tmp_path), 1))
             for r in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    elapsed = time.monotonic() - start
    assert not any(p.is_alive() for p in procs)
    assert elapsed < 60  # ended by the failure, not by the 120 s collective timeout
    # the failed rank: its own error, named
    res = (tmp_path / "result1.txt").read_text()
    assert res.startswith("RankFailed: rank 1 failed to predict: ValueError: /data/q1.a3m")
    reason = ("rank 1 failed to predict: ValueError: /data/q1.a3m, record 3: expected an A3M "
              "sequence")
    for r in range(world):
        if r == 1:
            continue
        result = tmp_path / f"result{r}.txt"
        if procs[r].exitcode == 1:
            # blocked in the collective: ended by the watcher, the reason on stderr
            assert not result.exists()
            assert f"{reason}; rank {r} stops" in (tmp_path / f"stderr{r}.txt").read_text()
        else:
            # its collective broke first (gloo: the failed rank's connection closed), so its
            # own block raised: RankFailed naming rank 1 (fail_together's documented path;
            # seen at 4 ranks on a loaded 2-core machine)
            assert procs[r].exitcode == 0, (r, procs[r].exitcode)
            text = result.read_text()
            assert text.startswith(f"RankFailed: {reason}; rank {r} stopped"), text


# -- the command line under torchrun ------------------------------------------------------------
def _torchrun(n: int, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(n), "-m", "fold_train.cli", *args]
    return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          capture_output=True, text=True, timeout=300)


def _coords(path: Path) -> np.ndarray:
    import gemmi

    st = gemmi.read_structure(str(path))
    return np.array([a.pos.tolist() for ch in st[0] for res in ch for a in res])


@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_predict_dap_writes_once_and_matches_one_process(af2_ckpt, tmp_path, capsys):
    from fold_train.cli import main

    args = ["predict", "--checkpoint", str(af2_ckpt), "--fasta", str(FASTA), "--msa",
            *map(str, MSAS), "--templates", str(TEMPLATES["template_hits"]),
            "--template-mmcif-dir", str(TEMPLATES["template_mmcif_dir"]), "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "one.cif")]) == 0
    one = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    proc = _torchrun(2, [*args, "--out", str(tmp_path / "dap" / "q.cif"), "--dap", "2"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1  # rank 0 prints the summary
    summary = lines[0]
    assert summary["dap"] == 2 and summary["n_res"] == 73 and summary["cuda_graphs"] is False
    assert summary["mean_plddt"] == pytest.approx(one["mean_plddt"], rel=1e-4)
    assert sorted(p.name for p in (tmp_path / "dap").iterdir()) == ["q.cif"]  # one file
    # mmCIF keeps 3 decimals: equal up to that rounding
    np.testing.assert_allclose(_coords(tmp_path / "dap" / "q.cif"), _coords(tmp_path / "one.cif"),
                               atol=2e-3)

    # a rank that fails: every rank ends, the error names it, nothing is written
    proc = _torchrun(2, [*args, "--out", str(tmp_path / "fail" / "q.cif")],
                     env={"FOLD_PREDICT_FAIL_RANK": "1"})
    assert proc.returncode != 0
    assert "rank 1 failed to predict: RuntimeError: injected failure" in proc.stderr
    assert not (tmp_path / "fail").exists()


def test_dap_refuses_autochunk_and_a_world_of_another_size(af2_ckpt, capsys, monkeypatch):
    from fold_train.cli import main

    base = ["predict", "--checkpoint", str(af2_ckpt), "--fasta", str(FASTA), "--device", "cpu"]
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([*base, "--dap", "2"]) == 2
    assert "--dap 2 with 1 processes" in capsys.readouterr().err
    assert main([*base, "--dap", "1", "--search", "x.toml"]) == 2
    assert "--search with --dap" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")  # refused before any process group is started
    assert main([*base, "--dap", "2", "--autochunk", "auto"]) == 2
    assert "under --dap > 1 chunk each rank's shard with --chunk-size" in capsys.readouterr().err
    assert main([*base, "--dap", "2", "--bp", "2"]) == 2
    assert "--dap 2 x --bp 2 with 2 processes" in capsys.readouterr().err
    af3 = ["predict", "--checkpoint", "x.ckpt", "--json", "x.json", "--bp", "2"]
    assert main(af3) == 2
    assert "--bp 2: branch parallelism is the AF2 Parallel Evoformer's" in \
        capsys.readouterr().err


# -- a batch over the ranks: one-GPU inputs dealt out, DAP for the larger -------------------------
def _chain(pdb: str) -> dict:
    folder = DEMO / "alignments" / f"{pdb}_A"
    return {"mmcif": DEMO / "mmcifs" / f"{pdb}.cif", "chain": "A",
            "msas": [folder / n for n in ("bfd_uniclust_hits.a3m", "mgnify_hits.sto",
                                          "uniref90_hits.sto")]}


# real chains of 38, 70, 73, 84 and 93 residues
BATCH = {"1psm_A": _chain("1psm"), "2q2k_A": _chain("2q2k"),
         "short": {"fasta": FASTA, "msas": MSAS}, "4zey_A": _chain("4zey"),
         "3u8v_A": _chain("3u8v")}


def _batch_estimates(ckpt: Path, inputs: dict) -> tuple[dict, int]:
    """One-device estimates of the batch's inputs (sized as predict sizes them) and a budget
    that the three shorter ones fit and the two longer ones do not."""
    from fold_data.limits import sequence_size
    from fold_train.memory_estimate import af2_estimate
    from fold_train.predict import load_trained_model, read_query

    _, cfg = load_trained_model(ckpt, "cpu")
    est = {}
    for name, kw in inputs.items():
        if "fasta" in kw:  # an empty (bad) file: sized as 70 residues, fails when read
            seq = read_query(kw["fasta"])[1] if kw["fasta"].stat().st_size else "A" * 70
        else:
            from fold_data.mmcif import parse_mmcif

            seq = parse_mmcif(kw["mmcif"]).get_chain(kw["chain"]).sequence
        n = sequence_size(name, seq, []).n_tokens
        est[name] = af2_estimate(n, cfg.model_config(), cfg.data_preset())
    budget = (est["short"].peak_bytes + est["4zey_A"].peak_bytes) // 2
    return est, budget


def _batch_predict(ckpt: Path, inputs: dict, name: str, parallel: PredictParallel) -> dict:
    """``predict_one`` of the batch: what ``Family.predict`` does for one input, as this rank's
    part of ``parallel``."""
    from fold_train.families import make_family
    from fold_train.parallelize import Techniques, parallelize
    from fold_train.predict import load_trained_model, make_raw_features, predict_structure

    model, cfg = load_trained_model(ckpt, "cpu")
    parallelize(model, make_family("af2", cfg.model_config()), parallel.adjust(Techniques()))
    _, raw, _ = make_raw_features(**inputs[name])
    pred = predict_structure(model, raw, cfg.data_preset(), device="cpu", cuda_graphs=False)
    return {"positions": torch.from_numpy(pred.positions), "dap": parallel.dap,
            "rank": parallel.rank}


def _batch_worker(rank: int, world: int, init: str, out_dir: str, ckpt: Path,
                  inputs: dict) -> None:
    import torch.distributed as dist
    from fold_train.distributed import DistContext
    from fold_train.predict_dap import dispatch_batch

    torch.set_num_threads(1)
    err = open(f"{out_dir}/stderr{rank}.txt", "w")
    os.dup2(err.fileno(), 2)
    sys.stderr = err
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = DistContext(rank, world, torch.device("cpu"), None)
    est, budget = _batch_estimates(ckpt, inputs)
    try:
        out = dispatch_batch(ctx, est, budget, lambda n, p: _batch_predict(ckpt, inputs, n, p))
    except RankFailed as e:
        out = f"RankFailed: {e}"
    torch.save(out, f"{out_dir}/rank{rank}.pt")


@pytest.mark.distributed
@pytest.mark.slow
def test_batch_deals_short_inputs_to_ranks_and_splits_long_ones_with_dap(af2_ckpt, tmp_path):
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    est, budget = _batch_estimates(af2_ckpt, BATCH)
    plan = plan_batch(est, 4, budget)
    assert [(p.dap, p.replicas) for p in plan.phases] == [
        (1, (("short",), ("2q2k_A",), ("1psm_A",), ())),  # fit one rank: one each
        (2, (("3u8v_A",), ("4zey_A",)))]  # DAP 2: ranks 0-1 and 2-3 side by side
    mp.spawn(_batch_worker, args=(4, f"file://{tmp_path}/store", str(tmp_path), af2_ckpt, BATCH),
             nprocs=4, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert all(torch.load(tmp_path / f"rank{r}.pt", weights_only=False) is None
               for r in (1, 2, 3))  # results come back on rank 0
    assert sorted(got) == sorted(BATCH)
    where = {n: (r["dap"], r["rank"]) for n, r in got.items()}
    assert where == {"short": (1, 0), "2q2k_A": (1, 1), "1psm_A": (1, 2), "3u8v_A": (2, 0),
                     "4zey_A": (2, 2)}  # reported by the writer of each input
    for name, r in got.items():
        ref = _batch_predict(af2_ckpt, BATCH, name, PredictParallel(0, 0, 1))["positions"]
        err = _rel(r["positions"], ref)
        assert err < TOL, (name, err)


@pytest.mark.distributed
def test_batch_with_a_bad_file_on_one_rank_ends_every_rank(af2_ckpt, tmp_path):
    """The FASTA dealt to rank 1 is empty: rank 1 fails naming the file, the others (done with
    their own inputs, waiting for the DAP phase) end with rank 1's error."""
    import torch.multiprocessing as mp

    bad = tmp_path / "bad.fasta"
    bad.write_text("")
    inputs = {**BATCH, "2q2k_A": {"fasta": bad, "msas": []}}
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_batch_worker,
                         args=(r, 4, f"file://{tmp_path}/store", str(tmp_path), af2_ckpt,
                               inputs)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert not any(p.is_alive() for p in procs)
    mine = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert mine.startswith("RankFailed: rank 1 failed to predict the batch: InputError: ")
    assert "bad.fasta: no sequences: expected at least one '>' record" in mine
    for r in (0, 2, 3):
        path = tmp_path / f"rank{r}.pt"
        said = (torch.load(path, weights_only=False) if path.exists()
                else (tmp_path / f"stderr{r}.txt").read_text())
        assert "rank 1 failed to predict the batch: InputError: " in said, (r, said)


@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_predict_dap_af3_json(af3_ckpt, af3_json, tmp_path, capsys):
    """``torchrun --nproc-per-node 2 ... predict --json`` (95 tokens and 11 MSA rows padded; one
    sample, drawn on rank 0, none on rank 1): one mmCIF, by rank 0, equal to the one-process
    prediction. (One sample: an untrained confidence head ties the samples' pLDDT, and which of
    tied samples is written is rounding; the sample split itself is compared sample by sample in
    test_af3_dap_prediction_equals_one_process.)"""
    from fold_train.cli import main

    args = ["predict", "--checkpoint", str(af3_ckpt), "--json", str(af3_json), "--ccd",
            str(CCD), "--samples", "1", "--sampler-steps", "3", "--recycles", "2", "--device",
            "cpu"]
    assert main([*args, "--out", str(tmp_path / "one.cif")]) == 0
    one = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    proc = _torchrun(2, [*args, "--out", str(tmp_path / "dap" / "c.cif"), "--dap", "2"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1 and lines[0]["dap"] == 2
    assert lines[0]["n_token"] == one["n_token"] == 95
    np.testing.assert_allclose(lines[0]["sample_mean_plddt"], one["sample_mean_plddt"],
                               rtol=1e-5)
    assert sorted(p.name for p in (tmp_path / "dap").iterdir()) == ["c.cif"]
    a, b = _coords(tmp_path / "dap" / "c.cif"), _coords(tmp_path / "one.cif")
    # mmCIF's 3 decimals, and fp32 rounding of coordinates of ~1e3 A (an untrained model)
    np.testing.assert_allclose(a, b, atol=5e-3 + 1e-6 * np.abs(b).max())
