"""AF3 template features on real hits: the 73-residue query of ``data/demo/monomer`` with its
HHsearch hits, whose template mmCIFs are bundled (1HF9, the top hit, is missing and skipped).

The AF3 per-token template features must agree with the AF2 template featurizer run on the same
hits (same accepted templates, same residue types, pseudo-beta and backbone atoms)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from fold_data import residue_constants as rc
from fold_data.msa import parse_fasta
from fold_data.template_hits import parse_hhr
from fold_data.templates import make_template_features

pytest.importorskip("biotite")
from fold_data.af3 import make_features  # noqa: E402  (needs the CCD from biotite)

MONOMER = Path(__file__).resolve().parents[4] / "data" / "demo" / "monomer"
MMCIFS = MONOMER.parent / "mmcifs"


def test_af3_templates_match_af2_featurizer():
    fasta, hhr = MONOMER / "short.fasta", MONOMER / "pdb70_hits.hhr"
    (_, query), = parse_fasta(fasta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the missing 1hf9.cif
        af3 = make_features(fasta, template_hits={"A": hhr}, template_mmcif_dir=MMCIFS,
                            max_templates=4)
        af2 = make_template_features(query, parse_hhr(hhr), MMCIFS, max_hits=4)

    n_templ = af2["template_aatype"].shape[0]
    assert n_templ == 4 and af3["template_restype"].shape == (4, len(query))
    for t in range(n_templ):
        aatype = af2["template_aatype"][t]
        pos, mask = af2["template_all_atom_positions"][t], af2["template_all_atom_mask"][t]
        present = aatype < 20
        assert present.sum() > 10
        np.testing.assert_array_equal(af3["template_restype"][t][present], aatype[present])
        # pseudo-beta: CB, CA for glycine
        pb_atom = np.where(aatype == rc.restype_order["G"], rc.atom_order["CA"],
                           rc.atom_order["CB"])
        idx = np.arange(len(query))
        pb_mask = mask[idx, pb_atom] * present
        np.testing.assert_array_equal(af3["template_pseudo_beta_mask"][t], pb_mask)
        sel = pb_mask > 0
        np.testing.assert_allclose(af3["template_pseudo_beta"][t][sel],
                                   pos[idx, pb_atom][sel], atol=1e-5)
        backbone = [rc.atom_order[a] for a in ("N", "CA", "C")]
        bb_mask = mask[:, backbone].prod(-1) * present
        np.testing.assert_array_equal(af3["template_backbone_mask"][t], bb_mask)
        sel = bb_mask > 0
        np.testing.assert_allclose(af3["template_backbone"][t][sel], pos[:, backbone][sel],
                                   atol=1e-5)
        # residues without a template residue are gaps with zero masks
        assert np.all(af3["template_pseudo_beta_mask"][t][~present] == 0)
