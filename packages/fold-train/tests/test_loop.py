"""The training loop end to end on real data: data -> model -> loss -> flat optimizer, exact
resume, the non-finite guard, and 2-process data parallelism on gloo."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _train_helpers import NO_DROPOUT, SMALL
from fold_train.checkpoint import CheckpointError, find_latest
from fold_train.config import apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import NonFiniteError, Trainer, draw_n_cycle


def _trainer(cache, run_dir, extra=(), **stream_kw) -> Trainer:
    cache_dir, chains = cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *extra])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=cfg.run.batch_size, workers=cfg.data.workers, **stream_kw)
    return Trainer(cfg, run_dir, stream, progress=False)


def _stop_and_resume(cache, run_dir, args, stop_at: int = 2) -> list[dict]:
    """Train to ``stop_at``, drop the trainer, resume a new one from its checkpoint in
    ``run_dir`` and train to the end: the records after the resume."""
    first = _trainer(cache, run_dir, args)
    first.fit(stop_at=stop_at)
    del first
    resumed = _trainer(cache, run_dir, args)
    assert resumed.resume() == stop_at
    return resumed.fit()


def test_a_few_tiny_steps_end_to_end(demo_cache, tmp_path):
    trainer = _trainer(demo_cache, tmp_path, ["steps=3", "checkpoint_every=2",
                                              "keep_checkpoints=1"])
    before = trainer.flat.groups[0].param.clone()
    records = trainer.fit()
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        for key in ("loss", "fape", "aux", "distogram", "masked_msa", "plddt", "lddt_ca",
                    "grad_norm", "lr", "step_time", "samples_per_s"):
            assert math.isfinite(r[key]), key
        assert 1 <= r["n_cycle"] <= 2 and 0 <= r["lddt_ca"] <= 1
    assert not torch.equal(before, trainer.flat.groups[0].param)  # the weights moved
    assert trainer.opt.step_count == 3
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    assert json.loads((tmp_path / "config.json").read_text())["run"]["steps"] == 3
    assert (tmp_path / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a checkpoint at step 2 and at the end; only the last is kept
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000003.ckpt"]


def test_n_cycle_is_seeded_per_step_and_covers_the_range():
    draws = [draw_n_cycle(0, s, 4) for s in range(200)]
    assert set(draws) == {1, 2, 3, 4}
    assert draws == [draw_n_cycle(0, s, 4) for s in range(200)]


def test_resume_continues_exactly(demo_cache, tmp_path):
    """Losses after a resume equal those of an uninterrupted run (dropout on: the RNG state is
    part of the checkpoint)."""
    args = ["steps=4", "checkpoint_every=2"]
    full = _trainer(demo_cache, tmp_path / "full", args).fit()
    rest = _stop_and_resume(demo_cache, tmp_path / "cut", args)
    assert [r["step"] for r in rest] == [3, 4]
    for a, b in zip(full[2:], rest):
        assert a["loss"] == b["loss"] and a["chains"] == b["chains"]
        assert a["n_cycle"] == b["n_cycle"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "cut" / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == [1, 2, 3, 4]


def test_corrupt_or_mismatched_checkpoint_is_refused(demo_cache, tmp_path):
    _trainer(demo_cache, tmp_path, ["steps=1"]).fit()
    path = find_latest(tmp_path / "checkpoints")
    other = _trainer(demo_cache, tmp_path, ["steps=1", "model.evoformer.no_blocks=1"])
    with pytest.raises(CheckpointError, match="model.overrides"):
        other.resume()
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        _trainer(demo_cache, tmp_path, ["steps=1"]).resume()


def test_non_finite_loss_skips_the_step_then_stops(demo_cache, tmp_path):
    trainer = _trainer(demo_cache, tmp_path, ["steps=4", "max_nonfinite_steps=1"])
    real_loss = trainer.loss_fn.forward
    calls = {"n": 0}

    def poisoned(out, batch):
        calls["n"] += 1
        loss, terms = real_loss(out, batch)
        if calls["n"] >= 2:  # from the second step on: NaN
            loss = loss * float("nan")
            terms = {**terms, "loss": loss}
        return loss, terms

    trainer.loss_fn.forward = poisoned
    records = []
    with pytest.raises(NonFiniteError, match="max_nonfinite_steps=1"):
        for batch, _ in trainer.stream.batches(4):
            before = trainer.flat.groups[0].param.clone()
            records.append(trainer.train_step(batch))
            if records[-1].get("skipped"):
                assert torch.equal(before, trainer.flat.groups[0].param)  # no update
    assert [r.get("skipped", False) for r in records] == [False, True]
    assert trainer.opt.step_count == 1 and trainer.skipped_total == 3 - 1


def _dist_worker(rank: int, world: int, init: str, cache, out_dir: str, extra: list) -> None:
    import torch.distributed as dist
    from fold_train.distributed import DistContext, model_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cache_dir, chains = cache
        cfg = apply_overrides(preset("tiny"), [*SMALL, *NO_DROPOUT, "steps=1", *extra])
        ctx = model_parallel(DistContext(rank, world, torch.device("cpu"), None),
                             dap=cfg.parallel.dap, bp=cfg.parallel.bp)
        stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                              batch_size=1, rank=ctx.dp_rank, world_size=ctx.dp_size, workers=0)
        trainer = Trainer(cfg, f"{out_dir}/run", stream, ctx=ctx, progress=False)
        batch, _ = next(trainer.stream.batches(1))
        trainer.train_step(batch)
        torch.save({"grad": trainer.flat.groups[0].grad.clone(),
                    "param": trainer.flat.groups[0].param.clone(),
                    "handles": len(trainer._parallel_handles)}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("mode, extra, ref_batch, stacks", [
    # 2 data-parallel ranks, one sample each == one process with both samples
    ("dp", [], 2, 0),
    # DAP over 2 ranks (one replica, one sample split along the residues) == one process;
    # the Evoformer, extra MSA and template pair stacks run under DAP
    ("dap", ["dap=2"], 1, 3),
    # BP over 2 ranks (MSA branch / pair branch of the Parallel Evoformer) == one process;
    # the Evoformer and extra MSA stacks run under BP
    ("bp", ["bp=2", "model.block_order=parallel"], 1, 2),
])
def test_two_processes_on_gloo_equal_single_process(demo_cache, tmp_path, mode, extra,
                                                    ref_batch, stacks):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path}/store"
    mp.spawn(_dist_worker, args=(2, init, demo_cache, str(tmp_path), extra), nprocs=2,
             join=True)

    cache_dir, chains = demo_cache
    cfg = apply_overrides(preset("tiny"), [*SMALL, *NO_DROPOUT, "steps=1",
                                           f"batch_size={ref_batch}",
                                           *[e for e in extra if e.startswith("model.")]])
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                          batch_size=ref_batch, workers=0)
    single = Trainer(cfg, tmp_path / "single", stream, progress=False)
    batch, _ = next(single.stream.batches(1))
    single.train_step(batch)
    ref_grad = single.flat.groups[0].grad.double()
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["handles"] == stacks
        assert torch.isfinite(got["grad"]).all()
        # fp32 sums in another order: relative-norm agreement at the fp32 level
        err = (got["grad"].double() - ref_grad).norm() / ref_grad.norm()
        assert err < 1e-5, (mode, err)
        torch.testing.assert_close(got["param"], single.flat.groups[0].param,
                                   rtol=1e-5, atol=1e-6)


def test_bf16_autocast_step_is_close_to_fp32(demo_cache, tmp_path):
    """Same weights, same batch, no dropout: the bf16-autocast loss agrees with fp32 to bf16
    accuracy (8 mantissa bits: ~1e-2 relative for the loss, 3e-2 relative norm for the gradient,
    which goes through more bf16 matmuls); the master weights stay fp32."""
    losses, grads = {}, {}
    for precision in ("fp32", "bf16"):
        trainer = _trainer(demo_cache, tmp_path / precision,
                           [*NO_DROPOUT, "steps=1", f"precision={precision}"])
        batch, _ = next(trainer.stream.batches(1))
        record = trainer.train_step(batch)
        assert math.isfinite(record["loss"]) and not record.get("skipped")
        losses[precision] = record["loss"]
        grads[precision] = trainer.flat.groups[0].grad.double().clone()
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert losses["bf16"] != losses["fp32"]  # autocast really ran in bf16
    assert abs(losses["bf16"] - losses["fp32"]) / abs(losses["fp32"]) < 1e-2
    rel = (grads["bf16"] - grads["fp32"]).norm() / grads["fp32"].norm()
    assert rel < 3e-2, rel


def test_bf16_weights_train_from_fp32_masters_and_resume_exactly(demo_cache, tmp_path):
    """bf16_weights=true: the trunk's weights are bf16 and are the rounding of FlatAdam's fp32
    masters after every update; the structure module and heads stay fp32; the step is close to
    the fp32-weight bf16-autocast step; and a resume continues exactly (the masters are in the
    checkpoint)."""
    args = [*NO_DROPOUT, "precision=bf16", "bf16_weights=true", "steps=3",
            "checkpoint_every=2"]
    trainer = _trainer(demo_cache, tmp_path / "full", args)
    model = trainer.model
    assert model.evoformer.blocks[0].msa_transition.linear_1.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.structure_module.parameters())
    assert all(p.dtype == torch.float32 for p in model.aux_heads.parameters())
    dtypes = [g.param.dtype for g in trainer.flat.groups]
    assert sorted(map(str, dtypes)) == ["torch.bfloat16", "torch.float32"]
    full = trainer.fit()
    assert all(math.isfinite(r["loss"]) and not r.get("skipped") for r in full)
    for g, master in zip(trainer.flat.groups, trainer.opt.master):
        if g.param.dtype == torch.bfloat16:
            assert master is not None and master.dtype == torch.float32
            assert torch.equal(g.param, master.to(torch.bfloat16))  # rounded from the master
            assert not torch.equal(master, master.to(torch.bfloat16).float())  # finer than bf16
        else:
            assert master is None

    reference = _trainer(demo_cache, tmp_path / "fp32w", [*NO_DROPOUT, "precision=bf16",
                                                            "steps=1"])
    batch, _ = next(reference.stream.batches(1))
    ref = reference.train_step(batch)["loss"]
    assert abs(full[0]["loss"] - ref) / abs(ref) < 2e-2  # bf16-rounded weights, same batch

    rest = _stop_and_resume(demo_cache, tmp_path / "cut", args)
    assert [r["loss"] for r in rest] == [r["loss"] for r in full[2:]]


def test_bf16_weights_need_bf16_precision():
    from fold_train.config import ConfigError

    with pytest.raises(ConfigError, match="bf16_weights=true needs precision=bf16"):
        apply_overrides(preset("tiny"), ["bf16_weights=true"])


def test_non_blocking_loader_gives_the_in_process_batches(demo_cache):
    cache_dir, chains = demo_cache
    cfg = apply_overrides(preset("tiny"), SMALL)
    batches = {}
    for workers in (0, 1):
        stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=3, workers=workers,
                              strict_order=True)
        batches[workers] = list(stream.batches(3))
        assert stream.next_index == 3 and not stream.consumed_ahead
    for (a, names_a), (b, names_b) in zip(batches[0], batches[1]):
        assert names_a == names_b
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stream_position_survives_out_of_order_consumption(demo_cache):
    cache_dir, chains = demo_cache
    cfg = apply_overrides(preset("tiny"), SMALL)
    stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=0, rank=1, world_size=2,
                          workers=0)
    assert [it.index for it in stream._pending(3)] == [1, 3, 5]
    stream._consume(5)  # a later sample was ready first
    assert stream.next_index == 1 and stream.consumed_ahead == {5}
    state = stream.state_dict()
    again = SampleStream(cache_dir, chains, cfg.data_preset(), seed=0, rank=1, world_size=2,
                         workers=0)
    again.load_state_dict(state)
    assert [it.index for it in again._pending(3)] == [1, 3, 7]
    again._consume(1)
    again._consume(3)
    assert again.next_index == 7 and not again.consumed_ahead
    other = SampleStream(cache_dir, chains[:1], cfg.data_preset(), seed=0, rank=1,
                         world_size=2, workers=0)
    with pytest.raises(ValueError, match="another stream"):
        other.load_state_dict(state)


def _dp_resume_worker(rank: int, world: int, init: str, cache, out_dir: str) -> None:
    import torch.distributed as dist
    from fold_train.distributed import DistContext

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cache_dir, chains = cache
        ctx = DistContext(rank, world, torch.device("cpu"), None)

        def trainer(run: str) -> Trainer:
            cfg = apply_overrides(preset("tiny"), [*SMALL, "steps=3", "checkpoint_every=1"])
            stream = SampleStream(cache_dir, chains, cfg.data_preset(), seed=cfg.run.seed,
                                  rank=rank, world_size=world, workers=0)
            return Trainer(cfg, f"{out_dir}/{run}", stream, ctx=ctx, progress=False)

        full = trainer("full").fit()
        trainer("cut").fit(stop_at=2)
        resumed = trainer("cut")
        resumed.resume()
        rest = resumed.fit()
        torch.save({"full": [r["loss"] for r in full], "rest": [r["loss"] for r in rest],
                    "chains_full": [r["chains"] for r in full],
                    "chains_rest": [r["chains"] for r in rest]}, f"{out_dir}/resume{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_data_parallel_resume_continues_exactly(demo_cache, tmp_path):
    """Each rank's data position and dropout RNG come back (dropout on), so after a resume
    every rank's losses equal the uninterrupted run's."""
    import torch.multiprocessing as mp

    mp.spawn(_dp_resume_worker, args=(2, f"file://{tmp_path}/store", demo_cache, str(tmp_path)),
             nprocs=2, join=True)
    got = [torch.load(tmp_path / f"resume{r}.pt", weights_only=True) for r in range(2)]
    for g in got:
        assert g["rest"] == g["full"][2:] and g["chains_rest"] == g["chains_full"][2:]
    assert got[0]["chains_full"] != got[1]["chains_full"]  # the ranks read different samples
