"""Why the ablation's ``flat`` row differs from the ``kernels`` row: the two Runners of
``train_ablation.py`` stepped alternately, per-phase times (zero_grad, forward, backward, update;
synchronized on CUDA) and the aten ops of one step of each, with the ops whose counts differ.

    python benchmarks/flat_step_profile.py tiny 5 cpu      # CPU, tiny model
    python benchmarks/flat_step_profile.py mid 3 cpu       # af2_initial widths, 2 blocks
    python benchmarks/flat_step_profile.py full 5 cuda     # af2_initial at the ablation shapes
"""

import collections
import dataclasses
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location(
    "train_ablation", REPO / "benchmarks/train_ablation.py"
)
ta = importlib.util.module_from_spec(spec)
sys.modules["train_ablation"] = ta
spec.loader.exec_module(ta)
from model_full import TINY, synthetic_batch  # noqa: E402
from torch.profiler import profile  # noqa: E402

size = sys.argv[1]
reps = int(sys.argv[2])
dev = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cpu")


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


if size == "full":
    from model_full import FULL as sizes

    tiny = False
elif size == "tiny":
    sizes = TINY
    tiny = True
else:
    sizes = {"n_res": 16, "n_clust": 4, "n_extra": 8, "n_templ": 1, "r": 1}
    tiny = False
    orig = ta.config
    ta.config = lambda name, **kw: orig(
        name, evoformer__no_blocks=2, extra_msa__no_blocks=1, template__no_blocks=1, **kw
    )
batch, truth = synthetic_batch(**sizes, device=dev)


def phases(runner, r):
    t = {}
    with ta._ops_backend(runner.backend):
        sync()
        t0 = time.perf_counter()
        runner._zero_grad()
        sync()
        t["zero"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = runner.model(runner.batch, num_recycles=r)
            loss, _ = runner.loss_fn(out, runner.truth)
        sync()
        t["fwd"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        loss.backward()
        sync()
        t["bwd"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        runner._update()
        sync()
        t["upd"] = time.perf_counter() - t0
    return t, float(loss.detach())


runners = {}
for key in ["kernels", "flat"]:
    change = {"kernels": {"backend": "auto"}, "flat": {"backend": "auto", "flat": True}}[key]
    runners[key] = ta.Runner(dataclasses.replace(ta.Switches(), **change), batch, truth, dev, tiny)
    m = runners[key].model
    print(
        key, "params", sum(p.numel() for p in m.parameters()), "tensors", len(list(m.parameters()))
    )
    phases(runners[key], sizes["r"])
acc = {k: collections.defaultdict(list) for k in runners}
for _ in range(reps):
    for key, rn in runners.items():
        t, loss = phases(rn, sizes["r"])
        for k, v in t.items():
            acc[key][k].append(v * 1e3)
for key in runners:
    print(key, {k: round(statistics.median(v), 2) for k, v in acc[key].items()}, "loss", loss)
for key, rn in runners.items():
    with profile() as prof:
        phases(rn, sizes["r"])
    ka = {
        e.key: e.count
        for e in prof.key_averages()
        if e.key.startswith(("aten::", "autograd::engine"))
    }
    runners[key].counts = ka
    print(key, "all aten ops", sum(v for k, v in ka.items() if k.startswith("aten::")))
a, b = runners["kernels"].counts, runners["flat"].counts
diff = {k: (a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b) if a.get(k, 0) != b.get(k, 0)}
for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[:25]:
    print(f"  {k:60s} kernels {v[0]:6d} flat {v[1]:6d}")
