"""AF3 training from a built cache needs no RDKit (the GPU image has none): ``fold_data.af3``
imports without it, cache entries are read, cropped and turned into samples; the steps that do
need RDKit (CCD / SMILES molecules, conformers) raise :class:`RDKitUnavailable` naming what
needed it. The cache is built here with RDKit; a fresh interpreter whose ``import rdkit`` fails
(a ``sys.meta_path`` blocker) does the rest."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from fold_data.af3 import Ccd, af3_cache, fetch_af3_features

DEMO = Path(__file__).resolve().parents[4] / "data" / "demo" / "af3"

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    from pathlib import Path

    class NoRDKit:  # any `import rdkit...` now raises ImportError
        def find_spec(self, name, path=None, target=None):
            if name == "rdkit" or name.startswith("rdkit."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoRDKit())
    try:
        import rdkit  # noqa: F401
        raise SystemExit("the rdkit blocker does not work")
    except ImportError:
        pass
    warnings.simplefilter("ignore")
    import numpy as np
    import fold_data.af3
    from fold_data.af3 import (Ccd, RDKitUnavailable, af3_cache, fetch_af3_features,
                               make_sample)
    from fold_data.af3.conformers import ccd_conformer
    from fold_data.af3.crop import crop_features, spatial_crop
    from fold_data.af3.molecules import mol_from_smiles
    from fold_data.af3.presets import AF3DataPreset

    demo, root, key = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    cache = af3_cache(root)
    assert cache.read_index() == {"3o5r": key}
    raw = cache.load(key)
    assert raw is not None and raw["ref_pos"].shape[0] == raw["atom_to_token"].shape[0]
    ccd = Ccd([demo / "ccd.cif"], use_biotite=False)
    hit = fetch_af3_features(cache, demo / "mmcifs" / "3o5r.cif", ccd=ccd,
                             max_conformer_attempts=50)
    assert hit.status == "reused" and hit.key == key
    tokens = spatial_crop(raw, 64, np.random.default_rng(0), 512, interface=True)
    cropped = crop_features(raw, tokens)
    assert cropped["restype"].shape == (len(tokens),)
    preset = AF3DataPreset("test", n_token=64, n_atom=512, n_msa=3, n_templ=1)
    sample = make_sample(raw, preset, seed=3)
    assert sample["token_mask"].shape == (64,) and sample["token_mask"].sum() > 0
    assert all(np.isfinite(v).all() for v in sample.values() if v.dtype.kind == "f")
    assert not [m for m in sys.modules if m == "rdkit" or m.startswith("rdkit.")]
    for call, needs in ((lambda: mol_from_smiles("CCO", record="ligand L"), "SMILES of ligand L"),
                        (lambda: ccd_conformer(ccd.get("FK5")), "CCD component FK5")):
        try:
            call()
            raise SystemExit(f"no error for {needs}")
        except RDKitUnavailable as err:
            assert needs in str(err) and "needs RDKit" in str(err), str(err)
            assert isinstance(err, ImportError)
    print("ok", sample["token_mask"].sum())
    """
)


def test_af3_cache_crop_and_sample_without_rdkit(tmp_path):
    ccd = Ccd([DEMO / "ccd.cif"], use_biotite=False)
    cache = af3_cache(tmp_path)
    built = fetch_af3_features(cache, DEMO / "mmcifs" / "3o5r.cif", ccd=ccd,
                               max_conformer_attempts=50)
    assert built.status == "built" and np.any(built.features["is_ligand"])
    cache.write_index({"3o5r": built.key})
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(DEMO), str(tmp_path), built.key],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.startswith("ok")
