"""Structure module: IPA invariance, equivariance, masking, dtypes (IPA against AF2's code:
test_af2_code_parity.py)."""

from __future__ import annotations

import pytest
import torch
from fold_model.af2.rigid import Rigid
from fold_model.af2.structure_module import (
    BackboneUpdate,
    InvariantPointAttention,
    StructureModule,
    StructureModuleConfig,
)

C_S, C_Z = 20, 6


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    """Random weights everywhere: the AF2 'final' zero inits would make outputs trivially 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def random_rigid(shape: tuple[int, ...], gen: torch.Generator) -> Rigid:
    quat = torch.randn(*shape, 4, generator=gen, dtype=torch.float64)
    trans = 2.0 * torch.randn(*shape, 3, generator=gen, dtype=torch.float64)
    return Rigid.from_quat_and_trans(quat, trans)


def _ipa_inputs(seed: int, n: int = 7):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n, C_S, generator=gen, dtype=torch.float64)
    z = torch.randn(2, n, n, C_Z, generator=gen, dtype=torch.float64)
    rigid = random_rigid((2, n), gen)
    mask = torch.ones(2, n, dtype=torch.float64)
    mask[0, 2] = 0.0  # a hole
    mask[1, -2:] = 0.0  # padding
    return s, z, rigid, mask, gen


def _make_ipa(seed: int) -> InvariantPointAttention:
    ipa = InvariantPointAttention(C_S, C_Z, c_ipa=5, no_heads=3, no_qk_points=4, no_v_points=3)
    ipa = ipa.double()
    randomize(ipa, seed)
    return ipa


def test_ipa_invariant_to_global_rigid_motion() -> None:
    ipa = _make_ipa(2)
    s, z, rigid, mask, gen = _ipa_inputs(3)
    out = ipa(s, z, rigid, mask)
    g = random_rigid((), gen)
    g = Rigid(g.rots.expand(2, 7, 3, 3), 10.0 * g.trans.expand(2, 7, 3))
    out_moved = ipa(s, z, g.compose(rigid), mask)
    torch.testing.assert_close(out_moved, out, atol=1e-10, rtol=1e-10)
    # and it is not trivially constant: moving one residue's frame alone changes the output
    single = random_rigid((), gen)
    rots, trans = rigid.rots.clone(), rigid.trans.clone()
    rots[0, 0], trans[0, 0] = single.rots, single.trans
    assert (ipa(s, z, Rigid(rots, trans), mask) - out).abs().max() > 1e-3


def test_ipa_ignores_masked_keys() -> None:
    ipa = _make_ipa(4)
    s, z, rigid, mask, gen = _ipa_inputs(5)
    out = ipa(s, z, rigid, mask)
    s2, z2 = s.clone(), z.clone()
    s2[1, -2:] = torch.randn(2, C_S, generator=gen, dtype=torch.float64)
    z2[0, :, 2] = torch.randn(7, C_Z, generator=gen, dtype=torch.float64)
    out2 = ipa(s2, z2, rigid, mask)
    keep = mask.bool()
    torch.testing.assert_close(out2[keep], out[keep], atol=1e-10, rtol=1e-10)


def test_backbone_update_quaternion_and_zero_init() -> None:
    bb = BackboneUpdate(C_S)
    upd = bb(torch.randn(3, C_S))
    torch.testing.assert_close(upd.rots, torch.eye(3).expand(3, 3, 3))  # 'final' init -> identity
    torch.testing.assert_close(upd.trans, torch.zeros(3, 3))
    randomize(bb, 6)
    upd = bb(torch.randn(3, C_S))
    torch.testing.assert_close(upd.rots @ upd.rots.transpose(-1, -2), torch.eye(3).expand(3, 3, 3),
                               atol=1e-6, rtol=0)


def _make_sm(seed: int, dtype=torch.float64) -> StructureModule:
    cfg = StructureModuleConfig(c_ipa=4, c_resnet=8, no_heads_ipa=2, no_qk_points=3,
                                no_v_points=2, no_blocks=3, dropout_rate=0.1)
    sm = StructureModule(cfg, C_S, C_Z).to(dtype)
    randomize(sm, seed, scale=0.2)
    return sm.eval()


def _sm_inputs(seed: int, n: int = 9, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n, C_S, generator=gen, dtype=dtype)
    z = torch.randn(2, n, n, C_Z, generator=gen, dtype=dtype)
    aatype = torch.randint(0, 20, (2, n), generator=gen)
    mask = torch.ones(2, n, dtype=dtype)
    if n > 4:
        mask[0, 3] = 0
        mask[1, -3:] = 0
    return s, z, aatype, mask, gen


def test_structure_module_shapes_and_finite_gradients() -> None:
    sm = _make_sm(7, torch.float32).train()
    s, z, aatype, mask, _ = _sm_inputs(8, dtype=torch.float32)
    s.requires_grad_(True)
    out = sm(s, z, aatype, mask)
    n = 9
    shapes = {
        "frames": (3, 2, n, 4, 4), "sidechain_frames": (3, 2, n, 8, 4, 4),
        "unnormalized_angles": (3, 2, n, 7, 2), "angles": (3, 2, n, 7, 2),
        "positions": (3, 2, n, 14, 3), "states": (3, 2, n, C_S), "single": (2, n, C_S),
        "final_atom14_positions": (2, n, 14, 3), "final_atom_positions": (2, n, 37, 3),
        "final_atom_mask": (2, n, 37), "final_affine_tensor": (2, n, 4, 4),
    }
    for key, shape in shapes.items():
        assert out[key].shape == shape, key
        assert torch.isfinite(out[key]).all(), key
    torch.testing.assert_close(out["angles"].norm(dim=-1), torch.ones(3, 2, n, 7))
    assert out["final_atom_mask"][1, -3:].sum() == 0
    loss = out["final_atom_positions"].square().mean() + out["frames"].sum()
    loss.backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
    for name, p in sm.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_structure_module_equivariant_to_initial_frames() -> None:
    sm = _make_sm(9)
    s, z, aatype, mask, gen = _sm_inputs(10)
    start = random_rigid((2, 9), gen).scale_translation(5.0)
    out = sm(s, z, aatype, mask, initial_frames=start.to_tensor_4x4())
    g = random_rigid((), gen)
    g = Rigid(g.rots.expand(2, 9, 3, 3), 20.0 * g.trans.expand(2, 9, 3))
    out_moved = sm(s, z, aatype, mask, initial_frames=g.compose(start).to_tensor_4x4())
    # single representation invariant; atoms and frames move with g
    torch.testing.assert_close(out_moved["single"], out["single"], atol=1e-9, rtol=1e-9)
    exists = out["final_atom14_positions"].abs().sum(-1) > 0  # absent atom14 slots stay at 0
    moved = g.unsqueeze(-1).apply(out["final_atom14_positions"])
    torch.testing.assert_close(out_moved["final_atom14_positions"][exists], moved[exists],
                               atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(out_moved["sidechain_frames"],
                               g.to_tensor_4x4()[:, :, None] @ out["sidechain_frames"],
                               atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(out_moved["final_affine_tensor"],
                               g.to_tensor_4x4() @ out["final_affine_tensor"], atol=1e-9, rtol=1e-9)
    # The default start is the identity ("black hole"): same as passing identity frames.
    ident = Rigid.identity((2, 9), dtype=torch.float64).to_tensor_4x4()
    torch.testing.assert_close(sm(s, z, aatype, mask)["single"],
                               sm(s, z, aatype, mask, initial_frames=ident)["single"])


def test_structure_module_masked_residues_do_not_leak() -> None:
    sm = _make_sm(11)
    s, z, aatype, mask, gen = _sm_inputs(12)
    out = sm(s, z, aatype, mask)
    s2 = s.clone()
    s2[1, -3:] = 5.0 * torch.randn(3, C_S, generator=gen, dtype=torch.float64)
    s2[0, 3] = 5.0 * torch.randn(C_S, generator=gen, dtype=torch.float64)
    out2 = sm(s2, z, aatype, mask)
    keep = mask.bool()
    torch.testing.assert_close(out2["final_atom_positions"][keep],
                               out["final_atom_positions"][keep], atol=1e-9, rtol=1e-9)


def test_structure_module_runs_fp32_under_bf16_autocast() -> None:
    sm = _make_sm(13, torch.float32)
    s, z, aatype, mask, _ = _sm_inputs(14, dtype=torch.float32)
    ref = sm(s, z, aatype, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sm(s.bfloat16(), z.bfloat16(), aatype, mask)
    assert out["final_atom_positions"].dtype == torch.float32
    # Only the inputs were rounded to bf16: compare with fp32 run on the same rounded inputs.
    ref_rounded = sm(s.bfloat16().float(), z.bfloat16().float(), aatype, mask)
    torch.testing.assert_close(out["final_atom_positions"], ref_rounded["final_atom_positions"])
    assert torch.isfinite(ref["final_atom_positions"]).all()


@pytest.mark.parametrize("n", [1, 5])
def test_structure_module_small_sizes(n: int) -> None:
    sm = _make_sm(17)
    s, z, aatype, mask, _ = _sm_inputs(18, n=n)
    mask = torch.ones(2, n, dtype=torch.float64)
    out = sm(s, z, aatype, mask)
    assert out["final_atom_positions"].shape == (2, n, 37, 3)
    assert torch.isfinite(out["final_atom_positions"]).all()
