"""``fold-train train --preset af3``'s training directory: per-entry mmCIFs with per-chain
alignment folders -> the AF3 cache holds the MSA rows and templates; a chain without
alignments is reported; weighted sampling and filters (AF3 supplement 2.5) drive the stream.

The directory is assembled from the bundled demo (``data/demo``): 4ZEY (NRBF2 MIT domain with
two sulfate ions, X-ray 1.5 A: crystallization aids, which AF3's training filters remove) with
its real MSAs and hmmsearch template hits, the template 2CRB
(model 1, ``data/demo/template_mmcifs``), and 3O5R (FKBP51 with FK506) without alignments."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _af3_helpers import AF3_DEMO
from _train_helpers import DEMO

ALIGNMENTS = DEMO / "alignments" / "4zey_A"


@pytest.fixture(scope="module")
def training_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("af3_training")
    (root / "mmcifs").mkdir()
    (root / "alignments").mkdir()
    (root / "mmcifs" / "4zey.cif").symlink_to(DEMO / "mmcifs" / "4zey.cif")
    (root / "mmcifs" / "3o5r.cif").symlink_to(AF3_DEMO / "mmcifs" / "3o5r.cif")
    folder = root / "alignments" / "4zey_A"
    folder.mkdir()
    for path in ALIGNMENTS.iterdir():
        (folder / path.name).symlink_to(path)
    # the pairing hits: one protein entity, so no row pairs (AF3 pairs different chains only)
    (folder / "uniprot_hits.sto").symlink_to(AF3_DEMO / "pairing" / "4zey_A_uniprot_hits.sto")
    (root / "template_mmcifs").symlink_to(DEMO / "template_mmcifs")
    return root


@pytest.fixture(scope="module")
def built(training_dir, tmp_path_factory):
    from fold_data.af3.ccd import biotite_ccd_path
    from fold_train.af3_data import open_af3_cache

    if biotite_ccd_path() is None:
        pytest.skip("biotite's CCD is not installed (pip install biotite>=1.0)")
    cache = tmp_path_factory.mktemp("af3_cache")
    entries = open_af3_cache(training_dir, cache)
    return cache, dict(entries)


def test_cache_holds_msa_rows_and_templates_of_a_real_complex(built, capsys):
    from fold_data.af3 import af3_cache, load_entry
    from fold_data.af3.tokenizer import GAP
    from fold_data.mmcif import parse_mmcif
    from fold_data.msa import load_msa
    from fold_train.af3_data import af3_cache_dir

    cache_dir, entries = built
    raw = af3_cache(af3_cache_dir(cache_dir)).load(entries["4zey"])
    entry = load_entry(DEMO / "mmcifs" / "4zey.cif")
    protein = entry.chains[0]
    # AF2's concatenation order (UniRef90, BFD, MGnify): deduplication keeps the first copy
    msas = [ALIGNMENTS / f for f in ("uniref90_hits.sto", "bfd_uniclust_hits.a3m",
                                     "mgnify_hits.sto")]
    expected = load_msa(protein.sequence, msas)["msa"]  # [N_msa, N_res], deduplicated
    expected = np.where(expected == 21, GAP, expected)
    assert raw["msa"].shape[0] == len(expected) > 500
    cols = np.flatnonzero(raw["asym_id"] == 0)
    res = raw["residue_index"][cols]
    assert (raw["msa"][1:, cols] == expected[1:, res]).all()  # every row of every residue
    # the two sulfates are crystallization aids of an X-ray entry: AF3's training filters
    # (supplement 2.5.4) removed them before featurisation
    assert not raw["is_ligand"].any() and len(raw["chain_ids"]) == 1

    # One template: 2CRB (mouse NRBF2, 2005); 5KC1 (2016) is after 4ZEY's release, 4ZEY itself
    # is the query. Its pseudo-beta atoms are 2CRB's CB atoms (CA for glycine), model 1.
    assert raw["template_restype"].shape[0] == 1
    mask = raw["template_pseudo_beta_mask"][0] > 0
    assert mask[cols].sum() > 60
    chain = parse_mmcif(DEMO / "template_mmcifs" / "2crb.cif").chains["A"]
    from fold_data import residue_constants as rc

    cb = np.where(chain.aatype[:, None] == rc.restype_order["G"],
                  chain.atom37_positions[:, rc.atom_order["CA"]],
                  chain.atom37_positions[:, rc.atom_order["CB"]])  # [N_res, 3]
    d = np.linalg.norm(raw["template_pseudo_beta"][0][mask][:, None] - cb[None], axis=-1)
    assert (d.min(axis=1) < 1e-3).all()

    report = json.loads((af3_cache_dir(cache_dir) / "cache_report.json").read_text())
    by_name = {r["name"]: r for r in report["entries"]}
    assert by_name["4zey"]["msa_rows"] == len(expected) and by_name["4zey"]["templates"] == 1
    assert by_name["4zey"]["chains_with_alignments"] == ["A"] and not by_name["4zey"]["warnings"]
    assert by_name["4zey"]["chains_paired"] == ["A"]
    removed = by_name["4zey"]["filters"]
    assert [(c["chain_id"], c["detail"]) for c in removed["crystallization_aid"]] == [
        ("B", "crystallization aid SO4"), ("C", "crystallization aid SO4")]
    assert all(removed[f] == [] for f in ("too_few_resolved", "all_unknown", "clashing",
                                          "ca_gap", "attached_to_removed"))
    assert report["filters"][4] == "crystallization_aid: 2 chains removed (4zey/B, 4zey/C)"
    assert report["chain_filters"]["clash_distance"] == 1.7


def test_a_chain_without_alignments_is_reported_and_keeps_its_query_row(built, training_dir,
                                                                       capsys):
    from fold_data.af3 import af3_cache
    from fold_train.af3_data import af3_cache_dir, open_af3_cache

    cache_dir, entries = built
    raw = af3_cache(af3_cache_dir(cache_dir)).load(entries["3o5r"])
    assert raw["msa"].shape[0] == 1 and raw["template_restype"].shape[0] == 0
    report = json.loads((af3_cache_dir(cache_dir) / "cache_report.json").read_text())
    notes = {r["name"]: r["warnings"] for r in report["entries"]}["3o5r"]
    assert len(notes) == 1 and "3o5r chain A (protein, 128 residues)" in notes[0]
    assert "query row alone" in notes[0]
    open_af3_cache(training_dir, cache_dir, names=["3o5r"])  # reused: reported again, printed
    out = capsys.readouterr().out
    assert "warning: 3o5r chain A" in out and "4zey" not in out


def test_a_second_build_of_unchanged_files_parses_nothing(built, training_dir, monkeypatch):
    """The chains of an unchanged mmCIF (size, mtime) come from the sampling index: a cache
    of 10^5 complexes is not parsed again at every start; the result is the same."""
    import fold_data.af3
    from fold_train.af3_data import af3_cache_dir, open_af3_cache

    cache_dir, entries = built
    index = af3_cache_dir(cache_dir) / "sampling_index.json"
    before = json.loads(index.read_text())
    monkeypatch.setattr(fold_data.af3, "load_entry",
                        lambda *a, **k: pytest.fail("an unchanged mmCIF was parsed again"))
    assert dict(open_af3_cache(training_dir, cache_dir)) == entries
    report = json.loads((af3_cache_dir(cache_dir) / "cache_report.json").read_text())
    assert {r["status"] for r in report["entries"]} == {"reused"}
    assert json.loads(index.read_text()) == before


def test_sequence_keyed_alignment_folders(tmp_path, training_dir):
    """Protenix-style folders named by the sequence's sha256 serve every chain with that
    sequence."""
    from fold_data.af3 import load_entry
    from fold_data.af3.alignments import entry_alignments, sequence_key

    entry = load_entry(DEMO / "mmcifs" / "4zey.cif")
    (tmp_path / sequence_key(entry.chains[0].sequence)).symlink_to(ALIGNMENTS)
    found = entry_alignments(entry, tmp_path, name="4zey")
    assert not found.notes and found.chains["A"].template_hits.name == "hmm_output.sto"
    assert [p.name for p in found.chains["A"].msa_paths] == [
        "uniref90_hits.sto", "bfd_uniclust_hits.a3m", "mgnify_hits.sto"]


def test_protenix_sequence_index_and_file_names(tmp_path):
    """Protenix's layout: ``seq_to_pdb_index.json`` maps a sequence to its folder, which holds
    ``non_pairing.a3m`` (unpaired), ``pairing.a3m`` (paired by species) and ``hmmsearch.a3m``
    (template hits as A3M: reported, not read as an MSA)."""
    from fold_data.af3 import load_entry
    from fold_data.af3.alignments import entry_alignments
    from fold_data.errors import InputError

    entry = load_entry(DEMO / "mmcifs" / "4zey.cif")
    folder = tmp_path / "7"
    folder.mkdir()
    for name in ("non_pairing.a3m", "pairing.a3m", "hmmsearch.a3m"):  # real A3M rows
        (folder / name).symlink_to(ALIGNMENTS / "bfd_uniclust_hits.a3m")
    (tmp_path / "seq_to_pdb_index.json").write_text(
        json.dumps({entry.chains[0].sequence: 7}))
    found = entry_alignments(entry, tmp_path, name="4zey")
    a = found.chains["A"]
    assert [p.name for p in a.msa_paths] == ["non_pairing.a3m"]
    assert a.pairing.name == "pairing.a3m" and a.template_hits is None
    assert len(found.notes) == 1 and "hmmsearch.a3m (template hits as A3M) is not read" in \
        found.notes[0]

    (tmp_path / "seq_to_pdb_index.json").write_text(json.dumps({entry.chains[0].sequence: 8}))
    with pytest.raises(InputError, match="seq_to_pdb_index.json.*folder 8/ does not exist"):
        entry_alignments(entry, tmp_path, name="4zey")


def test_filters_and_weighted_units_drive_the_stream(built, capsys):
    """The ``af3`` preset's data: 4ZEY (2015) is dropped by a release-date filter of
    2012-12-31, 3O5R (2010) is kept; its chains and interface are drawn with AF3's weights and
    each stream item carries the drawn unit as the crop's focus."""
    from fold_data.af3 import get_preset
    from fold_train.af3_data import AF3_TINY_DATA, training_units
    from fold_train.data import SampleStream, prepare_item

    cache_dir, entries = built
    entries = sorted(entries.items())
    preset = dataclasses.replace(get_preset("af3_initial"), max_release_date="2012-12-31")
    kept, units = training_units(cache_dir, entries, preset)
    assert [n for n, _ in kept] == ["3o5r"]
    assert "4zey filtered out: released 2015-05-06 after 2012-12-31" in capsys.readouterr().out
    got = {(u.kind, u.asyms): float(p) for u, p in
           zip(units.sampler.units, units.sampler.probabilities)}
    total = 0.5 * 3 + 0.5 * 1 + 1.0 * (3 + 1)  # protein chain, FK5 chain, their interface
    assert got == pytest.approx({("chain", (0,)): 1.5 / total, ("chain", (1,)): 0.5 / total,
                                 ("interface", (0, 1)): 4.0 / total}, abs=1e-12)

    tiny = dataclasses.replace(AF3_TINY_DATA, sampling="weighted")
    stream = SampleStream(str(cache_dir), kept, tiny, seed=3, workers=0, family="af3",
                          units=units)
    items = [stream.item(i) for i in range(200)]
    assert {it.focus for it in items} == {(0,), (1,), (0, 1)}
    assert [it.focus for it in items] == [stream.item(i).focus for i in range(200)]
    share = sum(it.focus == (0, 1) for it in items) / len(items)
    assert abs(share - 4.0 / total) < 0.12  # 200 draws: 3.6 standard deviations
    _, name, sample = prepare_item(items[0])
    assert name == "3o5r" and 0 < sample["token_mask"].sum() <= tiny.n_token

    with pytest.raises(Exception, match="expected at least one complex left by the filters"):
        training_units(cache_dir, entries, dataclasses.replace(preset,
                                                               max_release_date="2000-01-01"))
    with pytest.raises(ValueError, match="max_release_date '30/09/2021'; expected YYYY-MM-DD"):
        dataclasses.replace(preset, max_release_date="30/09/2021")
    uniform = dataclasses.replace(AF3_TINY_DATA)
    assert training_units(cache_dir, entries, uniform) == (entries, None)


def test_train_cli_reads_the_training_directory(training_dir, tmp_path, capsys):
    """Two steps of ``fold-train train --preset af3_tiny`` on the directory with weighted
    sampling and the supplement's filters: the cache report and sampling index are written and
    the run trains on both complexes."""
    from fold_data.af3.ccd import biotite_ccd_path
    from fold_train.cli import main

    if biotite_ccd_path() is None:
        pytest.skip("biotite's CCD is not installed (pip install biotite>=1.0)")
    run = tmp_path / "run"
    assert main(["train", "--preset", "af3_tiny", "--data", str(training_dir), "--run-dir",
                 str(run), "--no-progress", "loader_workers=0", "steps=2",
                 "checkpoint_every=2", "data.sampling=weighted",
                 "data.max_resolution=9", "data.max_release_date=2021-09-30",
                 "model.pairformer.no_blocks=1", "model.msa.no_blocks=1"]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in records)
    index = json.loads((run / "cache" / "af3" / "sampling_index.json").read_text())
    assert sorted(index["entries"]) == ["3o5r", "4zey"]
    # AF3's training filters removed 4ZEY's sulfates (crystallization aids): no interface left
    assert [c["chain_id"] for c in index["entries"]["4zey"]["chains"]] == ["A"]
    assert index["entries"]["4zey"]["interfaces"] == []
    assert index["entries"]["3o5r"]["interfaces"] == [[0, 1]]  # FKBP51-FK506
    out = capsys.readouterr().out
    for line in ("too_few_resolved: 0 chains removed", "clashing: 0 chains removed",
                 "crystallization_aid: 2 chains removed (4zey/B, 4zey/C)",
                 "outside_ccd: 0 resolved atoms not featurised"):
        assert f"fold-train: AF3 training filter {line}\n" in out


NO_PARSERS = """
import sys

class Blocked:  # the GPU image: no gemmi, RDKit or biotite
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("gemmi", "rdkit", "biotite"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, Blocked())
from fold_train.cli import main

code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("gemmi", "rdkit", "biotite"))
sys.exit(f"loaded {loaded}" if loaded else code)
"""


def test_training_from_the_cache_needs_no_parser(built, tmp_path):
    """A GPU node without gemmi, RDKit and biotite trains with weighted sampling from a cache
    built elsewhere (``--cache`` alone): the chain clusters are in the sampling index."""
    import subprocess
    import sys

    cache_dir, _ = built
    args = ["train", "--preset", "af3_tiny", "--cache", str(cache_dir), "--run-dir",
            str(tmp_path / "run"), "--no-progress", "steps=1", "loader_workers=0",
            "data.sampling=weighted", "data.max_release_date=2021-09-30",
            "model.pairformer.no_blocks=1"]
    done = subprocess.run([sys.executable, "-c", NO_PARSERS, *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "2 training complexes" in done.stdout


@pytest.mark.slow
def test_tiny_af3_learns_with_msa_rows_and_a_template(training_dir, tmp_path):
    """The AF3 learning test with the MSA module and the template embedder fed real data: 100
    steps of ``fold-train train --preset af3_tiny`` on a pocket of 4ZEY (a sulfate and its 8
    nearest protein tokens, cut from the training directory's cache entry: real MSA columns, 16
    of 850 rows drawn per step, and the 2CRB template) at least halve its loss on 8 fixed noise
    draws (same MSA rows and template each draw)."""
    from _af3_helpers import NO_DROPOUT
    from fold_data.af3 import AF3DataPreset, af3_cache, make_sample
    from fold_data.af3.crop import crop_features
    from fold_train.af3_data import af3_cache_dir, open_af3_cache
    from fold_train.checkpoint import load_checkpoint
    from fold_train.cli import main
    from fold_train.config import TrainConfig
    from fold_train.data import collate
    from fold_train.families import AF3Family

    # The sulfates are crystallization aids that AF3's training filters remove: this cache
    # keeps them (chain_filters=None) for a protein-ligand pocket.
    cache_dir = tmp_path / "unfiltered"
    entries = dict(open_af3_cache(training_dir, cache_dir, names=["4zey"], chain_filters=None))
    raw = af3_cache(af3_cache_dir(cache_dir)).load(entries["4zey"])
    centres = raw["atom_positions"][raw["token_center_atom"]]
    sulfate = np.flatnonzero(raw["asym_id"] == 1)
    protein = np.flatnonzero(raw["asym_id"] == 0)
    near = protein[np.argsort(np.linalg.norm(centres[protein] - centres[sulfate].mean(0),
                                             axis=-1))[:8]]
    pocket = crop_features(raw, np.sort(np.concatenate([sulfate, near])))
    assert pocket["msa"].shape[0] == 850 and pocket["template_restype"].shape[0] == 1
    assert (pocket["template_pseudo_beta_mask"][0] > 0).sum() >= 4  # the template covers it

    run, steps = tmp_path / "run", 100
    cache = af3_cache(af3_cache_dir(run / "cache"))
    source = DEMO / "mmcifs" / "4zey.cif"
    entry = cache.fetch("4zey_pocket", [source], {"pipeline": "af3", "crop": "SO4 + 8"},
                        lambda: pocket)
    cache.write_index({"4zey_pocket": entry.key})
    assert main(["train", "--preset", "af3_tiny", "--cache", str(run / "cache"), "--run-dir",
                 str(run), "--no-progress", "loader_workers=0", f"steps={steps}",
                 f"checkpoint_every={steps}", "data.n_templ=1", *NO_DROPOUT]) == 0

    state = load_checkpoint(run / "checkpoints" / f"step_{steps:08d}.ckpt")
    cfg = TrainConfig.from_dict(state["config"])
    fixed = AF3DataPreset("fixed", n_token=None, n_atom=None, n_msa=16, n_templ=1)
    batch = collate([make_sample(pocket, fixed, seed=0)])
    assert int(batch["msa_mask"][0, :, 0].sum()) == 16 and int(batch["template_mask"].sum()) == 1
    model_config = cfg.model_config()
    family = AF3Family(model_config)
    torch.manual_seed(cfg.run.seed)  # as the Trainer builds the model: the run's initial weights
    model = family.build_model(model_config)
    assert model.template_embedder is not None and model.msa_module is not None
    before = family.fixed_noise_loss(model, batch, seeds=range(8))
    model.load_state_dict(state["model"])
    after = family.fixed_noise_loss(model, batch, seeds=range(8))
    assert np.isfinite(before["loss"]) and np.isfinite(after["loss"])
    assert after["loss"] <= 0.5 * before["loss"], (before, after)


def test_templates_released_after_the_entry_are_left_out(tmp_path):
    """4I6P (released 2013-07-17, a homodimer) and its template hits (the first 10 of its
    hmmsearch output, ``data/demo/af3/template_hits``): they name 3ZEE, the same Par-3 domain
    released 2013-10-16, which is a usable template without a date limit, and is left out of
    the training entry, whose templates must be older than it. Both 4I6P chains share the one
    alignment folder; it has no MSA file, which the report says."""
    from fold_data.af3 import af3_cache, load_entry, make_features
    from fold_data.af3.ccd import biotite_ccd_path
    from fold_train.af3_data import af3_cache_dir, open_af3_cache

    if biotite_ccd_path() is None:
        pytest.skip("biotite's CCD is not installed (pip install biotite>=1.0)")
    hits = AF3_DEMO / "template_hits" / "4i6p_A_hmm_output.sto"
    data = tmp_path / "data"
    for sub in ("mmcifs", "template_mmcifs", "alignments/4i6p_A"):
        (data / sub).mkdir(parents=True)
    (data / "mmcifs" / "4i6p.cif").symlink_to(DEMO / "mmcifs" / "4i6p.cif")
    (data / "template_mmcifs" / "3zee.cif").symlink_to(DEMO / "mmcifs" / "3zee.cif")
    (data / "alignments" / "4i6p_A" / "hmm_output.sto").symlink_to(hits)

    entry = load_entry(data / "mmcifs" / "4i6p.cif")
    undated = make_features(entry, template_hits={"A": hits, "B": hits},
                            template_mmcif_dir=[data / "template_mmcifs"])
    assert undated["template_restype"].shape[0] == 1  # 3ZEE, when no date limits it

    entries = dict(open_af3_cache(data, tmp_path / "cache"))
    raw = af3_cache(af3_cache_dir(tmp_path / "cache")).load(entries["4i6p"])
    assert raw["template_restype"].shape[0] == 0  # 3ZEE is newer than 4I6P
    report = {r["name"]: r for r in json.loads(
        (af3_cache_dir(tmp_path / "cache") / "cache_report.json").read_text())["entries"]}
    assert report["4i6p"]["chains_with_alignments"] == ["A", "B"]  # B shares A's folder
    assert all("no unpaired MSA file" in w for w in report["4i6p"]["warnings"])
    assert len(report["4i6p"]["warnings"]) == 2
