"""``fold-train predict --input-dir DIR --out-dir OUT``: many inputs, one model.

The model is loaded once (a family's runner: :class:`~fold_train.predict_af2.AF2Runner`,
:class:`~fold_train.predict_af3.AF3Runner`). Every input is first sized without being
featurised, then the inputs run in order of their shape bucket (:mod:`fold_train.buckets`), so
the CUDA graphs and kernel autotuning of a bucket serve all its inputs before the next bucket's
are captured (the previous bucket's graphs are released). Each input's outputs go to
``OUT/<name>/`` (:mod:`fold_train.confidence_outputs`). An input that fails (bad file, too
large, non-finite prediction, out of memory) is reported with the file and the reason and
skipped; a progress line per input gives its time; a final table lists every input, also
written to ``OUT/batch_summary.json``; the exit status is 1 when any input failed.

What ``DIR`` may hold:

* AF3 checkpoints: AlphaFold3 input JSONs (``*.json``) and mmCIF complexes (``*.cif``);
* AF2 checkpoints: FASTA files (``*.fasta``, ``*.fa``, ``*.faa``; the first record) and mmCIF
  files whose chains are listed in the ``--chains FILE`` (lines ``<file name> <chain>[,<chain>]``,
  ``#`` comments). An AF2 input's MSAs are the ``*.a3m`` / ``*.sto`` files of the folder named
  like it (``DIR/<stem>/`` for a FASTA, ``DIR/<stem>_<chain>/`` for an mmCIF chain); its template
  hits (``pdb70_hits.hhr`` or ``hmm_output.sto`` there) are used with ``--template-mmcif-dir``.

Other files are ignored (listed in the table when their suffix belongs to the other family).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fold_data.errors import InputError

__all__ = ["BatchInput", "batch_status", "bucket_key", "failure_reason", "find_inputs",
           "finish_batch", "read_chain_list", "run_batch"]

_FASTA = (".fasta", ".fa", ".faa")
_MMCIF = (".cif", ".mmcif")
_JSON = (".json",)
_TEMPLATE_HITS = ("pdb70_hits.hhr", "hmm_output.sto")


@dataclass
class BatchInput:
    """One input of the directory: its file, the name of its output folder, and for AF2 the
    chain (mmCIF), MSAs and template hits."""

    path: Path
    name: str
    chain: str | None = None
    msas: list[Path] = field(default_factory=list)
    templates: Path | None = None

    @property
    def fasta(self) -> Path | None:
        return self.path if self.path.suffix.lower() in _FASTA else None

    @property
    def mmcif(self) -> Path | None:
        return self.path if self.path.suffix.lower() in _MMCIF else None


def read_chain_list(path: str | os.PathLike) -> dict[str, list[str]]:
    """``{mmCIF file name: [chain, ...]}`` of a chain list (module docstring)."""
    chains: dict[str, list[str]] = {}
    for no, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) != 2:
            raise InputError(path, f"line {no}", f"expected '<mmCIF file name> <chain>[,<chain>]'"
                             f", got {line.strip()!r}")
        chains.setdefault(parts[0], []).extend(c for c in parts[1].split(",") if c)
    return chains


def _af2_extras(folder: Path, with_templates: bool) -> tuple[list[Path], Path | None]:
    """MSAs and template hits of an AF2 input from its folder (absent: none)."""
    if not folder.is_dir():
        return [], None
    files = sorted(p for p in folder.iterdir() if p.is_file())
    msas = [p for p in files if p.suffix in (".a3m", ".sto") and p.name not in _TEMPLATE_HITS]
    hits = [p for p in files if p.name in _TEMPLATE_HITS]
    return msas, (hits[0] if hits and with_templates else None)


def find_inputs(input_dir: str | os.PathLike, family: str, *,
                chain_list: str | os.PathLike | None = None, with_templates: bool = False
                ) -> tuple[list[BatchInput], list[tuple[str, str]]]:
    """``(inputs, [(file, reason)])`` of ``input_dir`` for a checkpoint of ``family``: the files
    it can predict, and those it cannot (another family's input, an mmCIF without chains)."""
    root = Path(input_dir)
    if not root.is_dir():
        raise InputError(root, "--input-dir", "is not a directory")
    chains = read_chain_list(chain_list) if chain_list is not None else {}
    items: list[BatchInput] = []
    failed: list[tuple[str, str]] = []
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        suffix = path.suffix.lower()
        if family == "af3":
            if suffix in _JSON or suffix in _MMCIF:
                items.append(BatchInput(path, path.stem))
            elif suffix in _FASTA:
                failed.append((str(path), "a FASTA file is an AF2 input; this is an AF3 "
                               "checkpoint (give an AlphaFold3 input JSON)"))
            continue
        if suffix in _JSON:
            failed.append((str(path), "an AlphaFold3 JSON needs an AF3 checkpoint; this is an "
                           "AF2 checkpoint"))
        elif suffix in _FASTA:
            msas, hits = _af2_extras(root / path.stem, with_templates)
            items.append(BatchInput(path, path.stem, msas=msas, templates=hits))
        elif suffix in _MMCIF:
            listed = chains.get(path.name) or chains.get(path.stem)
            if not listed:
                failed.append((str(path), "no chain listed for it (--chains FILE: lines "
                               "'<file name> <chain>')"))
                continue
            for chain in listed:
                name = f"{path.stem}_{chain}"
                msas, hits = _af2_extras(root / name, with_templates)
                items.append(BatchInput(path, name, chain=chain, msas=msas, templates=hits))
    return items, failed


def bucket_key(size: dict[str, int]) -> tuple:
    """The shape bucket of an input's ``{dim: n}`` (the batch runs inputs in its order)."""
    from fold_train.buckets import BucketPolicy

    policy = BucketPolicy()
    return tuple(sorted((dim, policy.size(dim, n)) for dim, n in size.items()))


def failure_reason(e: BaseException) -> str:
    """The table's reason of a failed input (an ``InputError`` names the file already)."""
    return str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"


def run_batch(runner, items: list[BatchInput], failed: list[tuple[str, str]],
              out_dir: str | os.PathLike, *, seeds=None, log=None) -> int:
    """Predict every input with ``runner`` into ``out_dir`` in bucket order (module
    docstring); returns the exit status (1 when an input failed). ``log``: where the progress
    lines and the table go (default stderr / stdout)."""
    import torch

    err = log or sys.stderr
    out = log or sys.stdout
    out_dir = Path(out_dir)
    rows: list[dict] = [{"input": f, "name": Path(f).stem, "status": "failed", "reason": r}
                        for f, r in failed]
    sized = []
    for item in items:
        try:
            size = runner.size(item)
        except Exception as e:  # noqa: BLE001 (reported and skipped: the batch goes on)
            rows.append({"input": str(item.path), "name": item.name, "status": "failed",
                         "reason": failure_reason(e)})
            continue
        sized.append((bucket_key(size), item.name, item, size))
    for r in rows:  # refused before any prediction: said at once, not only in the table
        print(f"[skip] {r['name']}: FAILED: {r['input']}: {r['reason']}", file=err, flush=True)
    sized.sort(key=lambda t: (t[0], t[1]))
    bucket = None
    for k, (b, _, item, size) in enumerate(sized, 1):
        if b != bucket and bucket is not None:
            runner.predictor.release()  # the last bucket's graphs: not needed again
        bucket = b
        label = ", ".join(f"{d} {n}" for d, n in size.items())
        t0 = time.perf_counter()
        row = {"input": str(item.path), "name": item.name, **size,
               "bucket": dict(b)}
        try:
            summary = runner.run(item, seeds=seeds, out_dir=out_dir)
        except Exception as e:  # noqa: BLE001 (reported and skipped: the batch goes on)
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            row.update(status="failed", reason=failure_reason(e))
        else:
            row.update(status="ok", out_dir=summary.get("out_dir"),
                       ranking_score=summary.get("ranking_score"),
                       mean_plddt=summary.get("mean_plddt"), ptm=summary.get("ptm"))
        row["seconds"] = round(time.perf_counter() - t0, 3)
        rows.append(row)
        what = (f"ok, ranking_score {row['ranking_score']}" if row["status"] == "ok"
                else f"FAILED: {row['reason']}")
        print(f"[{k}/{len(sized)}] {item.name} ({label}): {what} ({row['seconds']:.1f} s)",
              file=err, flush=True)
    return finish_batch(rows, out_dir, out)


def finish_batch(rows: list[dict], out_dir: str | os.PathLike, stream=None) -> int:
    """The batch's end: the table of ``rows`` on ``stream`` (default stdout) and the same rows
    in ``out_dir/batch_summary.json`` (atomically); returns the exit status (1 when an input
    failed)."""
    from fold_data.cache import atomic_write_bytes

    _table(rows, stream or sys.stdout)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "batch_summary.json",
                       (json.dumps(rows, indent=1, allow_nan=False) + "\n").encode())
    return batch_status(rows)


def batch_status(rows: list[dict]) -> int:
    """The exit status of a batch: 1 when an input failed, else 0."""
    return int(any(r["status"] != "ok" for r in rows))


def _table(rows: list[dict], stream) -> None:
    """The final table: one line per input, failed ones with their reason."""
    n_ok = sum(r["status"] == "ok" for r in rows)
    width = max([len(r["name"]) for r in rows] + [5])
    print(f"{'input':<{width}}  status  seconds  ranking_score  out / reason", file=stream)
    for r in rows:
        secs = f"{r['seconds']:.1f}" if "seconds" in r else "-"
        score = r.get("ranking_score")
        score = "-" if score is None else f"{score:.4g}"
        tail = r.get("out_dir") if r["status"] == "ok" else f"{r['input']}: {r['reason']}"
        print(f"{r['name']:<{width}}  {r['status']:<6}  {secs:>7}  {score:>13}  {tail}",
              file=stream)
    print(f"{n_ok} of {len(rows)} inputs predicted", file=stream, flush=True)
