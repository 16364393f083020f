"""AF3 training across processes (data parallel on gloo, CPU): each rank trains on its own
sample of the stream with its own diffusion noise, and the averaged flat gradient equals one
process computing both samples' gradients and averaging them; ``torchrun ... fold-train train
--preset af3_tiny`` writes one checkpoint and one metrics file (rank 0), the cache built once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _af3_helpers import AF3_DEMO, CCD, NO_DROPOUT, needs_af3_demo
from fold_train.config import apply_overrides, preset
from fold_train.data import SampleStream
from fold_train.loop import Trainer

pytestmark = pytest.mark.distributed

# Small crops: the step is about one second on one core, and both ranks share two cores.
SMALL = ["data.n_token=40", "data.n_atom=128", "data.n_msa=8", "steps=1", "loader_workers=0"]


def _config(*extra: str):
    return apply_overrides(preset("af3_tiny"), [*NO_DROPOUT, *SMALL, *extra])


def _grad(trainer: Trainer) -> torch.Tensor:
    return torch.cat([g.grad.detach().flatten() for g in trainer.flat.groups]).clone()


def _named_grads(trainer: Trainer) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.grad) for n, p in trainer.model.named_parameters() if p.grad is not None]


def _params(trainer: Trainer) -> torch.Tensor:
    return torch.cat([g.param.detach().flatten() for g in trainer.flat.groups]).clone()


def _with_msa_and_template(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The crop with 5 more MSA rows and one template on its real tokens, each with holes
    (3O5R's mmCIF brings neither; DAP splits the MSA rows and the template pair stack)."""
    g = torch.Generator().manual_seed(5)
    out = dict(batch)
    tok = batch["token_mask"]  # [1, N]
    n = tok.shape[-1]
    rows = (torch.rand(1, 5, n, generator=g) < 0.8).float() * tok[:, None]
    out["msa_mask"] = batch["msa_mask"].clone()
    out["msa_mask"][:, 1:6] = rows
    out["msa"] = batch["msa"].clone()
    out["msa"][:, 1:6] = torch.randint(0, 21, (1, 5, n), generator=g).int() * rows.int()
    out["has_deletion"] = batch["has_deletion"].clone()
    out["has_deletion"][:, 1:6] = (torch.rand(1, 5, n, generator=g) < 0.2).float() * rows
    out["deletion_value"] = batch["deletion_value"].clone()
    out["deletion_value"][:, 1:6] = out["has_deletion"][:, 1:6] * 0.5
    out["template_mask"] = batch["template_mask"].clone()
    out["template_mask"][:, 0] = 1.0
    for k, shape in (("template_pseudo_beta", (n, 3)), ("template_backbone", (n, 3, 3))):
        out[k] = batch[k].clone()
        out[k][:, 0] = 8.0 * torch.randn(1, *shape, generator=g)
    for k in ("template_pseudo_beta_mask", "template_backbone_mask"):
        out[k] = batch[k].clone()
        out[k][:, 0] = (torch.rand(1, n, generator=g) < 0.8).float() * tok
    out["template_restype"] = batch["template_restype"].clone()
    out["template_restype"][:, 0] = torch.where(tok > 0, batch["restype"], 31)
    return out


@torch.no_grad()
def _perturb(trainer: Trainer) -> None:
    """Move every weight off its initial value (the same draw everywhere): AF's zero-initialised
    output projections would otherwise make the template embedder and every residual update
    vanish at step 0, and their inside (what DAP splits) would not reach the loss."""
    g = torch.Generator().manual_seed(6)
    for group in trainer.flat.groups:
        group.param.add_(0.05 * torch.randn(group.param.shape, generator=g))


def _dp_worker(rank: int, world: int, init: str, cache, out_dir: str, extra=()) -> None:
    import torch.distributed as dist
    from fold_train.distributed import DistContext, model_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cache_dir, entries = cache
        cfg = _config(*extra)
        ctx = model_parallel(DistContext(rank, world, torch.device("cpu"), None),
                             dap=cfg.parallel.dap)
        stream = SampleStream(cache_dir, entries, cfg.data_preset(), seed=cfg.run.seed,
                              rank=ctx.dp_rank, world_size=ctx.dp_size, workers=0, family="af3")
        trainer = Trainer(cfg, f"{out_dir}/run", stream, ctx=ctx, progress=False)
        batch, _ = next(trainer.stream.batches(1))
        if cfg.parallel.dap > 1:
            batch = _with_msa_and_template(batch)
            _perturb(trainer)
        record = trainer.train_step(batch)
        torch.save({"grad": _grad(trainer), "param": _params(trainer), "loss": record["loss"],
                    "grad_norm": record["grad_norm"], "n_token": batch["token_mask"].sum(),
                    "stacks": [type(h.stack).__name__ for h in trainer._parallel_handles]},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_average_the_gradients_of_their_own_samples(af3_cache_entries, tmp_path):
    """2 ranks x 1 sample == one process: sample ``r`` of the stream with the noise generator
    of ``(seed, step 0, replica r)``, gradients averaged, then the same Adam update."""
    import torch.multiprocessing as mp
    from fold_train.loop import draw_n_cycle, noise_seed

    # each replica and each step its own noise; fixed by (seed, step, replica) alone
    seeds = {noise_seed(0, step, r) for step in range(3) for r in range(2)}
    assert len(seeds) == 6 and noise_seed(0, 1, 1) == noise_seed(0, 1, 1)
    mp.spawn(_dp_worker, args=(2, f"file://{tmp_path}/store", af3_cache_entries,
                               str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    cache_dir, entries = af3_cache_entries
    cfg = _config()
    stream = SampleStream(cache_dir, entries, cfg.data_preset(), seed=cfg.run.seed, workers=0,
                          family="af3")  # one process: stream indices 0, 1, ...
    single = Trainer(cfg, tmp_path / "single", stream, progress=False)
    n_cycle = draw_n_cycle(cfg.run.seed, 0, cfg.model_config().no_cycles)
    grads, losses, n_token = [], [], []
    for replica, (batch, _) in enumerate(single.stream.batches(2)):
        single.flat.zero_grad()
        gen = torch.Generator().manual_seed(noise_seed(cfg.run.seed, 0, replica))
        loss, _, _ = single.family.forward_loss(single.model, single.loss_fn, batch, n_cycle,
                                                generator=gen)
        loss.backward()
        grads.append(_grad(single).double())
        losses.append(float(loss.detach()))
        n_token.append(batch["token_mask"].sum())
    # the two samples are different crops with different noise: averaging is not trivial
    assert (grads[0] - grads[1]).norm() > 1e-3 * grads[0].norm()
    ref = (grads[0] + grads[1]) / 2
    for rank, g in enumerate(got):
        assert torch.isfinite(g["grad"]).all()
        assert g["loss"] == pytest.approx(losses[rank], rel=1e-6)  # its own sample and noise
        assert torch.equal(g["n_token"], n_token[rank])
        # fp32 per-sample gradients, one fp32 sum and halving: rounding only
        err = (g["grad"].double() - ref).norm() / ref.norm()
        assert err < 1e-6, (rank, err)
        assert g["grad_norm"] == pytest.approx(float(ref.norm()), rel=1e-5)
    assert torch.equal(got[0]["param"], got[1]["param"])  # replicas stay identical
    # the same update from the averaged gradient
    offset = 0
    for group in single.flat.groups:
        n = group.grad.numel()
        group.grad.copy_(ref[offset:offset + n].view_as(group.grad))
        offset += n
    single.opt.step(single.opt.grad_norm())
    torch.testing.assert_close(got[0]["param"], _params(single), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("extra, layout, positions", [
    ([], "DP 2 x DAP 1", [(0, 4), (1, 5)]),  # 2 steps of stream indices r mod 2
    (["dap=2"], "DP 1 x DAP 2", [(0, 2), (0, 2)]),  # one replica: both ranks read indices 0, 1
])
def test_torchrun_trains_af3_with_two_ranks(tmp_path, extra, layout, positions):
    """``torchrun --nproc-per-node 2 -m fold_train.cli train --preset af3_tiny steps=2`` (and
    ``dap=2``): the cache built once by rank 0, one checkpoint written by rank 0 with both
    ranks' data positions, one metrics line per step."""
    from fold_train.checkpoint import load_checkpoint

    needs_af3_demo()
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fold_train.cli", "train", "--preset", "af3_tiny", "--data", str(AF3_DEMO),
           "--ccd", str(CCD), "--run-dir", str(run), *NO_DROPOUT, *SMALL,
           "steps=2", "checkpoint_every=2", *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("fold-train: AF3 preset af3_tiny") == 1  # rank 0 prints
    assert f"x 2 ({layout})" in proc.stdout
    assert proc.stdout.count("AF3 features 1/1 3o5r (") == 1  # rank 0 featurises, once
    ckpts = sorted((run / "checkpoints").iterdir())  # no temporary files left either
    assert [p.name for p in ckpts] == ["step_00000002.ckpt"]
    state = load_checkpoint(ckpts[0])
    assert state["world_size"] == 2 and state["step"] == 2
    assert [(d["rank"], d["next_index"]) for d in state["data"]] == positions
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["chains"] == ["3o5r"] and r["lr"] > 0
        assert all(torch.isfinite(torch.tensor(r[k])) for k in ("loss", "diffusion",
                                                               "distogram", "grad_norm"))
        assert r["samples_per_s"] > 0


def test_dap_over_two_ranks_equals_one_process(af3_cache_entries, tmp_path):
    """``dap=2``: one replica on 2 ranks (the MSA module, Pairformer and template embedder split
    along the 40 padded tokens / 8 MSA rows of a crop with fewer real ones, 6 MSA rows and one
    template with holes) == one process: the same loss, flat gradient and update. The diffusion
    noise is the replica's, so both ranks draw the same."""
    import torch.multiprocessing as mp

    mp.spawn(_dp_worker, args=(2, f"file://{tmp_path}/store", af3_cache_entries,
                               str(tmp_path), ["dap=2"]), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    cache_dir, entries = af3_cache_entries
    cfg = _config()
    stream = SampleStream(cache_dir, entries, cfg.data_preset(), seed=cfg.run.seed, workers=0,
                          family="af3")
    single = Trainer(cfg, tmp_path / "single", stream, progress=False)
    batch, _ = next(single.stream.batches(1))
    assert int(batch["token_mask"].sum()) < batch["token_mask"].shape[-1]  # padded tokens
    batch = _with_msa_and_template(batch)
    _perturb(single)
    record = single.train_step(batch)
    template = [g for n, g in _named_grads(single) if n.startswith("template_embedder.")]
    assert template and all(g.abs().sum() > 0 for g in template)  # the template is used
    ref = _grad(single).double()
    for g in got:
        assert g["stacks"] == ["MSAModule", "PairformerStack", "TemplateEmbedder"]
        assert torch.isfinite(g["grad"]).all()
        # fp32: the split sums (triangle updates, outer product mean) add in another order
        assert g["loss"] == pytest.approx(record["loss"], rel=1e-5)
        err = (g["grad"].double() - ref).norm() / ref.norm()
        assert err < 1e-5, err
        # Adam's first step moves a weight by about lr * sign(g): ill-conditioned where g is at
        # the rounding level (elementwise differences ~3e-6 of max |g| ~ 1, and weights whose
        # true gradient is 0 get +-1e-10), so the update is compared where |g| stands clear
        clear = ref.abs() > 1e-4 * ref.abs().max()
        assert clear.float().mean() > 0.25  # ~40% of the entries have exactly zero gradient
        torch.testing.assert_close(g["param"][clear], _params(single)[clear], rtol=1e-5,
                                   atol=1e-6)


def test_af3_dap_needs_crops_divisible_by_the_degree(capsys):
    from fold_train.cli import main

    needs_af3_demo()
    code = main(["train", "--preset", "af3_tiny", "--data", str(AF3_DEMO), "dap=2",
                 "data.n_token=41"])
    assert code == 2
    assert "data.n_token to be a multiple of 2" in capsys.readouterr().err
