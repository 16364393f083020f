"""The Pairformer stack and the MSA module under DAP (fold-parallel's DapComm on 2 gloo
processes) equal one process: outputs, input gradients and parameter gradients, at an odd token
count (7, padded to 8 with masked tokens; MSA 3 rows + 1 padded) with masks with holes, in float64
(rounding only) and float32 (1e-5).

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


def _setup(kind, dtype):
    """The module (``pairformer`` or ``msa``), its inputs and the output weights of the loss."""
    from _af3_helpers import holes, randomize_
    from fold_model.af3.config import config
    from fold_model.af3.msa_module import MSAModule
    from fold_model.af3.pairformer import PairformerStack

    cfg = config("tiny")
    cfg.pairformer.dropout = 0.0
    cfg.msa.no_blocks, cfg.msa.msa_dropout, cfg.msa.pair_dropout = 2, 0.0, 0.0
    torch.manual_seed(0)
    if kind == "pairformer":
        module = PairformerStack(cfg.pairformer, cfg.c_s, cfg.c_z)
    else:
        module = MSAModule(cfg.msa, cfg.c_z, cfg.c_s_inputs)
    module = randomize_(module, scale=0.5).to(dtype)
    g = torch.Generator().manual_seed(1)
    n = N + PAD

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    mask = holes((1, n), seed=2).to(dtype)
    mask[:, N:] = 0
    pm = mask[:, :, None] * mask[:, None, :]
    z = rnd(1, n, n, cfg.c_z).requires_grad_(True)
    w_z = rnd(1, n, n, cfg.c_z)
    if kind == "pairformer":
        s = rnd(1, n, cfg.c_s).requires_grad_(True)
        w_s = rnd(1, n, cfg.c_s) * mask[..., None]
        return module, (s, z, mask, pm), (s, z), (w_s, w_z * pm[..., None])
    n_seq = 4  # 3 real rows and one padded (even: split over 2 ranks)
    msa_mask = holes((1, n_seq, n), seed=3).to(dtype) * mask[:, None]
    msa_mask[:, -1] = 0
    feat = rnd(1, n_seq, n, 34).requires_grad_(True)
    s_in = rnd(1, n, cfg.c_s_inputs).requires_grad_(True)
    return module, (feat, z, s_in, msa_mask, pm, mask), (feat, z, s_in), (w_z * pm[..., None],)


def _run(module, args, leaves, weights):
    outs = module(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    # Loss over real entries only (a fully masked query averages all values, padding included).
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    res = {f"out{i}": o.detach() for i, o in enumerate(outs)}
    res.update({f"d{i}": x.grad.detach() for i, x in enumerate(leaves)})
    res.update({n: p.grad.detach().clone() for n, p in module.named_parameters()})
    return res


KINDS = ("pairformer", "msa")


def _rank(rank: int, world: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        from fold_parallel import DapComm

        res = {}
        for kind in KINDS:
            for dtype in (torch.float64, torch.float32):
                module, args, leaves, weights = _setup(kind, dtype)
                module.set_comm(DapComm(None))
                out = _run(module, args, leaves, weights)
                for k, v in out.items():
                    if not k.startswith("out"):
                        dist.all_reduce(v)
                        v /= world
                res[f"{kind}/{dtype}"] = out
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
    for kind in KINDS:
        _compare(kind, _run(*_setup(kind, torch.float64)), results, rel_err)


def _compare(kind, ref, results, rel_err):
    # A parameter gradient is measured against max(|ref_p|, 1e-3 |all ref grads|): some are zero
    # analytically (a LayerNorm bias feeding a softmax-invariant shift) and only rounding remains.
    params = [k for k in ref if not k.startswith(("out", "d")) or "." in k]
    total = torch.cat([ref[k].reshape(-1) for k in params]).norm()
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        for res in results:
            got = res[f"{kind}/{dtype}"]
            for k, r in ref.items():
                if k not in params:
                    err = rel_err(got[k], r)
                else:
                    scale = torch.maximum(r.norm(), 1e-3 * total)
                    err = ((got[k].double() - r).norm() / scale).item()
                assert err < tol, (kind, str(dtype), k, err)
