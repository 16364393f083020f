"""``fold-train predict`` outputs: AlphaFold3's layout (per-sample folders, the top one again,
``ranking_scores.csv``), the two JSON files against their schema and against the model's own
outputs for the same seed, the ranking order, ``--seeds`` / ``--samples``, the single-file
``--out`` kept working, and ``--input-dir`` with one bad input among good ones.

The checkpoints are tiny models with noise added to every parameter, so the zero-initialised
heads give confidences that differ between inputs, seeds and samples."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import gemmi
import numpy as np
import pytest
import torch
from _af3_helpers import CCD, INPUTS, needs_af3_demo
from _train_helpers import DEMO
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.confidence_outputs import validate_sample

MONO = DEMO / "monomer"
SAMPLE_FILES = ("model.cif", "summary_confidences.json", "confidences.json")
# The files round as AF3's do: pLDDT and contact probabilities to 0.01, PAE / PDE to 0.1,
# scores to 1e-4; comparisons allow half a unit of the last digit plus float32 noise.
PLDDT_TOL, PAE_TOL, SCORE_TOL = 0.0051, 0.051, 6e-5


def _noisy_checkpoint(path: Path, preset: str, overrides: dict | None = None) -> Path:
    from fold_train.config import TrainConfig
    from fold_train.config import preset as get_preset
    from fold_train.families import make_family

    cfg = get_preset(preset)
    if overrides:
        d = cfg.to_dict()
        d["model"]["overrides"] = overrides
        cfg = TrainConfig.from_dict(d)
    mc = cfg.model_config()
    torch.manual_seed(0)
    model = make_family(cfg.model.family, mc).build_model(mc)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return save_checkpoint(path, {"format": "fold-train/1", "config": cfg.to_dict(),
                                  "model": {k: v.detach().clone()
                                            for k, v in model.state_dict().items()}})


@pytest.fixture(scope="module")
def af2_checkpoint(tmp_path_factory) -> Path:
    """The tiny AF2 preset with the pTM head (AF2's ``_ptm`` models)."""
    if not MONO.is_dir():
        pytest.skip("bundled demo data not found")
    return _noisy_checkpoint(tmp_path_factory.mktemp("af2") / "af2.ckpt", "tiny",
                             {"heads.tm_enabled": True})


def _read_sample(folder: Path) -> tuple[dict, dict]:
    summary = json.loads((folder / "summary_confidences.json").read_text())
    full = json.loads((folder / "confidences.json").read_text())
    validate_sample(summary, full)
    return summary, full


def _check_layout(root: Path, expected: set[tuple[int, int]]) -> list[tuple[int, int, float]]:
    """Every sample's folder and files, valid; ``ranking_scores.csv`` best first with the
    summaries' scores; the top-ranked sample's files again at the top. Returns the rows."""
    with open(root / "ranking_scores.csv", newline="") as f:
        rows = [(int(r["seed"]), int(r["sample"]), float(r["ranking_score"]))
                for r in csv.DictReader(f)]
    assert {(s, k) for s, k, _ in rows} == expected and len(rows) == len(expected)
    scores = [r[2] for r in rows]
    assert scores == sorted(scores, reverse=True)
    for seed, sample, score in rows:
        folder = root / f"seed-{seed}_sample-{sample}"
        summary, full = _read_sample(folder)
        assert (summary["seed"], summary["sample"]) == (seed, sample)
        assert summary["ranking_score"] == pytest.approx(score, abs=SCORE_TOL)  # rounded
        # the mmCIF's B-factors are the file's per-atom pLDDT, atom for atom
        st = gemmi.read_structure(str(folder / "model.cif"))
        b = [a.b_iso for ch in st[0] for res in ch for a in res]
        chains = [ch.name for ch in st[0] for res in ch for a in res]
        assert np.allclose(b, full["atom_plddts"], atol=PLDDT_TOL)
        assert chains == full["atom_chain_ids"]
    best = root / f"seed-{rows[0][0]}_sample-{rows[0][1]}"
    for name in SAMPLE_FILES:
        assert (root / name).read_bytes() == (best / name).read_bytes()
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # no temporary
    return rows


def test_ranking_order_and_top_level_copy(tmp_path):
    """rank / write_ranked on hand-made scores: best first, ties by (seed, sample), an undefined
    (NaN) score last; ranking_scores.csv in that order; the top one's files at the top."""
    from fold_data.af2.write import Prediction, prediction_to_structure
    from fold_train.confidence_outputs import SampleResult, rank, write_ranked

    def result(seed: int, sample: int, score: float) -> SampleResult:
        n = 3
        pred = Prediction(aatype=np.zeros(n, np.int64), positions=np.full((n, 37, 3), seed * 1.0),
                          atom_mask=np.eye(37)[[1] * n], plddt=np.full(n, 50.0 + sample))
        summary = {"ranking_score": None if np.isnan(score) else score, "seed": seed}
        return SampleResult(seed, sample, prediction_to_structure(pred, "x"), summary,
                            {"seed": seed}, score=score)

    results = [result(1, 0, 0.5), result(1, 1, float("nan")), result(2, 0, 0.9),
               result(2, 1, 0.5), result(0, 3, 0.7)]
    order = [(r.seed, r.sample) for r in rank(results)]
    assert order == [(2, 0), (0, 3), (1, 0), (2, 1), (1, 1)]
    write_ranked(tmp_path, results)
    with open(tmp_path / "ranking_scores.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["seed"]), int(r["sample"])) for r in rows] == order
    assert rows[0]["ranking_score"] == "0.9" and rows[-1]["ranking_score"] == ""  # NaN: empty
    for name in SAMPLE_FILES:
        assert (tmp_path / name).read_bytes() == (tmp_path / "seed-2_sample-0" / name).read_bytes()
    assert json.loads((tmp_path / "summary_confidences.json").read_text())["ranking_score"] == 0.9


def test_confidence_arrays_stay_arrays_until_written():
    """The [N, N] matrices are rounded numpy arrays in a SampleResult (no Python lists for a
    prediction that writes no --out-dir) and written as the nested lists AF3 writes; a
    non-finite value is refused, not written as NaN."""
    from fold_train.confidence_outputs import _json_bytes, rounded

    pae = rounded(np.array([[0.04, 1.26], [30.75, 2.0]], np.float32), 1)
    assert isinstance(pae, np.ndarray)
    text = _json_bytes({"pae": pae, "token_plddts": rounded(np.array([50.126]), 2)}, None)
    assert json.loads(text) == {"pae": [[0.0, 1.3], [30.8, 2.0]], "token_plddts": [50.13]}
    assert b"1.3" in text and b"1.2999" not in text  # shortest repr of the rounded value
    with pytest.raises(ValueError):
        _json_bytes({"pae": np.array([[np.nan]])}, None)
    with pytest.raises(TypeError, match="set"):
        _json_bytes({"x": {1}}, None)


def test_af2_seeds_layout_and_model_outputs(af2_checkpoint, tmp_path, capsys):
    from fold_train.predict import load_trained_model, make_raw_features, predict_structure

    msa = MONO / "bfd_uniclust_hits.a3m"
    out = tmp_path / "out"
    rc = main(["predict", "--checkpoint", str(af2_checkpoint), "--fasta",
               str(MONO / "short.fasta"), "--msa", str(msa), "--out-dir", str(out),
               "--seeds", "3,1,2", "--recycles", "1"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and printed["out"] is None  # --out-dir alone: no extra file
    rows = _check_layout(out / "query", {(1, 0), (2, 0), (3, 0)})
    assert printed["seed"] == rows[0][0] and printed["seeds"] == [3, 1, 2]

    # the files hold what the model gives for that seed
    model, cfg = load_trained_model(af2_checkpoint)
    _, raw, _ = make_raw_features(fasta=MONO / "short.fasta", msas=[msa])
    for seed in (1, 2, 3):
        pred = predict_structure(model, raw, cfg.data_preset(), num_recycles=1, seed=seed)
        summary, full = _read_sample(out / "query" / f"seed-{seed}_sample-0")
        assert np.allclose(full["token_plddts"], pred.plddt, atol=PLDDT_TOL)
        assert np.allclose(full["pae"], pred.pae, atol=PAE_TOL)
        assert np.allclose(full["contact_probs"], pred.contact_probs, atol=PLDDT_TOL)
        assert summary["ptm"] == pytest.approx(pred.ptm, abs=SCORE_TOL)
        assert summary["chain_pair_pae_min"]["A"]["A"] == pytest.approx(pred.pae.min(),
                                                                        abs=SCORE_TOL)
        # AF2 ranks by mean pLDDT
        assert summary["ranking_score"] == pytest.approx(pred.plddt.mean(), abs=SCORE_TOL)
        assert summary["iptm"] is None and summary["model_family"] == "af2"
        assert "pde" not in full  # AF2 has no PDE head
        assert summary["input_sha256"].keys() == {str(MONO / "short.fasta"), str(msa)}
    # the seeds draw different MSA samples: the predictions differ
    assert len({r[2] for r in rows}) > 1


def test_af2_single_file_out_and_refusals(af2_checkpoint, tmp_path, capsys):
    fasta = str(MONO / "short.fasta")
    base = ["predict", "--checkpoint", str(af2_checkpoint), "--fasta", fasta, "--recycles", "1"]
    # --out X.cif as before: that file alone, the summary printed with the new scores
    assert main([*base, "--out", str(tmp_path / "x.cif")]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.cif"]
    assert {"ptm", "ranking_score", "mean_plddt", "seed"} <= set(printed)
    # --samples is AF3's; AF2 gives one prediction per seed
    assert main([*base, "--samples", "2", "--out", str(tmp_path / "y.cif")]) == 2  # config
    assert "use --seeds" in capsys.readouterr().err
    # an existing output folder is not mixed with a new run's samples
    (tmp_path / "o" / "query").mkdir(parents=True)
    assert main([*base, "--out-dir", str(tmp_path / "o")]) == 1
    assert "already exists" in capsys.readouterr().err
    for bad in ("1,1", "a,b", "-1"):
        with pytest.raises(SystemExit) as info:
            main([*base, "--seeds", bad])
        assert info.value.code == 2


def test_batch_af2_one_bad_input_among_good(af2_checkpoint, tmp_path, capsys, monkeypatch):
    """FASTA files (one with its MSA folder), an mmCIF chain from --chains, a FASTA that does
    not parse and an AF3 JSON (the other family): the good ones predicted with the model loaded
    once, in bucket order; the bad ones reported with file and reason; exit status 1."""
    import fold_train.predict as predict_module

    src = tmp_path / "inputs"
    (src / "a").mkdir(parents=True)
    (src / "a.fasta").write_text((MONO / "short.fasta").read_text())
    (src / "a" / "bfd_uniclust_hits.a3m").write_text(
        (MONO / "bfd_uniclust_hits.a3m").read_text())
    seq = (MONO / "short.fasta").read_text().split("\n", 1)[1].replace("\n", "")
    (src / "b.fasta").write_text(f">long\n{seq * 2}\n")  # 146 residues: the 192 bucket
    (src / "bad.fasta").write_text(">bad\nMKV1234\n")
    (src / "complex.json").write_text((INPUTS / "fkbp51_fk506.json").read_text())
    (src / "4zey.cif").write_text((DEMO / "mmcifs" / "4zey.cif").read_text())
    chains = tmp_path / "chains.txt"
    chains.write_text("# file chain\n4zey.cif A\n")
    loads = []
    real_load = predict_module.load_trained_model
    monkeypatch.setattr(predict_module, "load_trained_model",
                        lambda *a, **k: loads.append(1) or real_load(*a, **k))
    out = tmp_path / "out"
    rc = main(["predict", "--checkpoint", str(af2_checkpoint), "--input-dir", str(src),
               "--out-dir", str(out), "--chains", str(chains), "--recycles", "1"])
    captured = capsys.readouterr()
    assert rc == 1 and len(loads) == 1
    progress = [line for line in captured.err.splitlines() if line.startswith("[")]
    names = [line.split()[1] for line in progress if not line.startswith("[skip]")]
    assert names[-1] == "b" and sorted(names) == ["4zey_A", "a", "b"]  # 128 bucket, then 192
    assert all(" s)" in line for line in progress if not line.startswith("[skip]"))  # times
    skipped = "\n".join(line for line in progress if line.startswith("[skip]"))
    assert "bad.fasta" in skipped and "illegal character '1'" in skipped
    assert "complex.json" in skipped
    for name in ("a", "b", "4zey_A"):
        _check_layout(out / name, {(0, 0)})
    assert not (out / "bad").exists()
    table = captured.out
    assert "complex.json" in table and "needs an AF3 checkpoint" in table
    assert "3 of 5 inputs predicted" in table
    rows = {r["name"]: r for r in json.loads((out / "batch_summary.json").read_text())}
    assert rows["bad"]["status"] == "failed" and rows["complex"]["status"] == "failed"
    assert all(rows[n]["status"] == "ok" and rows[n]["seconds"] > 0 for n in ("a", "b", "4zey_A"))
    assert rows["b"]["bucket"] == {"N_res": 192} and rows["a"]["bucket"] == {"N_res": 128}
    # an mmCIF of the directory with no chain listed is a failed input, not a guess
    (src / "1psm.cif").write_text((DEMO / "mmcifs" / "1psm.cif").read_text())
    for p in (src / "bad.fasta", src / "complex.json", src / "a.fasta", src / "b.fasta"):
        p.unlink()
    rc = main(["predict", "--checkpoint", str(af2_checkpoint), "--input-dir", str(src),
               "--out-dir", str(tmp_path / "out2"), "--chains", str(chains), "--recycles", "1"])
    assert rc == 1 and "1psm.cif: no chain listed" in capsys.readouterr().out


def test_af2_features_from_the_cache(af2_checkpoint, tmp_path, capsys, monkeypatch):
    """--cache: the first run stores the input's features in fold-data's cache, a re-run reads
    them back (featurisation not called) and predicts the same."""
    import fold_train.predict as predict_module

    base = ["predict", "--checkpoint", str(af2_checkpoint), "--fasta",
            str(MONO / "short.fasta"), "--msa", str(MONO / "bfd_uniclust_hits.a3m"),
            "--recycles", "1", "--cache", str(tmp_path / "cache")]
    assert main([*base, "--out", str(tmp_path / "a.cif")]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1

    def no_features(**kwargs):
        raise AssertionError("features made again instead of read from the cache")

    monkeypatch.setattr(predict_module, "make_raw_features", no_features)
    assert main([*base, "--out", str(tmp_path / "b.cif")]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["name"] == first["name"] == "query"
    assert second["ptm"] == first["ptm"] and second["mean_plddt"] == first["mean_plddt"]


def test_af3_input_files_hashed_with_the_files_the_json_names(tmp_path):
    """The summary's input_sha256 covers the JSON and the MSA / template / CCD files it names
    (relative to its directory); names of missing files are left to load_entry to refuse."""
    from fold_train.predict_af3 import input_files

    (tmp_path / "a.a3m").write_text(">q\nGAPATV\n")
    (tmp_path / "t.cif").write_text("data_t\n")
    doc = {"name": "x", "sequences": [{"protein": {
        "id": "A", "sequence": "GAPATV", "unpairedMsaPath": "a.a3m",
        "templates": [{"mmcifPath": "t.cif", "queryIndices": [0], "templateIndices": [0]}]}}],
        "userCCDPath": "missing.cif"}
    (tmp_path / "in.json").write_text(json.dumps(doc))
    assert input_files(tmp_path / "in.json") == [tmp_path / "in.json", tmp_path / "a.a3m",
                                                  tmp_path / "t.cif"]
    assert input_files(DEMO / "mmcifs" / "4zey.cif") == [DEMO / "mmcifs" / "4zey.cif"]


def test_search_results_stay_in_the_named_output_directory():
    """--search with only --out-dir writes its MSAs under OUT, not the current directory."""
    import argparse

    from fold_train.predict_search import search_out_dir

    args = argparse.Namespace(search_out=None, fasta="in/q.fasta", mmcif=None, json=None,
                              out=None, out_dir="preds")
    assert search_out_dir(args) == Path("preds/q_search")
    args.out = "elsewhere/x.cif"  # --out keeps its old default beside the file
    assert search_out_dir(args) == Path("elsewhere/x_search")


# -- AF3 ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def af3_checkpoint(tmp_path_factory) -> Path:
    needs_af3_demo()
    return _noisy_checkpoint(tmp_path_factory.mktemp("af3") / "af3.ckpt", "af3_tiny")


AF3_FAST = ["--sampler-steps", "3", "--recycles", "1", "--device", "cpu"]


@pytest.mark.slow
def test_af3_seeds_samples_layout_and_model_outputs(af3_checkpoint, tmp_path, capsys):
    from fold_train.af3_data import make_ccd
    from fold_train.confidence import chain_pair_iptm, predicted_tm, ranking_score
    from fold_train.predict import load_trained_model
    from fold_train.predict_af3 import make_af3_inputs, predict_af3, sample_af3

    source = INPUTS / "fkbp51_fk506.json"
    out = tmp_path / "out"
    rc = main(["predict", "--checkpoint", str(af3_checkpoint), "--json", str(source), "--ccd",
               str(CCD), "--out-dir", str(out), "--seeds", "4,9", "--samples", "2", *AF3_FAST])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    root = out / "FKBP51_FK506"
    rows = _check_layout(root, {(4, 0), (4, 1), (9, 0), (9, 1)})
    assert (printed["seed"], printed["sample"]) == rows[0][:2]

    model, _ = load_trained_model(af3_checkpoint, family="af3")
    entry, raw = make_af3_inputs(source, make_ccd([CCD]))
    asym = np.asarray(raw["asym_id"])
    n_protein = len(json.loads(source.read_text())["sequences"][0]["protein"]["sequence"])
    for seed in (4, 9):
        samples = sample_af3(model, raw, seed=seed, no_samples=2, no_steps=3, no_cycles=1)
        for s in range(2):
            summary, full = _read_sample(root / f"seed-{seed}_sample-{s}")
            assert np.allclose(full["atom_plddts"], samples.plddt[s], atol=PLDDT_TOL)
            assert np.allclose(full["pae"], samples.pae[s], atol=PAE_TOL)
            assert np.allclose(full["pde"], samples.pde[s], atol=PAE_TOL)
            assert np.allclose(full["contact_probs"], samples.contact_probs, atol=PLDDT_TOL)
            fm = samples.frame_mask[s]
            ptm = predicted_tm(samples.tm_global[s], fm)
            iptm = predicted_tm(samples.tm_global[s], fm, asym, interface=True)
            assert summary["ptm"] == pytest.approx(ptm, abs=SCORE_TOL)
            assert summary["iptm"] == pytest.approx(iptm, abs=SCORE_TOL)
            pair = chain_pair_iptm(samples.tm_interface[s], fm, asym)
            assert summary["chain_pair_iptm"]["A"]["B"] == pytest.approx(pair[0, 1],
                                                                         abs=SCORE_TOL)
            assert summary["chain_ptm"]["A"] == pytest.approx(pair[0, 0], abs=SCORE_TOL)
            assert summary["ranking_score"] == pytest.approx(ranking_score(
                ptm, iptm, summary["fraction_disordered"], bool(summary["has_clash"])),
                abs=SCORE_TOL)
            # a token per residue of A; FK506 (B, a ligand) a token per heavy atom
            assert full["token_chain_ids"] == ["A"] * n_protein + ["B"] * 57
    # every sample is its own structure (the sampler's noise)
    coords = [tuple(np.round(gemmi.read_structure(str(root / f"seed-{a}_sample-{b}" /
                                                      "model.cif"))[0]["A"][0][0].pos.tolist(), 3))
              for a, b, _ in rows]
    assert len(set(coords)) == len(rows)
    # predict_af3 (the library call) keeps the seed's top-ranked sample
    best = max((r for r in rows if r[0] == 9), key=lambda r: r[2])
    top = predict_af3(model, raw, seed=9, no_samples=2, no_steps=3, no_cycles=1)
    _, full = _read_sample(root / f"seed-9_sample-{best[1]}")
    assert np.allclose(top.plddt, full["atom_plddts"], atol=PLDDT_TOL)


@pytest.mark.slow
def test_batch_af3_one_bad_input_among_good(af3_checkpoint, tmp_path, capsys):
    src = tmp_path / "inputs"
    src.mkdir()
    (src / "fkbp.json").write_text((INPUTS / "fkbp51_fk506.json").read_text())
    (src / "strep.json").write_text((INPUTS / "streptavidin_biotin_smiles.json").read_text())
    doc = json.loads((INPUTS / "fkbp51_fk506.json").read_text())
    doc["sequences"] = []
    (src / "empty.json").write_text(json.dumps(doc))
    (src / "query.fasta").write_text((MONO / "short.fasta").read_text())
    out = tmp_path / "out"
    rc = main(["predict", "--checkpoint", str(af3_checkpoint), "--input-dir", str(src),
               "--out-dir", str(out), "--ccd", str(CCD), "--samples", "1", *AF3_FAST])
    captured = capsys.readouterr()
    assert rc == 1
    assert "empty.json" in captured.err and "'sequences' is empty" in captured.err
    assert "query.fasta" in captured.out and "AF2 input" in captured.out
    _check_layout(out / "FKBP51_FK506", {(7, 0)})  # the JSON's modelSeeds
    names = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(names) == 2 and "FKBP51_FK506" in names
    assert "2 of 4 inputs predicted" in captured.out
