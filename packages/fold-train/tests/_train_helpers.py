"""Constants and helpers shared by the fold-train tests (a uniquely named module: every
package's tests directory has a conftest.py, so tests import these from here, not from
conftest)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "demo"
CHAINS = ("1psm_A", "4zey_A")
# Small samples so that a step takes a fraction of a second on one CPU core.
SMALL = ["data.n_res=24", "data.n_clust=6", "data.n_extra=8", "data.n_templ=1",
         "max_recycling_iters=1", "loader_workers=0", "log_every=1"]
NO_DROPOUT = ["model.evoformer.msa_dropout=0", "model.evoformer.pair_dropout=0",
              "model.extra_msa.msa_dropout=0", "model.extra_msa.pair_dropout=0",
              "model.template.dropout_rate=0", "model.structure_module.dropout_rate=0"]


def as_old_adaln(named: dict) -> dict:
    """A name -> tensor map as fold saved it before AdaLN's stacked projection: separate
    ``linear_gate`` (weight, bias) and ``linear_shift`` layers (the inverse of
    ``fold_model.upgrades.upgrade_state_dict``)."""
    out = {}
    for name, t in named.items():
        if name.endswith("linear_gate_shift.weight"):
            prefix = name[: -len("linear_gate_shift.weight")]
            out[prefix + "linear_gate.weight"], out[prefix + "linear_shift.weight"] = \
                t.chunk(2, 0)
        elif name.endswith("gate_bias"):
            out[name[: -len("gate_bias")] + "linear_gate.bias"] = t
        else:
            out[name] = t
    return out
