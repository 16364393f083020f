"""fold-data parses, featurizes, samples and caches without torch (issue: 'fold-data must not need
torch'). Run in a fresh interpreter where importing torch fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    warnings.simplefilter("ignore")
    from pathlib import Path
    from fold_data.af2 import make_features, make_sample
    from fold_data.cache import FeatureCache
    demo = Path(sys.argv[1])
    raw = make_features(demo / "mmcifs" / "4zey.cif", "A",
                        msa_paths=[demo / "alignments" / "4zey_A" / "bfd_uniclust_hits.a3m"],
                        template_hits=demo / "alignments" / "4zey_A" / "hmm_output.sto",
                        template_mmcif_dir=demo / "mmcifs")
    sample = make_sample(raw, "tiny", seed=1)
    cache = FeatureCache(Path(sys.argv[2]))
    key = cache.key([demo / "mmcifs" / "4zey.cif"], {"chain": "A"})
    cache.store(key, raw, {"name": "4zey_A"})
    back = cache.load(key)
    assert set(back) == set(raw) and (back["msa"] == raw["msa"]).all()
    assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
    print("ok", sample["msa_feat"].shape)
    """
)


def test_featurize_sample_and_cache_without_torch(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(DEMO), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


QUERY_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    sys.modules["gemmi"] = None  # any `import gemmi` now raises ImportError
    warnings.simplefilter("ignore")
    from pathlib import Path
    from fold_data.af2 import make_features_from_sequence, make_sample
    demo = Path(sys.argv[1])
    a3m = demo / "alignments" / "4zey_A" / "bfd_uniclust_hits.a3m"
    query = a3m.read_text().splitlines()[1]
    raw = make_features_from_sequence(query, [a3m], None)
    sample = make_sample(raw, "tiny", seed=1, training=False)
    assert "gemmi" not in [m for m in sys.modules if sys.modules[m] is not None]
    print("ok", raw["msa"].shape)
    """
)


def test_query_features_without_gemmi():
    # a query sequence with its MSAs needs no mmCIF reader (e.g. a GPU image without gemmi)
    out = subprocess.run([sys.executable, "-c", QUERY_SCRIPT, str(DEMO)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
