"""``fold-train predict --search``: the MSA / template search of fold-data runs first (small real
databases bundled with fold-data's tests), then the prediction uses what it wrote."""

from __future__ import annotations

import json

import gemmi
import pytest
from _train_helpers import DEMO, REPO, SMALL
from fold_train.checkpoint import find_latest
from fold_train.cli import build_parser, main

pytest.importorskip("pyhmmer")
SEARCH_DATA = REPO / "packages" / "fold-data" / "tests" / "search" / "data"


def _config(tmp_path):
    path = tmp_path / "search.toml"
    path.write_text(f'preset = "af2"\n[databases.uniref90]\npath = "{SEARCH_DATA}/uniref90_mini'
                    f'.fasta"\n[templates]\nseqres = "{SEARCH_DATA}/pdb_seqres_mini.txt"\n'
                    f'mmcif_dir = "{DEMO}/mmcifs"\n')
    return path


def test_search_fills_msa_and_templates_for_an_af2_query(tmp_path):
    from fold_train.predict_search import apply_search

    args = build_parser().parse_args([
        "predict", "--checkpoint", "unused.ckpt", "--mmcif", str(DEMO / "mmcifs" / "4zey.cif"),
        "--chain", "A", "--search", str(_config(tmp_path)), "--out", str(tmp_path / "p.cif")])
    report = apply_search(args)
    assert report["search"]["out"] == str(tmp_path / "p_search")
    assert [p.rsplit("/", 1)[1] for p in args.msa] == ["uniref90_hits.a3m"]
    assert args.templates.endswith("4zey_A/hmm_output.sto")
    assert args.template_mmcif_dir == str(DEMO / "mmcifs")


def test_search_is_refused_next_to_given_msas(tmp_path, capsys):
    code = main(["predict", "--checkpoint", "unused.ckpt", "--fasta",
                 str(DEMO / "monomer" / "short.fasta"), "--msa", "x.a3m",
                 "--search", str(_config(tmp_path))])
    assert code == 2 and "--search runs when no MSA is given" in capsys.readouterr().err


def test_train_then_predict_with_search(demo_cache, tmp_path, capsys):
    cache_dir, _ = demo_cache
    run = tmp_path / "run"
    assert main(["train", "--cache", cache_dir, "--run-dir", str(run), "--hold-out", "4zey_A",
                 "--no-progress", *SMALL, "steps=1"]) == 0
    capsys.readouterr()
    ckpt = find_latest(run / "checkpoints")
    out = tmp_path / "4zey_A.cif"
    argv = ["predict", "--checkpoint", str(ckpt), "--mmcif", str(DEMO / "mmcifs" / "4zey.cif"),
            "--chain", "A", "--search", str(_config(tmp_path)), "--out", str(out),
            "--device", "cpu"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["search"]["cache_hits"] == 0
    assert (tmp_path / "4zey_A_search" / "4zey_A" / "uniref90_hits.a3m").is_file()
    assert len(gemmi.read_structure(str(out))[0]["A"]) > 0
    assert main(argv) == 0  # the second search is served by the cache
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["search"]["cache_hits"] == 2  # the MSA and the template search


def test_search_feeds_the_af3_featurizer_with_paired_rows(tmp_path):
    from _af3_helpers import CCD, needs_af3_demo
    from fold_data.msa import parse_a3m
    from fold_train.af3_data import make_ccd
    from fold_train.predict_af3 import make_af3_inputs
    from fold_train.predict_search import apply_search

    needs_af3_demo()
    from fold_data.mmcif import parse_mmcif

    nrbf2 = parse_mmcif(DEMO / "mmcifs" / "4zey.cif").get_chain("A").sequence
    par3 = parse_mmcif(DEMO / "mmcifs" / "4i6p.cif").get_chain("A").sequence
    doc = {"name": "pair", "modelSeeds": [1], "dialect": "alphafold3", "version": 4,
           "sequences": [{"protein": {"id": "A", "sequence": nrbf2}},
                         {"protein": {"id": "B", "sequence": par3}}]}
    source = tmp_path / "pair.json"
    source.write_text(json.dumps(doc))
    config = tmp_path / "search.toml"
    config.write_text(f'[databases.uniref90]\npath = "{SEARCH_DATA}/uniref90_mini.fasta"\n'
                      f'[databases.uniprot]\npath = "{SEARCH_DATA}/uniprot_mini.fasta.gz"\n')
    args = build_parser().parse_args(["predict", "--checkpoint", "unused.ckpt", "--json",
                                      str(source), "--search", str(config),
                                      "--out", str(tmp_path / "pair.cif")])
    report = apply_search(args)
    assert report["search"]["out"] == str(tmp_path / "pair_search")
    features = report["features"]
    paired = parse_a3m(features["paired_msa_paths"]["A"])
    assert len(paired) > 1
    _, raw = make_af3_inputs(source, make_ccd([CCD]), features=features)
    unpaired_a = parse_a3m(features["msa_paths"]["A"][0])
    unpaired_b = parse_a3m(features["msa_paths"]["B"][0])
    # query row, the paired rows, then the deeper chain's unpaired rows
    assert raw["msa"].shape[0] == len(paired) + max(len(unpaired_a), len(unpaired_b)) - 1
