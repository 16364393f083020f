"""AF3 structure losses at the training crop, dense ``[B, S, A, A]`` formulas against the sparse
pair lists (``fold_model.af3.pair_loss``): smooth lDDT (Alg. 27, forward + backward), lDDT and the
bond loss (Eq. 5). Issue 10: the dense smooth lDDT keeps ~7 fp32 ``[S, A, A]`` tensors for
backward (26.6 GiB at A = 4608, S = 48), which bounds the longest trainable crop.

Batch: ``benchmarks/common/af3_batch.py`` (train/af3.py's ``af3_initial`` batch: 384
tokens padded to 4608 atoms, protein + DNA duplex + ligand, ~3100 real atoms; no RDKit needed),
or ``--cif`` (fold-data featurisation, spatial crop of the ``af3_initial`` preset; needs RDKit).
The prediction is the ground truth plus 1 A Gaussian noise; ``S`` rigidly moved ground-truth
copies as in training.

Reported per loss and implementation: the bytes autograd saves for backward (storages counted
once, the inputs left out), on CUDA the peak allocated memory of forward + backward above the
inputs and the median milliseconds, the pair count, and the largest difference between dense and
sparse values / gradients. On CPU the dense rows at full size run on the meta device (saved
bytes only: 27 GiB would not fit); ``--smoke`` shrinks everything to run both for real.

    python -m benchmarks.model.loss_af3_pairs --device cuda --out $OUT        # H100: ~1 min
    python -m benchmarks.model.loss_af3_pairs --smoke --out /tmp/x            # CPU: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from fold_model.af3.diffusion import centre_random_augmentation
from fold_model.af3.loss import (
    atom_of_tokens,
    bond_loss,
    bond_loss_dense,
    lddt,
    lddt_dense,
    smooth_lddt_loss,
    smooth_lddt_loss_dense,
)
from fold_model.af3.pair_loss import lddt_pair_list

from benchmarks.common.af3_batch import synthetic_sample
from benchmarks.common.machine import device_name
from benchmarks.common.memory import saved_bytes
from benchmarks.common.results import write_result

KEYS = ("atom_positions", "atom_mask", "atom_resolved", "atom_to_token", "is_rna", "is_dna",
        "token_bonds", "token_center_atom", "token_mask")


def load_batch(args, device: torch.device) -> tuple[dict[str, torch.Tensor], str]:
    if args.cif:
        from fold_data.af3 import make_features, make_sample

        sample = make_sample(make_features(args.cif), "af3_initial", seed=args.seed)
        name = Path(args.cif).stem
    else:
        sample = synthetic_sample(args.tokens, 12 * args.tokens, 4, 1, seed=args.seed)
        name = "synthetic_af3_initial"
    feats = {k: torch.as_tensor(np.array(sample[k]))[None].to(device) for k in KEYS}
    return feats, name


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, x: torch.Tensor, reps: int) -> dict:
    """Forward + backward of ``fn(x).sum()``: peak bytes above the start (CUDA), median ms."""
    device = x.device
    row: dict = {}
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(reps):
        x.grad = None
        _sync(device)
        t0 = time.perf_counter()
        fn(x).sum().backward()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    if device.type == "cuda":
        row["peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    row["ms"] = statistics.median(times)
    return row


def _dense_meta_bytes(loss: str, x_pred, x_gt, nuc, mask, feats) -> int:
    """Saved bytes of a dense loss, on meta tensors of the same shapes (nothing allocated)."""
    xm = x_pred.detach().to("meta").requires_grad_(True)
    gm = x_gt.to("meta")
    if loss == "smooth_lddt":
        return saved_bytes(lambda: smooth_lddt_loss_dense(xm, gm, nuc.to("meta"),
                                                          mask.to("meta")), [])
    fm = {k: v.to("meta") for k, v in feats.items()}
    return saved_bytes(lambda: bond_loss_dense(xm, gm, fm), [])


def run(args) -> dict:
    device = torch.device(args.device)
    feats, name = load_batch(args, device)
    S = args.samples
    mask = feats["atom_mask"] * feats["atom_resolved"]
    tok = feats["atom_to_token"]
    nuc = (atom_of_tokens(feats["is_dna"], tok) + atom_of_tokens(feats["is_rna"], tok)) > 0
    gen = torch.Generator(device).manual_seed(0)
    x0 = feats["atom_positions"].float()[:, None].expand(-1, S, -1, -1)
    x_gt = centre_random_augmentation(x0, feats["atom_mask"].float(), 1.0, gen)
    x_pred = (x_gt + torch.randn(x_gt.shape, generator=gen, device=device)).requires_grad_(True)
    B, _, A, _ = x_pred.shape
    t0 = time.perf_counter()
    pairs = lddt_pair_list(x_gt[:, 0], nuc, mask)
    _sync(device)
    result: dict = {
        "batch": name, "device": device_name(device), "torch": torch.__version__,
        "samples": S, "atoms": A,
        "real_atoms": int(mask.sum()), "nucleotide_atoms": int((nuc & (mask > 0)).sum()),
        "pairs_unordered": int(pairs.l.numel()), "pairs_ordered": int(pairs.count.sum()),
        "pair_list_ms": (time.perf_counter() - t0) * 1e3, "rows": [],
    }
    # On an H100 (PyTorch 2.11) the dense smooth lDDT's forward at S = 48, A = 4608 (tensors of
    # 3e9 elements) ended in an illegal memory access, which ends the process: --dense meta
    # sizes the dense rows on the meta device and times only the sparse ones.
    dense_real = (device.type == "cuda" or args.smoke) and args.dense == "real"
    cases = {
        "smooth_lddt": (lambda x: smooth_lddt_loss(x, x_gt, nuc, mask, pairs=pairs),
                        lambda x: smooth_lddt_loss_dense(x, x_gt, nuc, mask)),
        "bond": (lambda x: bond_loss(x, x_gt, feats), lambda x: bond_loss_dense(x, x_gt, feats)),
    }
    for loss, (sparse_fn, dense_fn) in cases.items():
        sparse_saved = saved_bytes(lambda fn=sparse_fn: fn(x_pred), [x_pred, x_gt])
        row_s = {"loss": loss, "impl": "sparse", "saved_mib": sparse_saved / 2**20,
                 **measure(sparse_fn, x_pred, args.reps)}
        g_sparse = x_pred.grad.clone()
        v_sparse = sparse_fn(x_pred).detach()
        if dense_real:
            dense_saved = saved_bytes(lambda fn=dense_fn: fn(x_pred), [x_pred, x_gt])
            try:
                row_d = {"loss": loss, "impl": "dense", "saved_mib": dense_saved / 2**20,
                         **measure(dense_fn, x_pred, args.reps)}
                v_dense = dense_fn(x_pred).detach()
                row_d["max_abs_value_diff"] = float((v_dense - v_sparse).abs().max())
                g = x_pred.grad
                row_d["grad_rel_diff"] = float((g - g_sparse).norm() / g.norm().clamp_min(1e-30))
            except torch.cuda.OutOfMemoryError:
                row_d = {"loss": loss, "impl": "dense", "saved_mib": dense_saved / 2**20,
                         "error": "out of memory"}
        else:  # sizes only: the meta device
            row_d = {"loss": loss, "impl": "dense", "saved_mib": _dense_meta_bytes(
                loss, x_pred, x_gt, nuc, mask, feats) / 2**20,
                "note": "meta device: saved bytes only"}
        x_pred.grad = None
        result["rows"] += [row_d, row_s]
        print(json.dumps(row_s), json.dumps(row_d), sep="\n", flush=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        v = lddt(x_pred, x_gt, nuc, mask, pairs=pairs)
        _sync(device)
        row = {"loss": "lddt", "impl": "sparse", "ms": (time.perf_counter() - t0) * 1e3}
        if dense_real:
            try:
                row["max_abs_value_diff"] = float((lddt_dense(x_pred, x_gt, nuc, mask) - v)
                                                  .abs().max())
            except torch.cuda.OutOfMemoryError:
                row["max_abs_value_diff"] = None
        result["rows"].append(row)
    return result


def markdown(r: dict) -> str:
    lines = [f"# AF3 pair losses: {r['batch']}, {r['device']}, A = {r['atoms']} "
             f"({r['real_atoms']} real, {r['nucleotide_atoms']} nucleotide), S = {r['samples']}",
             "", f"pairs: {r['pairs_unordered']} unordered ({r['pairs_ordered']} ordered), list "
             f"built in {r['pair_list_ms']:.1f} ms", "",
             "| loss | impl | saved MiB | peak MiB | ms fwd+bwd | max value diff | grad rel diff |",
             "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        def f(k, fmt="{:.1f}", row=row):
            v = row.get(k)
            return "-" if v is None else fmt.format(v)
        lines.append(f"| {row['loss']} | {row['impl']} | {f('saved_mib')} | {f('peak_mib')} | "
                     f"{f('ms')} | {f('max_abs_value_diff', '{:.2e}')} | "
                     f"{f('grad_rel_diff', '{:.2e}')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--samples", type=int, default=48)
    p.add_argument("--tokens", type=int, default=384)
    p.add_argument("--cif", default=None, help="mmCIF to crop (fold-data; needs RDKit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="CPU seconds: 48 tokens, 3 samples")
    p.add_argument("--dense", choices=["real", "meta"], default="real",
                   help="run the dense references (real) or only size them on the meta device")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    if args.smoke:
        args.tokens, args.samples, args.reps = min(args.tokens, 48), min(args.samples, 3), 1
    result = run(args)
    out = Path(args.out)
    stem = "loss_af3_pairs" + ("_smoke" if args.smoke else "")
    write_result(out / f"{stem}.json", result, markdown(result), indent=2)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
