"""The Pairformer stack under DAP (fold-parallel's DapComm on 2 gloo processes) equals one
process: outputs, input gradients and parameter gradients, at an odd token count (7, padded to 8
with masked tokens) with masks with holes, in float64 (rounding only) and float32 (1e-5).

Gradient convention as fold-parallel's tests: every rank computes the same loss of the gathered
outputs; parameter and input gradients are averaged over the ranks."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch

pytest.importorskip("fold_parallel")

pytestmark = pytest.mark.distributed

N, PAD = 7, 1


def _setup(dtype):
    from _af3_helpers import holes, randomize_
    from fold_model.af3.config import config
    from fold_model.af3.pairformer import PairformerStack

    cfg = config("tiny")
    cfg.pairformer.dropout = 0.0
    torch.manual_seed(0)
    stack = randomize_(PairformerStack(cfg.pairformer, cfg.c_s, cfg.c_z), scale=0.5)
    stack = stack.to(dtype)
    g = torch.Generator().manual_seed(1)
    n = N + PAD
    s = torch.randn(1, n, cfg.c_s, generator=g, dtype=torch.float64).to(dtype)
    z = torch.randn(1, n, n, cfg.c_z, generator=g, dtype=torch.float64).to(dtype)
    mask = holes((1, n), seed=2).to(dtype)
    mask[:, N:] = 0
    w_s = torch.randn(s.shape, generator=g, dtype=torch.float64).to(dtype)
    w_z = torch.randn(z.shape, generator=g, dtype=torch.float64).to(dtype)
    return stack, s.requires_grad_(True), z.requires_grad_(True), mask, w_s, w_z


def _run(stack, s, z, mask, w_s, w_z):
    pm = mask[:, :, None] * mask[:, None, :]
    so, zo = stack(s, z, mask, pm)
    # Loss over real entries only (a fully masked query averages all values, padding included).
    m1 = mask[..., None]
    m2 = pm[..., None]
    ((so * w_s * m1).sum() + (zo * w_z * m2).sum()).backward()
    return {
        "s": so.detach(), "z": zo.detach(), "ds": s.grad.detach(), "dz": z.grad.detach(),
        **{n: p.grad.detach().clone() for n, p in stack.named_parameters()},
    }


def _rank(rank: int, world: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from fold_parallel import DapComm

        res = {}
        for dtype in (torch.float64, torch.float32):
            stack, s, z, mask, w_s, w_z = _setup(dtype)
            stack.set_comm(DapComm(None))
            out = _run(stack, s, z, mask, w_s, w_z)
            for k, v in out.items():
                if k not in ("s", "z"):
                    dist.all_reduce(v)
                    v /= world
            res[str(dtype)] = out
        torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_pairformer_dap_equals_one_process():
    import torch.multiprocessing as mp
    from _af3_helpers import rel_err

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as outdir:
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, 2, port, outdir)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        for p in procs:
            if p.is_alive():
                p.kill()
        results = [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(2)]
    ref = _run(*_setup(torch.float64))
    acts = ("s", "z", "ds", "dz")
    # A parameter gradient is measured against max(|ref_p|, 1e-3 |all ref grads|): some are zero
    # analytically (a LayerNorm bias feeding a softmax-invariant shift) and only rounding remains.
    total = torch.cat([r.reshape(-1) for k, r in ref.items() if k not in acts]).norm()
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        for res in results:
            got = res[str(dtype)]
            for k, r in ref.items():
                if k in acts:
                    err = rel_err(got[k], r)
                else:
                    scale = torch.maximum(r.norm(), 1e-3 * total)
                    err = ((got[k].double() - r).norm() / scale).item()
                assert err < tol, (str(dtype), k, err)
