"""The result cache: a second run is served from it; a changed database or parameter is not."""

from __future__ import annotations

import os
import shutil

from _search_helpers import UNIREF, write_config
from fold_data.search import SearchChain, load_config, run_search


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "cache" not in p.parts and p.name != "search.json"}


def test_second_run_is_a_cache_hit_with_identical_outputs(tmp_path, nrbf2, par3):
    config = load_config(write_config(tmp_path))
    chains = [SearchChain("A", "protein", nrbf2), SearchChain("B", "protein", par3)]
    first = run_search(chains, config, tmp_path / "out", cpus=2)
    assert (first.cache_hits, first.cache_misses) == (0, 4)
    before = _files(tmp_path / "out")
    second = run_search(chains, config, tmp_path / "out", cpus=2)
    assert (second.cache_hits, second.cache_misses) == (4, 0)
    assert _files(tmp_path / "out") == before
    # no temporary files left behind by the atomic writes
    assert not [p for p in (tmp_path / "out").rglob("*.tmp")]
    # a homomer copy is searched once
    third = run_search(chains + [SearchChain("C", "protein", nrbf2)], config, tmp_path / "out",
                       cpus=2)
    assert (third.cache_hits, third.cache_misses) == (4, 0)


def test_changed_database_or_parameters_miss(tmp_path, nrbf2):
    db = tmp_path / "uniref90.fasta"
    shutil.copy(UNIREF, db)
    config_path = write_config(tmp_path, databases={"uniref90": db})
    chains = [SearchChain("A", "protein", nrbf2)]
    out = tmp_path / "out"
    assert run_search(chains, load_config(config_path), out, cpus=1).cache_misses == 1
    assert run_search(chains, load_config(config_path), out, cpus=1).cache_hits == 1
    st = db.stat()
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert run_search(chains, load_config(config_path), out, cpus=1).cache_misses == 1
    config_path.write_text(config_path.read_text() + "max_hits = 3\n")
    result = run_search(chains, load_config(config_path), out, cpus=1)
    assert result.cache_misses == 1 and result.chains["A"].rows["uniref90"] <= 3


def test_hash_keys_survive_a_touch(tmp_path, nrbf2):
    db = tmp_path / "uniref90.fasta"
    shutil.copy(UNIREF, db)
    config = load_config(write_config(tmp_path, databases={"uniref90": db}))
    chains = [SearchChain("A", "protein", nrbf2)]
    run_search(chains, config, tmp_path / "out", cpus=1, hash_databases=True)
    st = db.stat()
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again = run_search(chains, config, tmp_path / "out", cpus=1, hash_databases=True)
    assert again.cache_hits == 1


def test_no_cache_writes_only_the_outputs(tmp_path, nrbf2):
    config = load_config(write_config(tmp_path))
    run_search([SearchChain("A", "protein", nrbf2)], config, tmp_path / "out", cpus=1,
               cache_dir=None)
    assert not (tmp_path / "out" / "cache").exists()
    assert {p.name for p in tmp_path.iterdir()} == {"search.toml", "out"}
