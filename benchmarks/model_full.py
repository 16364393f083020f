"""The full AF2 model (``af2_initial``) forward + backward + loss at the initial-training shapes:
N_res 256, N_clust 128, N_extra 1024, 4 templates, 4 recycling passes (3 without gradients, the
last with), per-block activation checkpointing, bf16 autocast (structure module in fp32).

    python benchmarks/model_full.py --out results/model_full.json      # CUDA
    python benchmarks/model_full.py --tiny --device cpu                # CPU smoke test (seconds)

Reports the median step time (ms) and peak memory (MiB, CUDA); JSON to ``--out`` and a markdown
line beside it. The batch is synthetic (random sequences, MSA and a random-walk structure run
through fold-data's ground-truth builder) since only the cost is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from fold_data.af2.ground_truth import make_ground_truth
from fold_model.af2 import AlphaFold2, config
from fold_model.af2.loss import AlphaFold2Loss

FULL = {"n_res": 256, "n_clust": 128, "n_extra": 1024, "n_templ": 4, "r": 4}
TINY = {"n_res": 12, "n_clust": 5, "n_extra": 7, "n_templ": 2, "r": 2}


def synthetic_batch(n_res: int, n_clust: int, n_extra: int, n_templ: int, r: int,
                    device: torch.device, seed: int = 0) -> tuple[dict, dict]:
    """(model batch ``[1, R, ...]``, ground truth of the last pass ``[1, ...]``)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    aatype = torch.randint(0, 20, (n_res,), generator=g)
    # A random walk of CA-like steps with all backbone/side-chain atoms jittered around it.
    ca = np.cumsum(rng.normal(size=(n_res, 3)) * 2.2, axis=0)
    atoms = ca[:, None, :] + rng.normal(size=(n_res, 37, 3)) * 1.5
    gt = make_ground_truth(aatype.numpy(), atoms, np.ones((n_res, 37), np.float32))
    gt = {k: torch.as_tensor(v) for k, v in gt.items()}

    def rep(x):  # add the batch and recycling dims
        return x[None, None].expand(1, r, *x.shape).contiguous()

    msa = torch.randint(0, 22, (r, n_clust, n_res), generator=g)
    batch = {
        "aatype": rep(aatype.int()),
        "residue_index": rep(torch.arange(n_res, dtype=torch.int32)),
        "seq_mask": rep(torch.ones(n_res)),
        "target_feat": rep(F.one_hot(aatype, 22).float()),
        "msa_feat": torch.cat([F.one_hot(msa, 23).float(),
                               torch.rand(r, n_clust, n_res, 26, generator=g)], -1)[None],
        "msa_mask": torch.ones(1, r, n_clust, n_res),
        "extra_msa": torch.randint(0, 23, (1, r, n_extra, n_res), generator=g).int(),
        "extra_has_deletion": torch.zeros(1, r, n_extra, n_res),
        "extra_deletion_value": torch.zeros(1, r, n_extra, n_res),
        "extra_msa_mask": torch.ones(1, r, n_extra, n_res),
        "template_mask": torch.ones(1, r, n_templ),
        "template_aatype": rep(aatype.int()[None].expand(n_templ, n_res)),
        "template_all_atom_positions": rep(
            gt["all_atom_positions"][None].expand(n_templ, -1, -1, -1)
        ),
        "template_all_atom_mask": rep(gt["all_atom_mask"][None].expand(n_templ, -1, -1)),
        "template_pseudo_beta": rep(gt["pseudo_beta"][None].expand(n_templ, -1, -1)),
        "template_pseudo_beta_mask": rep(gt["pseudo_beta_mask"][None].expand(n_templ, -1)),
        "template_torsion_angles_sin_cos": torch.randn(1, r, n_templ, n_res, 7, 2),
        "template_alt_torsion_angles_sin_cos": torch.randn(1, r, n_templ, n_res, 7, 2),
        "template_torsion_angles_mask": torch.ones(1, r, n_templ, n_res, 7),
    }
    truth = {k: v[None] for k, v in gt.items()}
    truth.update({
        "aatype": aatype[None].int(),
        "seq_mask": torch.ones(1, n_res),
        "true_msa": msa[-1][None].int(),
        "bert_mask": (torch.rand(1, n_clust, n_res, generator=g) < 0.15).float(),
        "resolution": torch.tensor([2.0]),
        "use_clamped_fape": torch.tensor([1.0]),
    })
    move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
    return move(batch), move(truth)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny config and shapes (smoke test)")
    parser.add_argument("--order", default="af2", choices=["af2", "multimer", "parallel"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("model_full: --device cuda requested but CUDA is not available")
    sizes = TINY if args.tiny else FULL
    cfg = config("tiny" if args.tiny else "af2_initial", block_order=args.order,
                 checkpoint_blocks=True)
    torch.manual_seed(0)
    model = AlphaFold2(cfg).to(device).train()
    loss_fn = AlphaFold2Loss(cfg.loss)
    batch, truth = synthetic_batch(**sizes, device=device)
    n_params = sum(p.numel() for p in model.parameters())

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            outputs = model(batch)
        loss, _ = loss_fn(outputs, truth)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    loss_value = step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    result = {
        "preset": "tiny" if args.tiny else "af2_initial", "order": args.order, **sizes,
        "params": n_params, "step_ms": statistics.median(times), "loss": loss_value,
        "peak_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                     if device.type == "cuda" else None),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if not np.isfinite(loss_value):
        raise SystemExit(f"model_full: non-finite loss {loss_value}")
    print(json.dumps(result), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        peak = "-" if result["peak_mib"] is None else f"{result['peak_mib']:.0f}"
        args.out.with_suffix(".md").write_text(
            "| preset | order | N_res | N_clust | N_extra | N_templ | passes | step ms "
            "| peak MiB |\n"
            "|---|---|---|---|---|---|---|---|---|\n"
            f"| {result['preset']} | {args.order} | {sizes['n_res']} | {sizes['n_clust']} | "
            f"{sizes['n_extra']} | {sizes['n_templ']} | {sizes['r']} | "
            f"{result['step_ms']:.1f} | {peak} |\n"
        )
    return result


if __name__ == "__main__":
    main()
