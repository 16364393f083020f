"""hmmsearch template search against the bundled PDB SEQRES set, read by fold-data's parser."""

from __future__ import annotations

import pytest
from _search_helpers import MMCIFS, SEQRES, write_config
from fold_data.errors import InputError
from fold_data.search import SearchChain, load_config, run_search
from fold_data.template_hits import parse_hmmsearch_sto


def _templates(tmp_path, query, extra=""):
    block = f'[templates]\nseqres = "{SEQRES}"\n{extra}'
    config = load_config(write_config(tmp_path, templates=block))
    result = run_search([SearchChain("A", "protein", query)], config, tmp_path / "out",
                        name="q", cpus=1)
    return result.chains["A"]


def test_par3_finds_its_own_chains_and_3zee(tmp_path, par3):
    chain = _templates(tmp_path, par3)
    hits = parse_hmmsearch_sto(chain.template_hits, par3)
    names = [h.name for h in hits]
    # 4I6P (both chains) and 3ZEE are the Par-3 N-terminal domain
    assert {"4i6p_A", "4i6p_B", "3zee_A"} <= set(names)
    assert names.index("3zee_A") < 4
    best = hits[names.index("4i6p_A")]
    # the alignment maps query residues onto the same residues of the template SEQRES
    seqres = par3  # 4I6P A is the query itself
    same = [q for q, t in zip(best.indices_query, best.indices_hit) if q >= 0 and t >= 0]
    assert len(same) > 0.9 * len(par3)
    for q, t in zip(best.indices_query, best.indices_hit):
        if q >= 0 and t >= 0:
            assert par3[q] == seqres[t]


def test_max_template_date_drops_later_structures(tmp_path, par3):
    # 4I6P was released 2013-07-17, 3ZEE 2013-10-16; NRBF2-like hits have no mmCIF here
    chain = _templates(tmp_path, par3, f'mmcif_dir = "{MMCIFS}"\nmax_template_date = '
                       '"2013-08-01"\n')
    names = {h.name for h in parse_hmmsearch_sto(chain.template_hits, par3)}
    assert {"4i6p_A", "4i6p_B"} <= names
    assert "3zee_A" not in names
    assert all(n.startswith(("4i6p", "3u8v", "2q2k", "1psm")) for n in names), names


def test_date_filter_needs_mmcif_dir(tmp_path, par3):
    with pytest.raises(InputError, match="mmcif_dir"):
        _templates(tmp_path, par3, 'max_template_date = "2013-08-01"\n')
