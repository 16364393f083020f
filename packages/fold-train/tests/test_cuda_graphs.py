"""CUDA Graphs per recycling count: the CPU error, the cache keyed by N_cycle (with a fake capture
backend), a captured-step trainer equal to the eager one, the absence of host synchronizations in
a training step, and (GPU) a real captured step equal to an eager step."""

from __future__ import annotations

import pytest
import torch
from _af3_helpers import NO_DROPOUT as AF3_NO_DROPOUT
from _train_helpers import NO_DROPOUT, SMALL
from fold_train.config import apply_overrides, preset
from fold_train.cuda_graphs import (
    CudaGraphBackend,
    CudaGraphError,
    EagerCapture,
    GraphedStep,
    host_syncs,
)
from fold_train.data import SampleStream
from fold_train.distributed import DistContext
from fold_train.loop import Trainer


class FakeCapture(EagerCapture):
    """The eager stand-in for CUDA capture, counting captures and warm-ups."""

    def __init__(self) -> None:
        self.captures = 0
        self.warmups = 0

    def capture(self, fn, warmup_fn=None):
        self.captures += 1
        self.warmups += warmup_fn is not None
        return super().capture(fn, warmup_fn)


def test_cuda_graphs_on_cpu_is_a_clear_error(demo_cache, tmp_path):
    with pytest.raises(CudaGraphError, match="needs a CUDA device, but the training device is "
                                             "cpu"):
        CudaGraphBackend("cpu")
    cfg = apply_overrides(preset("tiny"), [*SMALL, "cuda_graphs=true"])
    stream = SampleStream(demo_cache[0], demo_cache[1], cfg.data_preset(), seed=0, batch_size=1,
                          workers=0)
    with pytest.raises(CudaGraphError, match="cuda_graphs=true needs a CUDA device"):
        Trainer(cfg, tmp_path, stream, progress=False)
    cfg = apply_overrides(preset("tiny"), [*SMALL])
    with pytest.raises(ValueError, match="cuda_graphs is false"):
        Trainer(cfg, tmp_path, stream, progress=False, graph_backend=FakeCapture())


def test_one_graph_per_n_cycle_built_lazily_and_replayed():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(5, 7, generator=gen)
    calls: list[int] = []

    def body(n_cycle: int) -> dict[str, torch.Tensor]:
        calls.append(n_cycle)
        x = graphed.static_inputs["x"]  # [B, R, 7]
        h = x[:, 0]
        for c in range(n_cycle):  # the recycling count changes the work, hence the graph
            h = torch.tanh(h + x[:, c]) @ weight.T @ weight
        return {"y": h.sum(-1)}

    backend = FakeCapture()
    graphed = GraphedStep(body, backend)
    with pytest.raises(CudaGraphError, match="load"):
        graphed(1)
    batches = [torch.randn(2, 3, 7, generator=gen) for _ in range(6)]
    order = [2, 1, 2, 3, 1, 3]
    for batch, n in zip(batches, order):
        graphed.load({"x": batch})
        out = graphed(n)
        h = batch[:, 0]
        for c in range(n):
            h = torch.tanh(h + batch[:, c]) @ weight.T @ weight
        torch.testing.assert_close(out["y"], h.sum(-1), rtol=1e-6, atol=1e-6)
    assert graphed.captured == [2, 1, 3] and backend.captures == 3
    assert graphed.replays == 6
    # a replay's outputs are copies: the next replay of another graph cannot overwrite them
    graphed.load({"x": batches[0]})
    first = graphed(2)
    kept = first["y"].clone()
    graphed.load({"x": batches[1]})
    second = graphed(2)
    assert torch.equal(first["y"], kept) and not torch.equal(second["y"], kept)
    # fixed padded shapes: anything else is refused, naming the feature
    with pytest.raises(CudaGraphError, match=r"feature 'x' has shape \(2, 3, 8\)"):
        graphed.load({"x": torch.randn(2, 3, 8)})
    with pytest.raises(CudaGraphError, match="differ from the captured step"):
        graphed.load({"x": batches[0], "extra": batches[0]})


def test_only_the_first_capture_warms_up_with_the_largest_count():
    """One eager warm-up, before the first capture and with the largest recycling count (it runs
    every kernel the others do); later captures add none, so no eager step competes with the
    graphs' pool for memory."""
    calls: list[int] = []

    def body(n_cycle: int) -> dict[str, torch.Tensor]:
        calls.append(n_cycle)
        return {"y": graphed.static_inputs["x"].sum() * n_cycle}

    backend = FakeCapture()
    graphed = GraphedStep(body, backend)
    graphed.load({"x": torch.arange(3.0)})
    assert graphed(2, warmup_n_cycle=4)["y"] == 6.0
    assert graphed(1, warmup_n_cycle=4)["y"] == 3.0
    assert graphed(3, warmup_n_cycle=4)["y"] == 9.0
    assert backend.captures == 3 and backend.warmups == 1
    assert calls[0] == 4 and calls.count(4) == 1


def _trainer(cache, run_dir, extra=(), *, dropout: bool = False, **kw) -> Trainer:
    cache_dir, chains = cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *([] if dropout else NO_DROPOUT),
                                           "max_recycling_iters=2", *extra])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, workers=0)
    return Trainer(cfg, run_dir, stream, progress=False, **kw)


def _eager_on_buckets(trainer: Trainer) -> list:
    """Make an eager trainer pad each batch to its bucket, as the graphed trainer does; returns
    the list that collects the buckets of its steps."""
    from fold_train.buckets import fit_to_bucket

    step, buckets = trainer.train_step, []

    def padded_step(batch):
        batch, bucket = fit_to_bucket(batch, trainer.family.name, trainer.bucket_policy)
        buckets.append(bucket)
        return step(batch)

    trainer.train_step = padded_step
    return buckets


def test_trainer_with_captured_steps_equals_eager(demo_cache, tmp_path):
    """The graphed path (batches padded to their bucket, static buffers, outputs copied out,
    optimizer outside) trains exactly like the eager one on the same padded batches; one capture
    per (bucket, N_cycle); the fake backend stands in for CUDA."""
    eager = _trainer(demo_cache, tmp_path / "eager", ["steps=4"])
    buckets = _eager_on_buckets(eager)
    backend = FakeCapture()
    graphed = _trainer(demo_cache, tmp_path / "graphed", ["steps=4", "cuda_graphs=true"],
                       graph_backend=backend)
    a, b = eager.fit(), graphed.fit()
    assert [r["n_cycle"] for r in a] == [r["n_cycle"] for r in b]
    assert len({r["n_cycle"] for r in a}) > 1  # several graphs were needed
    assert backend.captures == len(set(zip(buckets, [r["n_cycle"] for r in a])))
    for ra, rb in zip(a, b):
        for key in ("loss", "fape", "distogram", "masked_msa", "plddt", "lddt_ca", "grad_norm"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-7), key
    torch.testing.assert_close(graphed.flat.groups[0].param, eager.flat.groups[0].param,
                               rtol=1e-6, atol=1e-7)
    graphed.flat.check()  # parameters and gradients still live in the flat buffers


def test_training_step_has_no_host_synchronization(demo_cache, tmp_path):
    """What capture needs: forward + loss + backward never read a device value on the host."""
    trainer = _trainer(demo_cache, tmp_path, ["steps=1"], dropout=True)
    batch, _ = next(iter(trainer.stream.batches(1)))
    trainer._forward_backward(batch, 2)  # constant tables are cached on first use
    assert host_syncs(lambda: trainer._forward_backward(batch, 2)) == []
    # the probe does find synchronizations
    x = torch.randn(6)
    found = host_syncs(lambda: (x.sum().item(), x[x > 0], torch.nonzero(x), x.new_tensor([1.0])))
    assert "_local_scalar_dense" in found and "nonzero" in found and "lift_fresh" in found


# -- AF3 ------------------------------------------------------------------------------------------

# The distributed tests' small crops: a tiny AF3 step is about a second on one core.
AF3_SMALL = ["data.n_token=40", "data.n_atom=128", "data.n_msa=8", "loader_workers=0"]


def _af3_trainer(af3_cache_entries, run_dir, extra, dropout=False, **kw) -> Trainer:
    cache_dir, entries = af3_cache_entries
    cfg = apply_overrides(preset("af3_tiny"), [*AF3_SMALL, *([] if dropout else AF3_NO_DROPOUT),
                                               *extra])
    stream = SampleStream(cache_dir, entries, cfg.data_preset(), seed=cfg.run.seed, workers=0,
                          family="af3")
    return Trainer(cfg, run_dir, stream, progress=False, **kw)


def test_af3_training_step_has_no_host_synchronization(af3_cache_entries, tmp_path):
    """With the loss's pair lists built beforehand and padded (as the captured step gets
    them), the AF3 forward + loss + backward never reads a device value on the host (dropout
    and the mini-rollout included); the lists built inside the loss would (nonzero)."""
    trainer = _af3_trainer(af3_cache_entries, tmp_path, ["steps=1"], dropout=True)
    batch, _ = next(iter(trainer.stream.batches(1)))
    pairs = trainer.family.loss_inputs(batch)
    pairs = pairs.padded(*pairs.capacities())
    trainer._noise_gen.manual_seed(1)
    trainer._forward_backward(batch, 2, pairs=pairs)  # constant tables cached on first use
    assert host_syncs(lambda: trainer._forward_backward(batch, 2, pairs=pairs)) == []
    assert "nonzero" in host_syncs(lambda: trainer._forward_backward(batch, 2))


def test_af3_trainer_with_captured_steps_equals_eager(af3_cache_entries, tmp_path, capsys):
    """AF3 through the graphed path (static batch and padded pair lists, the noise generator
    reseeded before each replay) trains like the eager one; pair lists that outgrow the
    captured capacity make it capture again instead of truncating them. No dropout: the fake
    capture runs the step eagerly several times, each drawing from the global generator."""
    eager = _af3_trainer(af3_cache_entries, tmp_path / "eager", ["steps=3"])
    _eager_on_buckets(eager)  # the noise is drawn at the padded atom count: pad both
    backend = FakeCapture()
    graphed = _af3_trainer(af3_cache_entries, tmp_path / "graphed",
                           ["steps=3", "cuda_graphs=true"], graph_backend=backend)
    a = eager.fit()
    b = graphed.fit(stop_at=2)
    (bucket,) = graphed.graph_buckets  # fixed-size crops: one bucket
    static = graphed._graphs[bucket].static_inputs
    assert {"loss_pairs/lddt/l", "loss_pairs/lddt/weight", "token_mask"} <= set(static)
    captures = backend.captures
    graphed._loss_caps[bucket] = (16, None)  # as if the next batch had more pairs than captured
    b += graphed.fit()
    assert "outgrew the captured capacities (16, None); capturing the step again" in \
        capsys.readouterr().out
    assert backend.captures == captures + 1 and graphed._loss_caps[bucket][0] > 16
    assert len(b) == 3 and [r["n_cycle"] for r in a] == [r["n_cycle"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("loss", "diffusion", "smooth_lddt", "distogram", "confidence", "grad_norm"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(graphed.flat.groups[0].param, eager.flat.groups[0].param,
                               rtol=1e-5, atol=1e-6)


# -- on a GPU (nox -s gpu) ---------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _no_autotuning(monkeypatch):
    # Every new shape of the tiny model would otherwise compile and time each kernel
    # configuration (minutes on a GPU); the default configuration is what these tests need.
    monkeypatch.setenv("FOLD_KERNELS_AUTOTUNE", "0")


@pytest.mark.gpu
@gpu
def test_captured_step_equals_eager_step_on_gpu(demo_cache, tmp_path):
    cuda = DistContext(device=torch.device("cuda"))
    eager = _trainer(demo_cache, tmp_path / "eager", ["steps=5"], ctx=cuda)
    _eager_on_buckets(eager)  # the same padded shapes as the graphed steps
    graphed = _trainer(demo_cache, tmp_path / "graphed", ["steps=5", "cuda_graphs=true"],
                       ctx=cuda)
    assert eager.device.type == "cuda"
    a, b = eager.fit(), graphed.fit()
    assert sum(len(g.captured) for g in graphed._graphs.values()) >= len({r["n_cycle"]
                                                                          for r in a})
    for ra, rb in zip(a, b):
        assert ra["n_cycle"] == rb["n_cycle"]
        for key in ("loss", "fape", "distogram", "grad_norm"):
            # fp32 on both sides; the replay launches the same kernels as the eager step
            assert rb[key] == pytest.approx(ra[key], rel=1e-5), key
    pa, pb = eager.flat.groups[0].param, graphed.flat.groups[0].param
    assert float((pa - pb).norm() / pa.norm()) < 1e-5


@pytest.mark.gpu
@gpu
def test_dropout_draws_fresh_masks_on_every_replay(demo_cache, tmp_path):
    cache_dir, chains = demo_cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, "steps=1", "cuda_graphs=true"])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=0, batch_size=1, workers=0)
    trainer = Trainer(cfg, tmp_path, stream, progress=False,
                      ctx=DistContext(device=torch.device("cuda")))
    batch, _ = next(iter(stream.batches(1)))
    from fold_train.buckets import fit_to_bucket

    batch, bucket = fit_to_bucket({k: v.cuda() for k, v in batch.items()}, "af2")
    graphed = trainer._graph_for(bucket)
    graphed.load(batch)
    losses = [float(graphed(1)["loss"]) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert len(set(losses)) == 3  # the Philox offset advances per replay
    torch.cuda.manual_seed(123)
    first = float(graphed(1)["loss"])
    torch.cuda.manual_seed(123)
    assert float(graphed(1)["loss"]) == first  # and follows the generator's seed


@pytest.mark.gpu
@gpu
def test_af3_captured_steps_equal_eager_steps_on_gpu(af3_cache_entries, tmp_path):
    """A real capture of the AF3 step (the noise generator registered with the graph and
    reseeded before each replay, padded pair lists, the quaternion alignment inside the graph)
    trains like the eager loop; fp32, no dropout."""
    cuda = DistContext(device=torch.device("cuda"))
    eager = _af3_trainer(af3_cache_entries, tmp_path / "eager", ["steps=3"], ctx=cuda)
    _eager_on_buckets(eager)  # the same padded shapes (and noise draws) as the graphed steps
    graphed = _af3_trainer(af3_cache_entries, tmp_path / "graphed",
                           ["steps=3", "cuda_graphs=true"], ctx=cuda)
    a, b = eager.fit(), graphed.fit()
    (bucket,) = graphed.graph_buckets
    assert graphed._graphs[bucket].replays == 3 and graphed._graphs[bucket].captured
    for ra, rb in zip(a, b):
        assert ra["n_cycle"] == rb["n_cycle"]
        for key in ("loss", "diffusion", "smooth_lddt", "distogram", "grad_norm"):
            # the alignment inside the graph is the quaternion solver, eagerly the SVD: rounding
            assert rb[key] == pytest.approx(ra[key], rel=1e-4), key


# -- shape buckets: variable crop sizes and MSA depths ------------------------------------------

def _af2_crop(cache, n_res: int, n_clust: int, seed: int):
    """A training batch of 4zey_A (84 residues) cropped to ``n_res`` with ``n_clust`` clusters."""
    from fold_data.af2 import make_sample
    from fold_data.cache import FeatureCache
    from fold_train.data import collate

    cache_dir, chains = cache
    raw = FeatureCache(cache_dir).load(dict(chains)["4zey_A"])
    data = apply_overrides(preset("tiny"), [*SMALL, f"data.n_res={n_res}",
                                            f"data.n_clust={n_clust}"]).data_preset()
    return collate([make_sample(raw, data, seed=seed)])


def test_variable_crops_capture_one_graph_per_bucket(demo_cache, tmp_path):
    """Batches of four crop sizes / MSA depths fall in two buckets: the step is captured per
    (bucket, N_cycle), not per shape, and each bucket's static inputs are reused."""
    from fold_train.buckets import fit_to_bucket

    backend = FakeCapture()
    trainer = _trainer(demo_cache, tmp_path, ["steps=8", "cuda_graphs=true"],
                       graph_backend=backend)
    shapes = [(40, 6), (50, 5), (70, 6), (60, 6), (44, 6), (72, 5)]
    keys = []
    for i, (n_res, n_clust) in enumerate(shapes):
        batch = _af2_crop(demo_cache, n_res, n_clust, seed=i)
        record = trainer.train_step(batch)
        assert torch.isfinite(torch.tensor(record["loss"]))
        keys.append((fit_to_bucket(batch, "af2")[1], record["n_cycle"]))
    buckets = list(dict.fromkeys(k[0] for k in keys))
    assert trainer.graph_buckets == buckets
    assert [dict(b)["N_res"] for b in buckets] == [64, 128]
    assert {dict(b)["N_clust"] for b in buckets} == {8}
    assert backend.captures == len(set(keys)) < len(shapes)


def test_bucketed_step_equals_eager_step_and_unpadded_loss(demo_cache, tmp_path):
    """The graphed step on a bucket-padded batch equals the eager step on that padded batch (loss,
    gradient norm, updated parameters); and padding changes neither the AF2 loss nor its
    gradient beyond fp32 summation order (every AF2 loss term is normalised by its mask)."""
    from fold_train.buckets import fit_to_bucket

    batch = _af2_crop(demo_cache, 40, 5, seed=3)  # 40 -> 64 residues, 5 -> 8 clusters
    padded, bucket = fit_to_bucket(batch, "af2")
    assert padded["aatype"].shape[-1] == 64 and padded["msa_mask"].shape[2] == 8
    eager = _trainer(demo_cache, tmp_path / "eager", ["steps=2"])
    graphed = _trainer(demo_cache, tmp_path / "graphed", ["steps=2", "cuda_graphs=true"],
                       graph_backend=FakeCapture())
    for _ in range(2):
        a, b = eager.train_step(padded), graphed.train_step(batch)
        assert a["n_cycle"] == b["n_cycle"]
        for key in ("loss", "fape", "distogram", "masked_msa", "plddt", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), key
    torch.testing.assert_close(graphed.flat.groups[0].param, eager.flat.groups[0].param,
                               rtol=1e-6, atol=1e-7)
    # padded vs unpadded, eager, same weights: loss terms and the whole flat gradient
    t = _trainer(demo_cache, tmp_path / "cmp", ["steps=1"])
    loss_u, terms_u, _ = t._forward_backward(batch, 2)
    grad_u = t.flat.groups[0].grad.clone()
    loss_p, terms_p, _ = t._forward_backward(padded, 2)
    grad_p = t.flat.groups[0].grad.clone()
    assert torch.isfinite(grad_u).all() and torch.isfinite(grad_p).all()
    for key in terms_u:
        # fp32: masked entries contribute exact zeros; only the summation order differs
        assert float(terms_p[key]) == pytest.approx(float(terms_u[key]), rel=1e-5, abs=1e-6), key
    scale = float(grad_u.abs().max())
    torch.testing.assert_close(grad_p, grad_u, rtol=1e-4, atol=1e-5 * scale)


def test_af3_variable_crops_share_bucket_graphs(af3_cache_entries, tmp_path):
    """AF3 crops of different token / atom budgets in one bucket reuse its captured steps; the
    graphed step on the padded batch equals the eager step on it. (Padded and unpadded AF3
    losses are not compared: the diffusion noise is drawn at the batch's atom count, so a
    padded step is another, equally valid, noise draw.)"""
    from fold_data.af3 import make_sample
    from fold_data.af3.cache import af3_cache
    from fold_train.af3_data import af3_cache_dir
    from fold_train.buckets import BucketPolicy, fit_to_bucket
    from fold_train.data import collate

    cache_dir, entries = af3_cache_entries
    raw = af3_cache(af3_cache_dir(cache_dir)).load(entries[0][1])
    policy = BucketPolicy(residue_step=48, atom_step=128)

    def crop(n_token, n_atom, seed):
        data = apply_overrides(preset("af3_tiny"), [*AF3_SMALL, *AF3_NO_DROPOUT,
                                                    f"data.n_token={n_token}",
                                                    f"data.n_atom={n_atom}"]).data_preset()
        return collate([make_sample(raw, data, seed=seed)])

    backend = FakeCapture()
    graphed = _af3_trainer(af3_cache_entries, tmp_path / "g", ["steps=3", "cuda_graphs=true",
                                                               "max_recycling_iters=0"],
                           graph_backend=backend)
    eager = _af3_trainer(af3_cache_entries, tmp_path / "e", ["steps=3", "max_recycling_iters=0"])
    graphed.bucket_policy = policy
    for i, (n_token, n_atom) in enumerate([(40, 128), (36, 120), (44, 100)]):
        batch = crop(n_token, n_atom, seed=i)
        padded, bucket = fit_to_bucket(batch, "af3", policy)
        a, b = eager.train_step(padded), graphed.train_step(batch)
        for key in ("loss", "diffusion", "distogram", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert len(graphed.graph_buckets) == 1 and backend.captures == 1
    assert dict(graphed.graph_buckets[0])["N_token"] == 48
