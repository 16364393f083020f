"""A synthetic AF2 training batch (random sequences, MSA and a random-walk structure run
through fold-data's ground-truth builder) at the initial-training shapes or tiny ones: for the
benchmarks that time an AF2 step (model/full.py, train/ablation.py, parallel/*), where only the
cost is measured."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from fold_data.af2.ground_truth import make_ground_truth

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


def training_batch(sizes: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """``synthetic_batch`` in the Trainer's layout: features and ground truth with
    the recycling dimension ``[1, R, ...]`` (the truth the same for every pass)."""
    batch, truth = synthetic_batch(**sizes, device=device)
    r = sizes["r"]
    for k, v in truth.items():
        if k not in batch:
            batch[k] = v[:, None].expand(v.shape[0], r, *v.shape[1:]).contiguous()
    return batch
