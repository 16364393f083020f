"""A PNG of a run: the loss terms and lDDT-Ca over the steps, from ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = ["LOSS_TERMS", "plot_metrics", "read_metrics"]

# The AF2 loss terms (fold_model.af2.loss.AlphaFold2Loss) and AF3's (AlphaFold3.loss) plotted
# when present.
LOSS_TERMS = ("loss", "fape", "aux", "distogram", "masked_msa", "plddt",
              "experimentally_resolved", "violation", "tm", "diffusion", "confidence")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The JSON records of a metrics file (a line cut short by an interruption is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def plot_metrics(metrics_path: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """Two panels: each loss term (log scale) and lDDT-Ca (training batches, and the EMA
    evaluation when logged) against the step. Written atomically; returns ``out_path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval/lddt_ca" in r]
    fig, (ax_loss, ax_lddt) = plt.subplots(1, 2, figsize=(11, 4))
    for term in LOSS_TERMS:
        steps, values = _series(train, term, positive=True)
        if steps:
            # a gap (a step that logged no value of the term) breaks the line; markers keep an
            # isolated value visible
            ax_loss.plot(steps, values, ".-", ms=3, label=term, lw=2.0 if term == "loss" else 1.0)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_title("loss terms (unweighted; 'loss' is the weighted total)")
    ax_loss.legend(fontsize=7)
    lddt = _series(train, "lddt_ca")  # AF2 runs; AF3 steps log no lDDT-Ca
    if lddt[0]:
        ax_lddt.plot(*lddt, ".-", ms=3, label="training batch", lw=1.0)
    if evals:
        ax_lddt.plot([r["step"] for r in evals], [r["eval/lddt_ca"] for r in evals], "o-",
                     label="evaluation (EMA weights)")
    ax_lddt.set_ylim(0, 1)
    ax_lddt.set_xlabel("step")
    ax_lddt.set_title("lDDT-Ca")
    if lddt[0] or evals:
        ax_lddt.legend(fontsize=7)
    fig.tight_layout()
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out_path)
    return out_path


def _series(records: list[dict], key: str, *, positive: bool = False
            ) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the training records, NaN where a record has no
    finite value (``positive``: no positive value, for a log axis), so that matplotlib breaks
    the line there instead of joining the values on either side of the gap. Empty lists when
    no record has a value."""
    steps, values, any_value = [], [], False
    for r in records:
        v = r.get(key)
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (v > 0 or not positive))
        steps.append(r["step"])
        values.append(float(v) if ok else math.nan)
        any_value |= ok
    return (steps, values) if any_value else ([], [])
