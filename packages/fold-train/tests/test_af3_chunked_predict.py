"""AF3 prediction that fits: chunked stacks (``--chunk-size``), AutoChunk (``--autochunk``) and
diffusion samples in groups (``--sample-group``) give the unchunked prediction (coordinates,
pLDDT, distogram) on a real complex (FKBP51 + FK506, cropped), and ``fold-train predict --json``
takes the flags.

Tolerances: fp32 on both sides; chunking and groups change only how rows and samples are
batched (the same sums per element, at most a different summation order inside a GEMM), so the
outputs agree to a few fp32 ulps amplified through 2 trunk passes and 3 sampler steps: 1e-5 of
each output's scale. Against the float64 prediction the fp32 rounding itself is ~1e-7 relative
per op; 1e-5 of the scale again leaves a 50x margin."""

from __future__ import annotations

import json

import gemmi
import numpy as np
import pytest
import torch
from _af3_helpers import CCD, INPUTS, fkbp_crop_batch, needs_af3_demo, noisy_tiny_af3
from fold_train.checkpoint import save_checkpoint
from fold_train.cli import main
from fold_train.config import apply_overrides, preset
from fold_train.families import af3 as af3_family
from fold_train.loop import CHECKPOINT_FORMAT
from fold_train.parallelize import Techniques, parallelize
from fold_train.predict_graphs import AF3Predictor

pytestmark = pytest.mark.slow
RTOL = 1e-5
RUN = dict(no_cycles=2, no_samples=3, no_steps=3)


def _model(seed: int = 0):
    return noisy_tiny_af3(seed)


@pytest.fixture(scope="module")
def batch():
    """The FKBP51 crop with templates in slots 0 and 2 (a random backbone walk: the template
    stack runs and is chunked); slots 1 and 3 stay empty (skipped at inference)."""
    b = fkbp_crop_batch()
    g = torch.Generator().manual_seed(11)
    n = b["template_restype"].shape[-1]
    filled = torch.tensor([1.0, 0.0, 1.0, 0.0])
    ca = torch.cumsum(torch.randn(1, 4, n, 3, generator=g), dim=2) * 2.2  # [1, T, N, 3]
    backbone = ca[..., None, :] + 0.8 * torch.randn(1, 4, n, 3, 3, generator=g)
    backbone[..., 1, :] = ca  # (N, CA, C)
    mask = filled[None, :, None].expand(1, 4, n).clone()
    b["template_backbone"] = backbone * filled[None, :, None, None, None]
    b["template_backbone_mask"] = mask
    b["template_pseudo_beta"] = (ca + torch.randn(1, 4, n, 3, generator=g)) * mask[..., None]
    b["template_pseudo_beta_mask"] = mask.clone()
    b["template_mask"] = filled[None].clone()
    return b


def _predict(batch, techniques: Techniques | None = None, budgets: dict | None = None,
             float64: bool = False):
    family, model = _model()
    done = None
    if techniques is not None:
        done = parallelize(model, family, techniques)
        for name, budget in (budgets or {}).items():
            done.autochunked[name].memory_budget = budget
    if float64:
        model.double()
        batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if float64 else torch.float32)  # the sampler's dtype
    try:
        out = AF3Predictor(model, "cpu", cuda_graphs=False)(
            batch, generator=torch.Generator().manual_seed(3), **RUN)
    finally:
        torch.set_default_dtype(default)
    return out, done


@pytest.fixture(scope="module")
def reference(batch):
    return _predict(batch)[0], _predict(batch, float64=True)[0]


def _close(out, reference) -> None:
    ref, ref64 = reference
    for k in ref:
        assert torch.isfinite(out[k]).all(), k
        scale = float(ref64[k].abs().max())
        torch.testing.assert_close(out[k], ref[k], rtol=RTOL, atol=RTOL * scale, msg=k)
        err = float((out[k].double() - ref64[k].double()).abs().max())
        assert err <= RTOL * scale, (k, err, scale)


@pytest.mark.parametrize("techniques", [
    Techniques(chunk_size=5),  # odd: the last chunk of 67 rows is short
    Techniques(sample_group_size=1),
    Techniques(chunk_size=7, sample_group_size=2),  # 3 samples: groups of 2 and 1
], ids=["chunk5", "group1", "chunk7-group2"])
def test_chunked_and_grouped_prediction_equals_unchunked(batch, reference, techniques):
    out, _ = _predict(batch, techniques)
    _close(out, reference)


def test_autochunked_prediction_equals_unchunked(batch, reference, monkeypatch):
    """Budgets below each stack's unchunked estimate (template pair stack ~23 MB, MSA module and
    Pairformer ~5.9 MB, diffusion transformer ~0.5 MB, confidence Pairformer ~18 MB at these
    sizes): every stack is planned with chunk regions and meets its budget. The per-pair steps
    outside the stacks (the diffusion's pair conditioning, the PAE / PDE reduction) run in row
    blocks: 16 rows here, so 67 tokens make four blocks and a short one."""
    monkeypatch.setattr(af3_family, "AUTOCHUNK_PAIR_ROWS", 16)
    budgets = {"template_embedder.pair_stack": 4_000_000, "msa_module": 2_000_000,
               "pairformer": 2_000_000, "diffusion.transformer": 350_000,
               "confidence_head.pairformer": 5_000_000}
    family, model = _model()
    parallelize(model, family, Techniques(autochunk=10**9))
    assert model.diffusion.conditioning.chunk_size == model.confidence_head.chunk_size == 16
    out, done = _predict(batch, Techniques(autochunk=10**9), budgets)
    assert sorted(done.autochunked) == sorted(budgets)
    for name, wrapper in done.autochunked.items():
        report = wrapper.report
        assert report is not None and report.regions, name
        assert report.simulated_peak_after <= budgets[name] < report.estimated_peak_before, name
    _close(out, reference)


def test_eager_prediction_frees_what_the_confidence_head_does_not_read(batch):
    """Without graphs, the pair-sized tensors only earlier pieces read are gone when the
    confidence head runs (at 6144 tokens each [N, N, C_z] in fp32 is 18 GiB): the trunk pass's
    outputs (copied into the recycled s, z), the trunk inputs' z_init, s_init and MSA, and the
    diffusion's pair conditioning; the fp32 distogram is made after the head. With graphs the
    outputs stay (their pool is reused by every replay)."""
    for graphs in (False, True):
        _, model = _model()
        predictor = AF3Predictor(model, "cpu", cuda_graphs=False)
        if graphs:  # the tests' capture: graphs (and padding) on, replays run eagerly
            from fold_train.cuda_graphs import EagerCapture

            predictor = AF3Predictor(model, "cpu", backend=EagerCapture())
        seen: dict[str, set] = {}

        def hook(module, args, predictor=predictor, seen=seen):
            (state,) = predictor._states.values()
            seen.update({name: set(outputs) for name, (_, outputs) in state["graphs"].items()})

        handle = model.confidence_head.register_forward_pre_hook(hook)
        out = predictor(batch, generator=torch.Generator().manual_seed(3), **RUN)
        handle.remove()
        assert torch.isfinite(out["x"]).all() and torch.isfinite(out["distogram_logits"]).all()
        if graphs:
            assert seen["trunk_cycle"] == {"s", "z"} and "z_cond" in seen["pair_conditioning"]
            assert "z_init" in seen["trunk_inputs"]
            continue
        assert seen["trunk_cycle"] == set()
        assert not {"z_init", "s_init", "msa", "msa_mask"} & seen["trunk_inputs"]
        assert "s_inputs" in seen["trunk_inputs"]  # the head reads it
        assert seen["pair_conditioning"] == {"distogram_logits"}


def test_sample_groups_draw_the_same_noise(batch):
    """Groups change nothing the sampler draws: the generator ends in the same state."""
    states = []
    for g in (None, 1):
        family, model = _model()
        model.set_sample_group_size(g)
        gen = torch.Generator().manual_seed(3)
        AF3Predictor(model, "cpu", cuda_graphs=False)(batch, generator=gen, **RUN)
        states.append(gen.get_state())
    assert torch.equal(states[0], states[1])
    with pytest.raises(ValueError, match="sample group size"):
        model.set_sample_group_size(0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = apply_overrides(preset("af3_tiny"), [])
    _, model = _model()
    path = tmp_path_factory.mktemp("ckpt") / "af3_tiny.ckpt"
    save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(),
                           "model": {k: v.clone() for k, v in model.state_dict().items()}})
    return path


def _cli(checkpoint, out, capsys, *flags) -> tuple[dict, np.ndarray]:
    rc = main(["predict", "--checkpoint", str(checkpoint), "--json",
               str(INPUTS / "fkbp51_fk506.json"), "--ccd", str(CCD), "--out", str(out),
               "--device", "cpu", "--samples", "2", "--sampler-steps", "2", "--recycles", "1",
               "--no-ema", *flags])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    st = gemmi.read_structure(str(out))
    xyz = np.array([a.pos.tolist() for ch in st[0] for res in ch for a in res])
    return json.loads(captured.out.strip().splitlines()[-1]), xyz


def test_cli_af3_chunking_flags(checkpoint, tmp_path, capsys):
    needs_af3_demo()
    _, ref = _cli(checkpoint, tmp_path / "ref.cif", capsys)
    summary, xyz = _cli(checkpoint, tmp_path / "chunked.cif", capsys, "--chunk-size", "16",
                        "--sample-group", "1")
    assert summary["chunking"] == {"chunk_size": 16, "sample_group": 1}
    # mmCIF coordinates are written with 3 decimals
    np.testing.assert_allclose(xyz, ref, atol=2e-3)
    summary, xyz = _cli(checkpoint, tmp_path / "auto.cif", capsys, "--autochunk", "40MB")
    # the input has no template: the template pair stack is skipped, so it has no plan
    assert set(summary["chunking"]["autochunk"]) == {
        "msa_module", "pairformer", "diffusion.transformer", "confidence_head.pairformer"}
    np.testing.assert_allclose(xyz, ref, atol=2e-3)
    rc = main(["predict", "--checkpoint", str(checkpoint), "--json",
               str(INPUTS / "fkbp51_fk506.json"), "--ccd", str(CCD), "--out",
               str(tmp_path / "x.cif"), "--device", "cpu", "--chunk-size", "8",
               "--autochunk", "1GB"])
    assert rc == 2 and "alternatives" in capsys.readouterr().err
