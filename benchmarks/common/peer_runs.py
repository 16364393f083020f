"""Running the peer comparisons' contenders: the rows a command line names, the contenders of a
row, building each (:mod:`benchmarks.common.peer_blocks`) with the precision settled from the
options, their versions, and the check that a contender's CUDA-graph replay holds all of its
work. Shared by ``model.peers`` (timing) and ``tools.profile_peers`` (where the time goes)."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import peer_blocks as pb
from benchmarks.common.cli import switch_restored
from benchmarks.common.graphs import (
    capture,
    largest,
    replay_census,
    replay_differences,
    restored,
)
from benchmarks.common.machine import triton_version


def parse_rows(spec: str) -> list[pb.Shape]:
    """``evoformer:128x256`` (N_seq x N_res), ``pairformer:384``, ``diffusion:384x48``
    (N_token x samples), comma-separated."""
    out = []
    for item in spec.split(","):
        block, _, size = item.strip().partition(":")
        if block == "evoformer":
            n_seq, n = (int(v) for v in size.split("x"))
            out.append(pb.Shape("evoformer", n, n_seq=n_seq))
        elif block == "pairformer":
            out.append(pb.Shape("pairformer", int(size)))
        elif block == "diffusion":
            n, samples = (int(v) for v in size.split("x"))
            out.append(pb.Shape("diffusion", n, samples=samples))
        else:
            raise SystemExit(f"--blocks: unknown block {block!r} in {item!r}")
    return out


def error_text(e: BaseException) -> str:
    """An exception as a result row's text (a peer's failure is a result, not a crash)."""
    return f"{type(e).__name__}: {e}"[:600]


def forward_step(case: pb.Case) -> Callable[[], tuple]:
    """The contender's forward under ``no_grad`` (the forward modes, the replay check)."""
    def fwd() -> tuple:
        with torch.no_grad():
            return case.forward()
    return fwd


def train_step(case: pb.Case) -> Callable[[], tuple]:
    """Forward + backward from fixed output gradients (:func:`peer_blocks.output_grads`, sized
    by one forward now: its failure is the caller's), to every input and parameter."""
    grads = pb.output_grads(forward_step(case)())
    wrt = list(case.inputs) + case.params

    def train() -> tuple:
        return torch.autograd.grad(case.forward(), wrt, grads, allow_unused=True)
    return train


REPLAY_TOLERANCE = 1e-2  # a graph that misses a kernel is off by O(1); same kernels: ~0
# An output whose eager calls differ among themselves (atomic adds summing in varying order)
# may differ that much from its replay too: an output is off when it differs by more than this
# many times its eager calls' spread as well (fold's diffusion training step with its atomic
# bias gradients: 0.012 from its replay on the H200, 2026-12-01, no launch missing; a missing
# kernel put Protenix's steps off by 0.17 to 5e31). Output by output, because one output that
# is all rounding (fold's Evoformer: a LayerNorm bias whose exact gradient is zero, spread 1.2)
# must not excuse the others.
SPREAD_FACTOR = 5.0


def allowed_difference(spread: float | None) -> float:
    """The largest replay difference that passes, given the eager calls' own ``spread`` (None:
    not measured, an older row). A NaN or infinite spread allows nothing extra."""
    if spread is None or not spread < float("inf"):
        return REPLAY_TOLERANCE
    return max(REPLAY_TOLERANCE, SPREAD_FACTOR * spread)


def check_replay(case: pb.Case, device: torch.device, capture_fn=None,
                 counts_fn=None) -> dict[str, Any]:
    """Whether the contender's CUDA graphs hold all of their work, two ways:

    - a census (:func:`benchmarks.common.graphs.replay_census`): the kernels an eager training
      step (forward + backward from the fixed output gradients) runs that its replay does not,
      ``replay_missing_kernels`` (``{name: launches}``);
    - a comparison of results (:func:`benchmarks.common.graphs.replay_differences`) for both
      steps the graph modes time, the forward (``no_grad``) and the training step, replayed
      after new inputs against the same step run eagerly: ``replay_diff`` is the larger of the
      two (``replay_diff_steps`` has each). Each step's eager calls are also compared among
      themselves, output by output (the largest spread is ``replay_eager_spread``): a step
      that sums with atomic adds differs from its replay by its rounding alone.
      ``replay_off``: for each step with an output off, the worst such output (its index,
      difference and eager spread).

    Each step runs in eval mode (no dropout), with seeded noise on every parameter for the
    check's duration (:func:`_noised`). ``replay_incomplete``: a kernel is missing or a
    output's difference is above :func:`allowed_difference` (:data:`REPLAY_TOLERANCE`, or
    :data:`SPREAD_FACTOR` times that output's eager spread); the contender's replay times then
    leave work out (Protenix 2.0's fast LayerNorm launches its forward and input-gradient
    kernels on the legacy default stream, outside any capture). Both ways, because a comparison
    can pass where launches are missing: with the blocks' zero-initialised output layers,
    Protenix's Pairformer forward replay matched its eager forward without its six LayerNorm
    forward launches (H200, 2026-12-01). Nothing on CPU."""
    if capture_fn is None:
        if device.type != "cuda":
            return {}
        capture_fn = capture
    graphs: dict[Callable, tuple] = {}

    def capture_once(body, device):  # the training step's graph serves both ways
        if body not in graphs:
            graphs[body] = capture_fn(body, device)
        return graphs[body]
    training = case.module.training
    case.module.eval()
    try:
        with _untuned(), _noised(case.module):
            steps = {"forward": forward_step(case), "train": train_step(case)}
            compared = {name: replay_differences(step, case.inputs, device, capture_once)
                        for name, step in steps.items()}
            missing = replay_census(steps["train"], device, capture_once, counts_fn)
    except Exception as e:  # noqa: BLE001  (reported, as a mode's failure is)
        return {"replay_diff": None, "replay_check_error": error_text(e)}
    finally:
        case.module.train(training)
        graphs.clear()  # the graphs' memory pools go with them
    diffs = {name: d for name, (d, _) in compared.items()}
    spreads = {name: sp for name, (_, sp) in compared.items()}
    off = {}
    for name, ds in diffs.items():
        bad = [(largest([d]), i)  # (a NaN as inf)
               for i, (d, sp) in enumerate(zip(ds, spreads[name]))
               if not d <= allowed_difference(sp)]
        if bad:
            d, i = max(bad)
            off[name] = {"output": i, "diff": d, "eager_spread": spreads[name][i]}
    steps_diff = {name: largest(ds) for name, ds in diffs.items()}
    return {"replay_diff": largest(list(steps_diff.values())), "replay_diff_steps": steps_diff,
            "replay_eager_spread": {name: largest(sp) for name, sp in spreads.items()},
            "replay_off": off, "replay_missing_kernels": missing,
            "replay_incomplete": bool(missing or off)}


def add_noise(module: torch.nn.Module, seed: int = 3, scale: float = 0.02) -> None:
    """Seeded Gaussian noise (``scale`` standard deviation) added to every floating parameter of
    ``module``, in place. The blocks are built as initialised: their output layers are zeros
    (AF2's "final" init, Protenix's and fold's alike), so each update is zero, a block's forward
    returns its inputs whatever ran before those layers, and no gradient reaches upstream of
    them. With noise every path reaches the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen).to(p.device, p.dtype), alpha=scale)


@contextlib.contextmanager
def _noised(module: torch.nn.Module):
    """:func:`add_noise` while the check runs, then the parameters' own values back: a replay
    that misses a kernel before a zero output layer would still match the eager step."""
    with restored([p for p in module.parameters() if p.is_floating_point()]):
        add_noise(module)
        yield


@contextlib.contextmanager
def _untuned():
    """fold-kernels' autotuning off (``FOLD_KERNELS_AUTOTUNE=0``: each kernel's default
    configuration, nothing cached) while the check runs: its eval-mode steps (no dropout) launch
    kernel variants the timed steps did not, which would be tuned first (with the training step
    checked, the check of one Pairformer row at 256 tokens took about 110 s more on the H200,
    most of it likely that tuning). Which configuration runs does not matter to the check: the
    replay and the eager step it is compared with use the same one."""
    with switch_restored("FOLD_KERNELS_AUTOTUNE"):
        os.environ["FOLD_KERNELS_AUTOTUNE"] = "0"
        yield


def replay_verdict(row: dict[str, Any]) -> str:
    """What a row's replay check found, for the tables: the kernels its replay misses and the
    steps whose replayed results are off."""
    label = {"forward": "eval forward", "train": "eval training step"}
    if "replay_off" in row:  # output by output
        found = [f"{label.get(k, k)} off by {o['diff']:.2g} after new inputs (output "
                 f"{o['output']}" + (f"; its eager calls: {o['eager_spread']:.2g})"
                                     if o["eager_spread"] else ")")
                 for k, o in row["replay_off"].items()]
    else:  # older rows: a step's largest difference against its largest spread, if any
        steps = row.get("replay_diff_steps") or {"forward": row.get("replay_diff")}
        spreads = row.get("replay_eager_spread") or {}
        found = [f"{label.get(k, k)} off by {v:.2g} after new inputs"
                 + (f" (its eager calls: {spreads[k]:.2g})" if spreads.get(k) else "")
                 for k, v in steps.items()
                 if v is not None and not v <= allowed_difference(spreads.get(k))]
    missing = row.get("replay_missing_kernels") or {}
    if missing:
        names = sorted(missing, key=lambda k: -missing[k])
        found.insert(0, f"{sum(missing.values())} launches not in it, of "
                     + ", ".join(f"{_short(k)} x{missing[k]}" for k in names[:3])
                     + (", ..." if len(names) > 3 else ""))
    return f"replay incomplete ({'; '.join(found)}): the graph misses work"


def _short(kernel: str) -> str:
    """A kernel's name without its template and parameter lists (``void f<T>(int)`` -> ``f``)."""
    name = kernel.split("(")[0].split("<")[0].strip()
    return name.split()[-1] if name else kernel[:40]


def contenders(names: list[str], shape: pb.Shape, kernel_settings: list[bool]):
    """``(contender, kernels)`` pairs that have ``shape.block``; kernels None for fold and for a
    peer block without a kernel flag."""
    out = []
    for name in names:
        if name == "fold":
            out.append(("fold", None))
            continue
        _, blocks, flags = pb.PEERS[name]
        if shape.block not in blocks:
            continue
        offered = flags[shape.block]
        if offered == (False,):
            out.append((name, None))
        else:
            out.extend((name, k) for k in kernel_settings if k in offered)
    return out


# --params: the blocks' parameters as initialised, or with noise; each with the tables' words
PARAMS = {"noised": "parameters noised (no zero output layer)",
          "init": "parameters as initialised (zero output layers)"}


def build(name: str, kernels: bool | None, shape: pb.Shape, sizes, x, device, args) -> pb.Case:
    """Contender ``name``'s block for ``shape`` on ``x`` (:func:`peer_blocks.base_inputs`), in
    the precision :func:`settle_precision` put in ``args``, the peer's kernels on or off; with
    ``args.params == "noised"`` every parameter gets seeded noise (:func:`add_noise`), so that
    no output layer is zero, as in trained weights."""
    case = _build(name, kernels, shape, sizes, x, device, args)
    if args.params == "noised":
        add_noise(case.module)
    return case


def _build(name: str, kernels: bool | None, shape: pb.Shape, sizes, x, device, args) -> pb.Case:
    if name == "fold":
        return pb.build_fold(shape, sizes, x, device, args.fold_precision, args.tiny)
    if name == "protenix":
        return pb.build_protenix(shape, sizes, x, device, args.peer_dtype, bool(kernels),
                                 args.protenix_layernorm)
    if name == "boltz":
        return pb.build_boltz(shape, sizes, x, device, args.peer_dtype, bool(kernels))
    return pb.build_openfold(shape, sizes, x, device, args.peer_dtype, bool(kernels))


def peer_weights(choice: str, fold_precision: str) -> str:
    """``--peer-weights``: ``match`` is like with like, the peers' streams in fold's dtype (bf16
    for fold's ``bf16``, fp32 for its fp32 streams under autocast)."""
    if choice != "match":
        return choice
    return "bf16" if fold_precision == "bf16" else "fp32"


def versions(names: list[str]) -> dict[str, str]:
    """Python's, torch's and Triton's versions and those of the named peers (with the
    kernel packages Protenix and Boltz run: cuEquivariance, trifast), "not installed" if absent."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "triton": triton_version() or "not installed"}
    dists = {n: pb.PEERS[n][0] for n in names if n != "fold"}
    if "protenix" in dists or "boltz" in dists:
        dists |= {"cuequivariance-torch": "cuequivariance_torch",
                  "cuequivariance-ops-torch-cu13": "cuequivariance_ops_torch_cu13",
                  "trifast": "trifast"}
    for label, dist in dists.items():
        try:
            out[label] = pb.peer_version(dist)
        except Exception:  # noqa: BLE001
            out[label] = "not installed"
    return out


def settle_precision(args: argparse.Namespace, device: torch.device) -> None:
    """``args.fold_dtype``, ``args.peer_weights`` / ``args.peer_dtype`` and
    ``args.protenix_layernorm`` from the command line's choices and the device (what
    :func:`build` reads)."""
    args.fold_dtype = (pb.FOLD_PRECISIONS[args.fold_precision][0] if device.type == "cuda"
                       else torch.float32)
    args.peer_weights = peer_weights(args.peer_weights, args.fold_precision)
    args.peer_dtype = torch.float32 if (args.peer_weights == "fp32" or device.type != "cuda") \
        else torch.bfloat16
    if args.protenix_layernorm is None:  # peer_setup.sh sets it when the build fails
        args.protenix_layernorm = os.environ.get("PEERS_PROTENIX_LAYERNORM") or (
            "fast_layernorm" if device.type == "cuda" else "torch")
