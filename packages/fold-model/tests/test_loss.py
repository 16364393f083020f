"""AF2 losses and lDDT: zero/minimal where they should be, invariances, masks, real structures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fold_data import residue_constants as rc
from fold_model.af2.heads import AuxiliaryHeads, HeadsConfig
from fold_model.af2.loss import (
    AlphaFold2Loss,
    LossConfig,
    backbone_loss,
    compute_renamed_ground_truth,
    distogram_loss,
    experimentally_resolved_loss,
    fape_loss,
    find_structural_violations,
    lddt_loss,
    masked_msa_loss,
    sidechain_loss,
    supervised_chi_loss,
    tm_loss,
    violation_loss,
)
from fold_model.af2.metrics import lddt, lddt_ca
from fold_model.af2.structure_module import StructureModule, StructureModuleConfig
from fold_model.geometry import Rigid

REPO = Path(__file__).resolve().parents[3]
DEMO_4ZEY = REPO / "data" / "demo" / "mmcifs" / "4zey.cif"
N_REAL, N_PAD = 30, 3


def random_rigid(shape: tuple[int, ...], gen: torch.Generator) -> Rigid:
    quat = torch.randn(*shape, 4, generator=gen, dtype=torch.float64)
    return Rigid.from_quat_and_trans(quat, 10 * torch.randn(*shape, 3, generator=gen,
                                                            dtype=torch.float64))


@pytest.fixture(scope="module")
def real_batch() -> dict[str, torch.Tensor]:
    """Ground truth of 4zey chain A residues 0-29, padded by 3 residues, batch dim 1."""
    if not DEMO_4ZEY.exists():
        pytest.skip(f"{DEMO_4ZEY} absent")
    from fold_data.af2.ground_truth import make_ground_truth
    from fold_data.mmcif import parse_mmcif

    structure = parse_mmcif(DEMO_4ZEY)
    chain = structure.get_chain("A")
    aatype = chain.aatype[:N_REAL].astype(np.int64)
    gt = make_ground_truth(aatype, chain.atom37_positions[:N_REAL], chain.atom37_mask[:N_REAL])
    batch = {}
    for k, v in gt.items():
        pad = np.zeros((N_PAD, *v.shape[1:]), dtype=v.dtype)
        if k in ("rigidgroups_gt_frames", "rigidgroups_alt_gt_frames", "backbone_rigid_tensor"):
            pad[...] = np.eye(4, dtype=v.dtype)
        batch[k] = torch.from_numpy(np.concatenate([v, pad]))[None]
    batch["aatype"] = torch.from_numpy(np.concatenate([aatype, np.full(N_PAD, 20)]))[None]
    batch["residue_index"] = torch.arange(N_REAL + N_PAD)[None]
    batch["seq_mask"] = torch.cat([torch.ones(N_REAL), torch.zeros(N_PAD)])[None]
    batch["resolution"] = torch.tensor([structure.resolution], dtype=torch.float32)
    batch["use_clamped_fape"] = torch.tensor([1.0])
    return {k: (v.double() if v.is_floating_point() else v) for k, v in batch.items()}


def perfect_sm(batch: dict[str, torch.Tensor], layers: int = 2) -> dict[str, torch.Tensor]:
    """Structure-module outputs that reproduce the ground truth exactly."""
    angles = torch.zeros(*batch["aatype"].shape, 7, 2, dtype=torch.float64)
    angles[..., 1] = 1.0
    angles[..., 3:, :] = batch["chi_angles_sin_cos"]
    angles[..., 3:, 1] += 1.0 - batch["chi_mask"]  # absent chis: (0, 1)
    return {
        "frames": batch["backbone_rigid_tensor"][None].expand(layers, -1, -1, -1, -1),
        "sidechain_frames": batch["rigidgroups_gt_frames"][None],
        "positions": batch["atom14_gt_positions"][None],
        "angles": angles[None].expand(layers, *angles.shape),
        "unnormalized_angles": angles[None].expand(layers, *angles.shape),
    }


# ------------------------------------------------------------------------------ lDDT metric


def test_lddt_identical_is_one_and_hand_computed_case() -> None:
    gen = torch.Generator().manual_seed(0)
    x = 5 * torch.randn(2, 9, 3, generator=gen, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.float64)
    torch.testing.assert_close(lddt(x, x, mask), torch.ones(2, 9, dtype=torch.float64))
    # Three atoms on a line: true 0, 1, 2; predicted 0, 1, 3.2. Pair errors 0, 1.2, 1.2:
    # scores 1, 0.5, 0.5 -> per residue (1+.5)/2, (1+.5)/2, (.5+.5)/2; global 2/3.
    true = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 0, 0]], dtype=torch.float64)
    pred = torch.tensor([[0.0, 0, 0], [1, 0, 0], [3.2, 0, 0]], dtype=torch.float64)
    m = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(lddt(pred, true, m), torch.tensor([0.75, 0.75, 0.5],
                                                                 dtype=torch.float64))
    torch.testing.assert_close(lddt(pred, true, m, per_residue=False),
                               torch.tensor(2 / 3, dtype=torch.float64))
    # a masked atom takes no part; the 15 A cutoff applies to true distances
    m2 = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(lddt(pred, true, m2)[:2], torch.ones(2, dtype=torch.float64))
    far = true.clone()
    far[2, 0] = 20.0
    assert float(lddt(pred, far, m, cutoff=15.0)[0]) == pytest.approx(1.0)


def test_lddt_ca_rotation_invariant() -> None:
    gen = torch.Generator().manual_seed(1)
    true = 4 * torch.randn(11, 37, 3, generator=gen, dtype=torch.float64)
    pred = true + torch.randn(11, 37, 3, generator=gen, dtype=torch.float64)
    mask = (torch.rand(11, 37, generator=gen) > 0.2).double()
    g = random_rigid((), gen)
    score = lddt_ca(pred, true, mask)
    assert 0.0 < float(score.mean()) < 1.0
    torch.testing.assert_close(lddt_ca(g.apply(pred), true, mask), score)


# ------------------------------------------------------------------------------ FAPE


def test_fape_invariant_zero_and_clamped() -> None:
    gen = torch.Generator().manual_seed(2)
    frames = random_rigid((2, 7), gen)
    pos = 10 * torch.randn(2, 11, 3, generator=gen, dtype=torch.float64)
    fmask = (torch.rand(2, 7, generator=gen) > 0.3).double()
    pmask = (torch.rand(2, 11, generator=gen) > 0.3).double()
    noisy_frames = Rigid(frames.rots, frames.trans + torch.randn(2, 7, 3, generator=gen,
                                                                 dtype=torch.float64))
    noisy_pos = pos + 2 * torch.randn(2, 11, 3, generator=gen, dtype=torch.float64)
    zero = fape_loss(frames, frames, fmask, pos, pos, pmask, eps=1e-12)
    torch.testing.assert_close(zero, torch.zeros(2, dtype=torch.float64), atol=1e-5, rtol=0)
    loss = fape_loss(noisy_frames, frames, fmask, noisy_pos, pos, pmask)
    assert torch.all(loss > 0.05)
    # a global motion of the prediction alone (or of the truth alone) changes nothing
    g = random_rigid((), gen)
    g_frames = Rigid(g.rots.expand(2, 7, 3, 3), g.trans.expand(2, 7, 3)).compose(noisy_frames)
    moved = fape_loss(g_frames, frames, fmask, g.apply(noisy_pos), pos, pmask)
    torch.testing.assert_close(moved, loss)
    # one atom moved 1000 A away: it adds at most clamp / length_scale per valid frame pair
    far = noisy_pos.clone()
    far[:, 0] += 1000.0
    pmask[:, 0] = 1.0
    base = fape_loss(noisy_frames, frames, fmask, noisy_pos, pos, pmask)
    worse = fape_loss(noisy_frames, frames, fmask, far, pos, pmask)
    bound = 1.0 / pmask.sum(-1)  # (clamp 10 / scale 10) averaged over positions
    assert torch.all(worse > base) and torch.all(worse - base <= bound + 1e-9)
    unclamped = fape_loss(noisy_frames, frames, fmask, far, pos, pmask, clamp_distance=None)
    assert torch.all(unclamped - base > 10 * bound)


def test_backbone_loss_zero_for_truth_and_clamp_mixing(real_batch) -> None:
    b = real_batch
    traj = b["backbone_rigid_tensor"].expand(3, *b["backbone_rigid_tensor"].shape)
    zero = backbone_loss(b["backbone_rigid_tensor"], b["backbone_rigid_mask"], traj)
    assert float(zero) < 2e-3  # sqrt(eps = 1e-4) / 10 per pair
    moved = traj.clone()
    moved[:, 0, 5, :3, 3] += 40.0  # one CA far off
    args = (b["backbone_rigid_tensor"], b["backbone_rigid_mask"], moved)
    clamped = backbone_loss(*args, use_clamped_fape=torch.tensor([1.0], dtype=torch.float64))
    unclamped = backbone_loss(*args, use_clamped_fape=torch.tensor([0.0], dtype=torch.float64))
    half = backbone_loss(*args, use_clamped_fape=torch.tensor([0.5], dtype=torch.float64))
    assert float(unclamped) > float(clamped) > float(zero)
    torch.testing.assert_close(half, (clamped + unclamped) / 2)


def test_sidechain_fape_renaming_makes_symmetric_swaps_free(real_batch) -> None:
    b = real_batch
    asp = int(torch.nonzero(b["aatype"][0] == rc.restype_order["D"])[0])
    names = rc.restype_name_to_atom14_names["ASP"]
    od1, od2 = names.index("OD1"), names.index("OD2")
    pred = b["atom14_gt_positions"].clone()
    pred[0, asp, [od1, od2]] = pred[0, asp, [od2, od1]]
    frames = b["rigidgroups_gt_frames"].clone()
    frames[0, asp] = b["rigidgroups_alt_gt_frames"][0, asp]

    def loss_for(positions, sc_frames, rename=True):
        renamed = compute_renamed_ground_truth(b, positions)
        alt = renamed["alt_naming_is_better"] if rename else torch.zeros_like(b["seq_mask"])
        if not rename:
            renamed = {"renamed_atom14_gt_positions": b["atom14_gt_positions"],
                       "renamed_atom14_gt_exists": b["atom14_gt_exists"]}
        return sidechain_loss(
            sc_frames, positions, b["rigidgroups_gt_frames"], b["rigidgroups_alt_gt_frames"],
            b["rigidgroups_gt_exists"], renamed["renamed_atom14_gt_positions"],
            renamed["renamed_atom14_gt_exists"], alt,
        ), alt

    original, alt0 = loss_for(b["atom14_gt_positions"], b["rigidgroups_gt_frames"])
    swapped, alt1 = loss_for(pred, frames)
    assert float(alt0.sum()) == 0 and float(alt1[0, asp]) == 1.0 and float(alt1.sum()) == 1.0
    torch.testing.assert_close(swapped, original)
    not_renamed, _ = loss_for(pred, frames, rename=False)
    assert float(not_renamed) > float(original) + 1e-4


# ------------------------------------------------------------------------------ torsions


def test_supervised_chi_loss_pi_periodic_and_norm(real_batch) -> None:
    b = real_batch
    sm = perfect_sm(b)
    args = (b["aatype"], b["seq_mask"], b["chi_mask"], b["chi_angles_sin_cos"])
    zero = supervised_chi_loss(sm["angles"], sm["unnormalized_angles"], *args)
    assert float(zero) < 1e-6
    asp = int(torch.nonzero(b["aatype"][0] == rc.restype_order["D"])[0])
    flipped = sm["angles"].clone()
    flipped[:, 0, asp, 4] *= -1.0  # ASP chi2 + pi: pi-periodic, free
    loss = supervised_chi_loss(flipped, flipped, *args)
    assert float(loss) < 1e-6
    non_periodic = int(torch.nonzero(b["chi_mask"][0, :, 0] > 0)[0])
    flipped[:, 0, non_periodic, 3] *= -1.0  # chi1 + pi costs 4 (|2 v|^2) for that chi
    expected = 4.0 / float(b["chi_mask"].sum())
    assert float(supervised_chi_loss(flipped, flipped, *args)) == pytest.approx(expected, rel=1e-4)
    # unnormalised angles of length 2 cost angle_norm_weight * 1
    norm = supervised_chi_loss(sm["angles"], 2.0 * sm["unnormalized_angles"], *args,
                               angle_norm_weight=0.02)
    assert float(norm) == pytest.approx(0.02, rel=1e-4)


# ------------------------------------------------------------------------------ heads' losses


def test_distogram_and_msa_losses_lower_when_peaked_on_truth(real_batch) -> None:
    b = real_batch
    n = b["aatype"].shape[-1]
    gen = torch.Generator().manual_seed(3)
    breaks = torch.linspace(2.3125, 21.6875, 63, dtype=torch.float64)
    d = torch.cdist(b["pseudo_beta"], b["pseudo_beta"])
    true_bin = torch.sum(d[..., None] > breaks, -1)
    peaked = 10.0 * torch.nn.functional.one_hot(true_bin, 64).double()
    rand = torch.randn(1, n, n, 64, generator=gen, dtype=torch.float64, requires_grad=True)
    l_peak = distogram_loss(peaked, b["pseudo_beta"], b["pseudo_beta_mask"])
    l_rand = distogram_loss(rand, b["pseudo_beta"], b["pseudo_beta_mask"])
    assert float(l_peak) < 0.01 < float(l_rand.detach())
    l_rand.sum().backward()
    assert torch.isfinite(rand.grad).all() and rand.grad[0, -1].abs().sum() == 0  # padding

    s = 5
    true_msa = torch.randint(0, 22, (1, s, n), generator=gen)
    bert = (torch.rand(1, s, n, generator=gen) < 0.3).double()
    logits = torch.randn(1, s, n, 23, generator=gen, dtype=torch.float64)
    peaked = 10.0 * torch.nn.functional.one_hot(true_msa, 23).double()
    assert float(masked_msa_loss(peaked, true_msa, bert)) < 0.01 < float(
        masked_msa_loss(logits, true_msa, bert))
    changed = logits.clone()
    changed[bert == 0] = torch.randn(int((bert == 0).sum()), 23, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(masked_msa_loss(changed, true_msa, bert),
                               masked_msa_loss(logits, true_msa, bert))


def test_plddt_resolved_and_tm_losses(real_batch) -> None:
    b = real_batch
    n = b["aatype"].shape[-1]
    gen = torch.Generator().manual_seed(4)
    pred37 = b["all_atom_positions"] + 0.7 * torch.randn(1, n, 37, 3, generator=gen,
                                                         dtype=torch.float64)
    score = lddt_ca(pred37, b["all_atom_positions"], b["all_atom_mask"])
    true_bin = torch.clamp((score * 50).floor().long(), max=49)
    peaked = 10.0 * torch.nn.functional.one_hot(true_bin, 50).double()
    logits = torch.randn(1, n, 50, generator=gen, dtype=torch.float64, requires_grad=True)
    args = (pred37, b["all_atom_positions"], b["all_atom_mask"])
    l_peak = lddt_loss(peaked, *args, b["resolution"])
    l_rand = lddt_loss(logits, *args, b["resolution"])
    assert float(l_peak) < 0.01 < float(l_rand.detach())
    l_rand.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # resolution outside [0.1, 3] A: no pLDDT / resolved / TM loss
    assert float(lddt_loss(logits.detach(), *args, torch.tensor([4.0], dtype=torch.float64))) == 0

    good = 20.0 * (2 * b["all_atom_mask"] - 1)  # confident and right
    bad = -good
    ok = experimentally_resolved_loss(good, b["atom37_atom_exists"], b["all_atom_mask"],
                                      b["resolution"])
    wrong = experimentally_resolved_loss(bad, b["atom37_atom_exists"], b["all_atom_mask"],
                                         b["resolution"])
    assert float(ok) < 1e-6 and float(wrong) > 10.0

    # TM: prediction == truth puts every pair in bin 0
    tm_peak = torch.full((1, n, n, 64), -10.0, dtype=torch.float64)
    tm_peak[..., 0] = 10.0
    tm_args = (b["backbone_rigid_tensor"], b["backbone_rigid_tensor"], b["backbone_rigid_mask"],
               b["resolution"])
    assert float(tm_loss(tm_peak, *tm_args)) < 0.01
    tm_rand = torch.randn(1, n, n, 64, generator=gen, dtype=torch.float64)
    assert float(tm_loss(tm_rand, *tm_args)) > 1.0


# ------------------------------------------------------------------------------ violations


def _violation_batch(b):
    # Judge only the atoms resolved in the crystal (absent ones sit at the origin).
    vb = dict(b)
    vb["atom14_atom_exists"] = b["atom14_gt_exists"]
    return vb


def test_violation_loss_near_zero_on_real_structure_and_positive_when_broken(real_batch) -> None:
    vb = _violation_batch(real_batch)
    pos = vb["atom14_gt_positions"].clone().requires_grad_(True)
    viol = find_structural_violations(vb, pos)
    loss = violation_loss(viol, vb["atom14_atom_exists"])
    assert float(loss.detach()) < 0.05
    assert float(viol["total_per_residue_violations_mask"].detach().sum()) <= 1
    padding_bond_loss = viol["between_residues"]["per_residue_loss_sum"][0, N_REAL:].detach()
    assert float(padding_bond_loss.abs().sum()) == 0
    loss.backward()
    assert torch.isfinite(pos.grad).all()

    # stretch one peptide bond: move the C-terminal segment 1 A along C(11) -> N(12)
    stretched = vb["atom14_gt_positions"].clone()
    bond = stretched[0, 12, 0] - stretched[0, 11, 2]
    stretched[0, 12:] += bond / bond.norm()
    v2 = find_structural_violations(vb, stretched)
    assert float(v2["between_residues"]["c_n_loss_mean"]) > 0.0
    assert float(violation_loss(v2, vb["atom14_atom_exists"])) > float(loss.detach()) + 0.01
    assert float(v2["between_residues"]["per_residue_violation_mask"][0, 11:13].min()) == 1.0

    # a clash: put residue 20 on top of residue 5
    clash = vb["atom14_gt_positions"].clone()
    clash[0, 20] = clash[0, 5] + 0.5
    v3 = find_structural_violations(vb, clash)
    assert float(v3["clashes"]["mean_loss"]) > 0.0
    assert float(v3["clashes"]["per_atom_clash_mask"][0, 5].max()) == 1.0

    # squash a side chain: within-residue bond violations
    squashed = vb["atom14_gt_positions"].clone()
    ca = squashed[0, 8, 1].clone()
    squashed[0, 8, 4:] = ca + 0.3 * (squashed[0, 8, 4:] - ca)
    v4 = find_structural_violations(vb, squashed)
    assert float(v4["within_residues"]["per_atom_loss_sum"][0, 8].sum()) > 1.0


# ------------------------------------------------------------------------------ total


@pytest.mark.parametrize("preset", ["initial", "finetuning"])
def test_alphafold2_loss_end_to_end(real_batch, preset: str) -> None:
    b = {k: (v.float() if v.is_floating_point() else v) for k, v in real_batch.items()}
    n = b["aatype"].shape[-1]
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    c_s, c_z, c_m, s = 12, 6, 5, 3
    sm_mod = StructureModule(StructureModuleConfig(no_blocks=2, c_ipa=4, no_heads_ipa=2,
                                                   c_resnet=8), c_s, c_z)
    heads = AuxiliaryHeads(HeadsConfig(tm_enabled=True), c_m, c_z, c_s)
    single = torch.randn(1, n, c_s, generator=gen, requires_grad=True)
    pair = torch.randn(1, n, n, c_z, generator=gen)
    sm = sm_mod(single, pair, b["aatype"], b["seq_mask"])
    outputs = {"msa": torch.randn(1, s, n, c_m, generator=gen), "pair": pair, "single": single,
               "sm": sm, "final_atom_positions": sm["final_atom_positions"]}
    outputs.update(heads(outputs))
    b["true_msa"] = torch.randint(0, 22, (1, s, n), generator=gen)
    b["bert_mask"] = (torch.rand(1, s, n, generator=gen) < 0.3).float()
    cfg = LossConfig() if preset == "initial" else LossConfig.finetuning(ptm=True)
    total, terms = AlphaFold2Loss(cfg)(outputs, b)
    expected_terms = {"fape", "backbone_fape", "supervised_chi", "aux", "distogram",
                      "masked_msa", "plddt", "loss"}
    if preset == "finetuning":
        expected_terms |= {"experimentally_resolved", "violation", "tm"}
    assert set(terms) == expected_terms
    for k, v in terms.items():
        assert v.dim() == 0 and torch.isfinite(v), k
    weighted = (0.5 * terms["fape"] + 0.5 * terms["aux"] + 0.3 * terms["distogram"]
                + 2.0 * terms["masked_msa"] + 0.01 * terms["plddt"])
    if preset == "finetuning":
        weighted = weighted + (0.01 * terms["experimentally_resolved"] + terms["violation"]
                               + 0.1 * terms["tm"])
    torch.testing.assert_close(total, weighted)
    # an untrained random structure is far from the truth
    assert terms["fape"].item() > 0.3 and terms["backbone_fape"].item() > 0.3
    assert math.isclose(terms["masked_msa"].item(), math.log(23), rel_tol=1e-5)  # zero-init head
    total.backward()
    assert torch.isfinite(single.grad).all() and single.grad.abs().sum() > 0
    for name, p in list(sm_mod.named_parameters()) + list(heads.named_parameters()):
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), name


def test_alphafold2_loss_of_perfect_prediction_is_minimal(real_batch) -> None:
    b = real_batch
    sm = perfect_sm(b)
    n = b["aatype"].shape[-1]
    outputs = {
        "sm": sm,
        "final_atom_positions": b["all_atom_positions"],
        "distogram_logits": torch.zeros(1, n, n, 64, dtype=torch.float64),
        "masked_msa_logits": torch.zeros(1, 2, n, 23, dtype=torch.float64),
        "lddt_logits": torch.zeros(1, n, 50, dtype=torch.float64),
    }
    batch = dict(b)
    batch["true_msa"] = torch.zeros(1, 2, n, dtype=torch.long)
    batch["bert_mask"] = torch.ones(1, 2, n, dtype=torch.float64)
    _, terms = AlphaFold2Loss(LossConfig())(outputs, batch)
    assert float(terms["fape"]) < 2e-3 and float(terms["backbone_fape"]) < 2e-3
    assert float(terms["supervised_chi"]) < 1e-5
