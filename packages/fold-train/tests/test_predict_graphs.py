"""Shape buckets and graphed prediction (issue 20 section 2): the bucket policy; padding a batch to
a bucket exactly as fold-data pads; padded prediction equal to unpadded prediction on the real
positions (AF2 and AF3, pair-derived outputs included); the graphed predictor (EagerCapture, the
CPU stand-in for a capture) equal to the eager one, one capture set per bucket; no host
synchronization inside a captured piece."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import torch
from _af3_helpers import CCD, INPUTS, ligand_crop, needs_af3_demo
from _train_helpers import DEMO
from fold_train.buckets import BucketPolicy, fit_to_bucket, real_extent, resize_batch
from fold_train.config import apply_overrides, preset
from fold_train.cuda_graphs import EagerCapture, host_syncs
from fold_train.data import collate
from fold_train.families import make_family
from fold_train.predict_graphs import AF2Predictor, AF3Predictor

# fp32 on both sides; the padded run sums the same terms plus exact zeros (masked keys have zero
# softmax weight, masked rows zero contribution), so only the summation order may differ: a few
# ulps per reduction, amplified through the recycled layers. 1e-5 of the output's scale.
RTOL = 1e-5


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), what
    scale = float(b.abs().max())
    torch.testing.assert_close(a, b, rtol=RTOL, atol=RTOL * scale, msg=what)


def _randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights everywhere (the zero-initialized final layers too: otherwise pLDDT and the
    distogram are constants and could not show a padding error)."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


class CountingCapture(EagerCapture):
    """EagerCapture that counts captures and checks that no captured piece syncs with the host."""

    def __init__(self) -> None:
        self.captures = 0
        self.syncs: list[str] = []

    def capture(self, fn, warmup_fn=None):
        self.captures += 1
        if warmup_fn is not None:
            warmup_fn()  # constant tables are built on first use, before the probe
        self.syncs += host_syncs(fn)
        return super().capture(fn, None)


# -- the policy ---------------------------------------------------------------------------------

def test_bucket_policy():
    p = BucketPolicy()
    assert [p.size("N_res", n) for n in (1, 64, 65, 500, 512, 513, 700, 1024)] == \
        [64, 64, 128, 512, 512, 640, 768, 1024]
    assert [p.size("N_token", n) for n in (384, 640, 768, 767)] == [384, 640, 768, 768]
    assert [p.size("N_atom", n) for n in (1, 256, 4607, 4608, 9216)] == [256, 256, 4608, 4608,
                                                                          9216]
    assert [p.size("N_extra", n) for n in (1, 3, 128, 1000, 1024, 1025, 5120)] == \
        [1, 4, 128, 1024, 1024, 2048, 5120]
    assert [p.size("N_templ", n) for n in (0, 1, 3, 4)] == [0, 1, 4, 4]
    assert p.size("R", 3) == 3  # dims outside the policy are kept
    assert p.bucket({"N_res": 100, "N_clust": 5}) == (("N_clust", 8), ("N_res", 128))
    with pytest.raises(ValueError, match="residue_step must be >= 1"):
        BucketPolicy(residue_step=0)


# -- padding as fold-data pads --------------------------------------------------------------------

@pytest.fixture(scope="module")
def af2_raw():
    if not (DEMO / "mmcifs").is_dir():
        pytest.skip(f"bundled demo data not found at {DEMO}")
    from fold_train.predict import make_raw_features

    msas = sorted(glob.glob(str(DEMO / "alignments" / "4zey_A" / "*.a3m")))
    return make_raw_features(mmcif=DEMO / "mmcifs" / "4zey.cif", chain="A", msas=msas)[1]


def _af2_config(extra=()):
    return apply_overrides(preset("tiny"), ["data.n_res=24", "data.n_clust=6", "data.n_extra=8",
                                            "data.n_templ=1", "max_recycling_iters=1", *extra])


def test_af2_padding_equals_fold_data_padding(af2_raw):
    """A sample padded to a bucket is the sample fold-data makes at that size (fill values,
    identity frames, masks 0); cutting into real entries is refused."""
    from fold_data.af2 import make_sample
    from fold_data.af2.transforms import PAD_VALUES

    n = int(af2_raw["seq_length"])  # 84
    small = _af2_config().data_preset()
    big = _af2_config(["data.n_res=128"]).data_preset()
    batch = collate([make_sample(af2_raw, small, seed=0, training=False)])
    want = collate([make_sample(af2_raw, big, seed=0, training=False)])
    padded = resize_batch(batch, "af2", {"N_res": 128})
    assert set(padded) == set(want)
    for k in want:
        assert torch.equal(padded[k], want[k]), k
    # deeper MSAs: the new rows hold fold-data's fill values (gap, masks 0)
    deeper = resize_batch(batch, "af2", {"N_clust": 8, "N_extra": 16})
    assert torch.equal(deeper["msa_feat"][:, :, :6], batch["msa_feat"])
    for k in ("msa_feat", "msa_mask", "true_msa", "bert_mask"):
        assert (deeper[k][:, :, 6:] == PAD_VALUES.get(k, 0)).all(), k
    for k in ("extra_msa", "extra_msa_mask", "extra_deletion_value"):
        assert (deeper[k][:, :, 8:] == PAD_VALUES.get(k, 0)).all(), k
    assert (deeper["extra_msa"][:, :, 8:] == 21).all()  # the gap
    assert real_extent(padded, "af2")["N_res"] == n
    with pytest.raises(ValueError, match=r"cannot cut N_res .* 'seq_mask' marks real entries up "
                                         r"to 84"):
        resize_batch(batch, "af2", {"N_res": 80})


@pytest.fixture(scope="module")
def af3_raw():
    needs_af3_demo()
    from fold_data.af3 import Ccd
    from fold_data.af3.crop import crop_features
    from fold_train.predict_af3 import make_af3_inputs

    _, raw = make_af3_inputs(INPUTS / "fkbp51_fk506.json", Ccd([CCD], use_biotite=False))
    return crop_features(raw, ligand_crop(raw, 10))  # 67 tokens, 121 atoms (FK506 whole)


def test_af3_padding_equals_fold_data_padding(af3_raw):
    from fold_data.af3 import AF3DataPreset, make_sample

    n_tok, n_at = len(af3_raw["asym_id"]), len(af3_raw["atom_to_token"])
    batch = collate([make_sample(af3_raw, "af3_predict", seed=0)])
    want = collate([make_sample(af3_raw, AF3DataPreset("x", n_token=96, n_atom=192, n_msa=4),
                                seed=0)])
    padded = resize_batch(batch, "af3", {"N_token": 96, "N_atom": 192, "N_msa": 4})
    for k in want:
        assert torch.equal(padded[k], want[k]), k
    assert real_extent(padded, "af3") == {"N_token": n_tok, "N_atom": n_at, "N_msa": 1,
                                           "N_templ": 0}


# -- AF2 prediction -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def af2_model():
    torch.manual_seed(0)
    mc = _af2_config().model_config()
    return _randomized(make_family("af2", mc).build_model(mc))


def _af2_batch(raw, holes: bool = True):
    from fold_data.af2 import make_sample

    batch = collate([make_sample(raw, _af2_config().data_preset(), seed=0, training=False)])
    if holes:  # masks with holes inside the real region: padding must not fill them
        batch["msa_mask"][..., 1, 10:20] = 0
        batch["extra_msa_mask"][..., 2:4, 30:33] = 0
    return batch


def test_af2_padded_graphed_prediction_equals_unpadded(af2_raw, af2_model):
    n = int(af2_raw["seq_length"])
    batch = _af2_batch(af2_raw)
    with torch.no_grad():
        ref = af2_model(batch)
    # eager, unpadded (graphs off): the same iterations as the model's forward, bit for bit
    eager = AF2Predictor(af2_model, "cpu", cuda_graphs=False)(batch)
    for k in ("final_atom_positions", "plddt", "distogram_logits"):
        assert torch.equal(eager[k], ref[k]), k
    # padded to the bucket (84 -> 128 residues, 6 -> 8 clusters), 'captured' and replayed
    backend = CountingCapture()
    graphed = AF2Predictor(af2_model, "cpu", backend=backend)
    out = graphed(batch)
    assert out["plddt"].shape == (1, 128)
    _close(out["final_atom_positions"][0, :n], ref["final_atom_positions"][0], "positions")
    _close(out["plddt"][0, :n], ref["plddt"][0], "pLDDT")
    _close(out["distogram_logits"][0, :n, :n], ref["distogram_logits"][0], "distogram")
    # the replay equals the eager run on the same padded input exactly
    padded_eager = AF2Predictor(af2_model, "cpu", cuda_graphs=False, pad=True)(batch)
    for k in out:
        assert torch.equal(out[k], padded_eager[k]), k
    assert backend.syncs == []  # capturable: no host synchronization in the iteration


def test_af2_one_capture_per_bucket(af2_raw, af2_model):
    """Two lengths of one bucket share the captured iteration; another bucket captures again;
    fewer recycling passes replay the same graph."""
    backend = CountingCapture()
    graphed = AF2Predictor(af2_model, "cpu", backend=backend,
                           policy=BucketPolicy(residue_step=32))
    batch = _af2_batch(af2_raw, holes=False)  # 84 residues: bucket 96
    shorter = resize_batch(_cut_af2(batch, 70), "af2", {"N_res": 84})  # 70 residues: 96 too
    longer = resize_batch(batch, "af2", {"N_res": 84})
    graphed(longer)
    graphed(shorter, num_recycles=1)
    assert backend.captures == 1 and len(graphed.buckets) == 1
    graphed(_cut_af2(batch, 40))  # bucket 64
    assert backend.captures == 2 and len(graphed.buckets) == 2
    # the short chain's prediction through the shared graph equals its own eager prediction
    with torch.no_grad():
        ref = af2_model(_cut_af2(batch, 70), num_recycles=1)
    out = graphed(shorter, num_recycles=1)
    _close(out["final_atom_positions"][0, :70], ref["final_atom_positions"][0], "positions")
    assert backend.captures == 2


def _cut_af2(batch, n: int):
    """The first ``n`` residues as a chain of its own (a shorter input, not padding)."""
    from fold_data.af2.schema import SAMPLE_FEATURES

    out = {}
    for k, v in batch.items():
        for axis, d in enumerate(SAMPLE_FEATURES[k].shape):
            if d == "N_res":
                v = v.narrow(axis + 1, 0, n)
        out[k] = v.clone()
    return out


# -- AF3 prediction -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def af3_model():
    torch.manual_seed(0)
    mc = apply_overrides(preset("af3_tiny"), []).model_config()
    return _randomized(make_family("af3", mc).build_model(mc))


def _af3_reference(model, batch, seed: int, *, cycles=2, samples=2, steps=4):
    """The model's own trunk, EDM sampler and heads on the unpadded batch."""
    from fold_model.af3.confidence import expected_value
    from fold_train.predict_graphs import _pair_confidences

    with torch.no_grad():
        s_inputs, s, z = model.trunk(batch, cycles)
        x = model.sample(batch, s_inputs, s, z, no_samples=samples, no_steps=steps,
                         generator=torch.Generator().manual_seed(seed))
        logits = model.confidence_head(batch, s_inputs, s, z, x)
        plddt = expected_value(logits["plddt"], 100.0)
        distogram = model.distogram_head(z + z.transpose(-2, -3))
        # PAE, PDE, TM-adjusted PAE, contact probabilities: the padded prediction's equal these
        return {"x": x, "plddt": plddt, "distogram_logits": distogram,
                **_pair_confidences(logits, batch["asym_id"], distogram, model.config)}


def test_af3_padded_graphed_prediction_equals_unpadded(af3_raw, af3_model):
    from fold_data.af3 import make_sample

    batch = collate([make_sample(af3_raw, "af3_predict", seed=0)])
    batch["msa_mask"][..., 5:9] = 0  # a hole in the (query row's) MSA mask
    ref = _af3_reference(af3_model, batch, seed=3)
    run = dict(no_cycles=2, no_samples=2, no_steps=4)
    eager = AF3Predictor(af3_model, "cpu", cuda_graphs=False)(
        batch, generator=torch.Generator().manual_seed(3), **run)
    for k in ref:  # the step-wise sampler draws and computes what sample_diffusion does
        assert torch.equal(eager[k], ref[k]), k
    backend = CountingCapture()
    policy = BucketPolicy(residue_step=32, atom_step=64)  # 67 -> 96 tokens, 121 -> 128 atoms
    graphed = AF3Predictor(af3_model, "cpu", backend=backend, policy=policy)
    out = graphed(batch, generator=torch.Generator().manual_seed(3), **run)
    assert dict(graphed.buckets[0][0]) == {"N_token": 96, "N_atom": 128, "N_msa": 1,
                                           "N_templ": 4}  # 4 template slots, none used
    for k in ref:
        _close(out[k], ref[k], k)
    assert backend.syncs == []
    assert backend.captures == 4  # trunk inputs, trunk pass, pair conditioning, sampler step
    padded_eager = AF3Predictor(af3_model, "cpu", cuda_graphs=False, pad=True, policy=policy)(
        batch, generator=torch.Generator().manual_seed(3), **run)
    for k in out:
        assert torch.equal(out[k], padded_eager[k]), k
    # another input of the same bucket (fewer tokens and atoms) reuses the four graphs
    from fold_data.af3.crop import crop_features

    smaller = collate([make_sample(crop_features(af3_raw, np.arange(2, 67)), "af3_predict",
                                   seed=0)])
    conditioning = af3_model.diffusion.conditioning
    pair_calls = []
    conditioning.pair = lambda *a, **k: pair_calls.append(1) or type(conditioning).pair(
        conditioning, *a, **k)
    try:
        got = graphed(smaller, generator=torch.Generator().manual_seed(4), **run)
    finally:
        del conditioning.pair
    assert backend.captures == 4 and len(graphed.buckets) == 1
    # the replayed sampler steps read this prediction's context: the pair conditioning is made
    # once (its piece), not again in each of the 4 steps
    assert len(pair_calls) == 1
    for k, v in _af3_reference(af3_model, smaller, seed=4).items():
        _close(got[k], v, k)
    # more samples: another set of graphs (the sampler's shapes change)
    graphed(smaller, generator=torch.Generator().manual_seed(4), no_cycles=1, no_samples=3,
            no_steps=2)
    assert backend.captures == 8 and len(graphed.buckets) == 2


def test_fit_to_bucket_trims_fold_data_padding(af2_raw):
    """A short chain that fold-data padded to a larger preset runs in its own bucket."""
    from fold_data.af2 import make_sample

    preset_256 = _af2_config(["data.n_res=256"]).data_preset()
    batch = collate([make_sample(af2_raw, preset_256, seed=0, training=False)])
    assert batch["aatype"].shape[-1] == 256
    fitted, bucket = fit_to_bucket(batch, "af2")
    assert dict(bucket)["N_res"] == 128 and fitted["aatype"].shape[-1] == 128


# -- the weights' casts, made once per prediction ------------------------------------------------

class _ParameterCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the casts of parameters (``_to_copy`` of an ``nn.Parameter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten._to_copy and \
                isinstance(args[0], torch.nn.Parameter):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("graphs", [False, True])
def test_af3_bf16_weight_casts_made_once(af3_raw, af3_model, graphs):
    """bf16: the predictor's weight casts give the values of casting in every call, bit for bit
    (eager and 'captured'), and a prediction after the first casts no parameter at all; a
    changed weight is seen by the next prediction (the casts are refreshed)."""
    from fold_data.af3 import make_sample

    batch = collate([make_sample(af3_raw, "af3_predict", seed=0)])
    run = dict(no_cycles=1, no_samples=2, no_steps=3)

    def predictor(once: bool) -> AF3Predictor:
        if graphs:
            return AF3Predictor(af3_model, "cpu", precision="bf16", backend=EagerCapture(),
                                cast_weights_once=once)
        return AF3Predictor(af3_model, "cpu", precision="bf16", cuda_graphs=False,
                            cast_weights_once=once)

    def predict(p: AF3Predictor) -> dict:
        return p(batch, generator=torch.Generator().manual_seed(5), **run)

    per_call, once = predictor(False), predictor(True)
    ref = predict(per_call)
    first = predict(once)
    with _ParameterCasts() as casts:
        second = predict(once)
    for k in ref:
        assert torch.isfinite(ref[k]).all(), k
        assert torch.equal(first[k], ref[k]) and torch.equal(second[k], ref[k]), k
    assert casts.count == 0 and len(once.weight_casts) > 50
    with _ParameterCasts() as casts:
        predict(per_call)
    assert casts.count > 50  # what the cache saves: every step casts the weights again
    # a weight changed between predictions (a training step before a validation prediction)
    weight = af3_model.diffusion.transformer.blocks[0].transition.linear_out.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.add_(0.5)
        changed = predict(once)
        assert torch.equal(changed["x"], predict(per_call)["x"])
        assert not torch.equal(changed["x"], ref["x"])
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_af2_bf16_weight_casts_made_once(af2_raw, af2_model):
    """AF2 in bf16: the same outputs bit for bit with the casts made once, and fewer casts."""
    batch = _af2_batch(af2_raw)
    per_call = AF2Predictor(af2_model, "cpu", precision="bf16", cuda_graphs=False,
                            cast_weights_once=False)
    once = AF2Predictor(af2_model, "cpu", precision="bf16", cuda_graphs=False)
    ref = per_call(batch)
    once(batch)
    with _ParameterCasts() as cached:
        out = once(batch)
    with _ParameterCasts() as plain:
        per_call(batch)
    for k in ref:
        assert torch.isfinite(ref[k].float()).all() and torch.equal(out[k], ref[k]), k
    # the structure module's torch.nn.Linear layers are cast by autocast itself, every call
    assert plain.count > 10 * cached.count > 0  # 316 and 24 on 2026-11-30
