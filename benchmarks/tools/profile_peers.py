"""Where fold's and its peers' block steps spend their GPU time, side by side, by kind of kernel.

``benchmarks.model.peers`` gives each contender's time for a block; this tool says where it goes.
Each contender is built exactly as ``model.peers`` builds it (same inputs, precision, mask and
kernel flags, the same fixed output gradients), its training step (forward + backward, or the
forward alone with ``--mode fwd``) is captured as a CUDA graph, and one replay is profiled with
``torch.profiler``. Kernels are put in groups by name (:data:`GROUPS`: attention, GEMMs,
LayerNorm, fold's other fused kernels, PyTorch's elementwise kernels and copies, the rest), and
each group's time is given per contender with the ratio of the best peer's to fold's: the
groups where that ratio is below a goal are what keeps the block from it. Each contender's top
kernels are listed too, so that a peer's kernel put in the wrong group can be seen.

    source benchmarks/peer_setup.sh && source benchmarks/gpu_setup.sh && \\
      python3 -m benchmarks.tools.profile_peers --blocks pairformer:256,pairformer:768 \\
        --contenders fold,protenix --out benchmarks/results/tools/profile_peers_h200.json
    python -m benchmarks.tools.profile_peers --device cpu --tiny --blocks pairformer:13 \\
        --contenders fold      # smoke: CPU ops by self time

A replay holds only what was launched on the capturing stream: Protenix 2.0's fast LayerNorm
launches its forward, input-gradient and first parameter-gradient kernels on the legacy default
stream, so they run once during capture and are absent from its replays (each replay is checked,
:func:`benchmarks.common.peer_runs.check_replay`). ``--eager`` profiles an eager step instead: every
kernel, the host's gaps between them left out. On the CPU there are no graphs: one eager step's
operators are grouped by self CPU time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import peer_blocks as pb
from benchmarks.common import peer_runs
from benchmarks.common.backends import ensure_kernels
from benchmarks.common.blocks import MASKS
from benchmarks.common.graphs import capture
from benchmarks.common.kernel_time import kernel_times
from benchmarks.common.machine import device_name
from benchmarks.common.results import publish

# (group, pattern on the kernel's or operator's name): the first that matches names the group.
# By kind of kernel, not by the block's parts: cuBLAS GEMMs serve every projection and fold's
# triangle product alike. cuEquivariance's fused triangle multiplication (kf_trimul: its
# projections, product, LayerNorms and gates) has a group of its own with fold's kernels for
# the same op's elementwise parts.
GROUPS = [
    ("attention", r"^_(fwd|fwd_cross|bwd_dkdv|bwd_dq|bwd_dbias|bwd_pre|mask_runs)\b|attention"
                  r"|attn|fmha|flash|softmax"),
    # (kf_zhifan: cuEquivariance's inference kernels of the same op in Protenix's forward,
    # the only cuEquivariance op there beside triangle attention's cudnn_fmha)
    ("triangle multiplication (fused)", r"trimul|kf_zhifan|^_tri_(gate|proj)_"),
    ("GEMM", r"nvjet|gemm|cutlass|xmma|splitKreduce|cublas|aten::(mm|bmm|addmm|linear"
             r"|matmul|baddbmm)\b"),
    ("LayerNorm", r"_ln_|layer_?norm|LayerNorm|layernorm"),
    ("reductions", r"_column_partials|_sum_partials|reduce_kernel|aten::(sum|mean)\b"),
    ("fold's fused elementwise (SwiGLU, gates, residuals)", r"^_(swiglu|gate|bdr)_"),
    ("PyTorch elementwise, copies", r"at::native|Memcpy|Memset|memcpy|memset|aten::"),
    ("other", r""),
]


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name):
            return group
    return "other"  # (unreachable: "other" matches everything)


def profile_case(case: pb.Case, device: torch.device, mode: str, warmup: int,
                 eager: bool = False) -> dict[str, Any]:
    """One contender's kernels and their groups for one ``mode`` step: a CUDA-graph replay, or
    (``eager``) the kernels of an eager step, which has every kernel however it is launched.
    A replay comes with :func:`benchmarks.common.peer_runs.check_replay`'s verdict."""
    body = peer_runs.train_step(case) if mode == "train" else peer_runs.forward_step(case)
    if eager or device.type != "cuda":
        return grouped(kernel_times(body, device, warmup))
    out = grouped(kernel_times(capture(body, device, max(warmup, 2))[0], device, warmup))
    return out | peer_runs.check_replay(case, device)


def grouped(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's profile from its ``kernels`` (each given its group): the time and launches
    of each group and of the whole step."""
    groups = {g: 0.0 for g, _ in GROUPS}
    launches = {g: 0 for g, _ in GROUPS}
    for k in kernels:
        k["group"] = group_of(k["name"])
        groups[k["group"]] += k["ms"]
        launches[k["group"]] += k["count"]
    return {"total_ms": sum(groups.values()), "launches": sum(launches.values()),
            "groups_ms": groups, "group_launches": launches, "kernels": kernels}


def _group_time(row: dict[str, Any], group: str) -> tuple[float, int]:
    """A contender's ms and launches in ``group`` ("total": the whole step)."""
    if group == "total":
        return row["total_ms"], row["launches"]
    return row["groups_ms"][group], row["group_launches"][group]


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], top: int) -> str:
    unit = ("self CPU ms of one eager step (no graphs on CPU)" if meta["device"] == "cpu" else
            "GPU kernel ms of one eager step (every kernel, without the host's gaps)"
            if meta.get("eager") else "GPU kernel ms of one CUDA-graph replay")
    lines = [f"# Where each contender's step goes, {meta['device']}, {meta['date']}", "",
             f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}. "
             f"Mode: {meta['mode']}; fold {meta['fold_precision']}, peers {meta['peer_weights']}"
             f"; token mask {meta['mask']}"
             + (f"; {peer_runs.PARAMS[meta['params']]}" if meta.get("params") else "")
             + f"; {unit}. Ratio: best peer / fold (above 1: fold "
             "faster in that group).", ""]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        same = [r for r in rows if r["shape"] == shape and "groups_ms" in r]
        failed = [r for r in rows if r["shape"] == shape and "error" in r]
        lines += [f"## {shape}", ""]
        if not same:
            lines += ["nothing measured", ""]
        else:
            names = [r["contender"] for r in same]
            lines.append("| group | " + " | ".join(f"{n} ms (launches)" for n in names)
                         + " | best peer / fold |")
            lines.append("|---|" + "---|" * (len(names) + 1))
            fold = next((r for r in same if r["contender"].startswith("fold")), None)
            peer_rows = [r for r in same if r is not fold]
            for g in [g for g, _ in GROUPS] + ["total"]:
                cells = ["{:.3f} ({})".format(*_group_time(r, g)) for r in same]
                ratio = "-"
                if fold is not None and peer_rows and _group_time(fold, g)[0] > 0:
                    best = min(_group_time(r, g)[0] for r in peer_rows)
                    ratio = f"{best / _group_time(fold, g)[0]:.2f}x"
                lines.append(f"| {g} | " + " | ".join(cells) + f" | {ratio} |")
            lines.append("")
            for r in same:
                lines += [f"Top kernels, {r['contender']}:", ""]
                lines += [f"- {k['ms']:.3f} ms x{k['count']} [{k['group']}] {k['name'][:100]}"
                          for k in r["kernels"][:top]]
                lines.append("")
        lines += [f"{r['contender']}: {peer_runs.replay_verdict(r)}, and its kernels above "
                  "leave it out." for r in same if r.get("replay_incomplete")]
        lines += [f"{r['contender']}: {r['error']}" for r in failed]
        if failed:
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke)")
    ap.add_argument("--blocks", default="pairformer:256,pairformer:768",
                    help="rows as model.peers names them")
    ap.add_argument("--contenders", default="fold,protenix")
    ap.add_argument("--kernels", default="on", help="peer kernel flags: on, off or both")
    ap.add_argument("--mode", choices=["train", "fwd"], default="train")
    ap.add_argument("--mask", choices=MASKS, default="none")
    ap.add_argument("--eager", action="store_true",
                    help="profile an eager step instead of a replay: every kernel, also those a "
                         "graph cannot hold (launched outside the capturing stream)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=20, help="kernels listed per contender")
    ap.add_argument("--peer-weights", choices=["match", "fp32", "bf16"], default="match")
    ap.add_argument("--protenix-layernorm", choices=["fast_layernorm", "torch"], default=None)
    ap.add_argument("--params", choices=sorted(peer_runs.PARAMS), default="noised",
                    help="parameters noised (default) or as initialised (as model.peers "
                         "--params)")
    ap.add_argument("--fold-precision", choices=sorted(pb.FOLD_PRECISIONS), default="bf16")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside it)")
    ap.add_argument("--regroup", type=Path, default=None,
                    help="a result of this tool: its kernels put in today's groups and its "
                         "tables rewritten (to --out), no profiling")
    args = ap.parse_args(argv)
    if args.regroup is not None:
        doc = json.loads(args.regroup.read_text())
        rows = [r if "kernels" not in r else {**r, **grouped(r["kernels"])} for r in doc["rows"]]
        meta = {k: v for k, v in doc.items() if k != "rows"} | {"groups": dict(GROUPS)}
        publish(args.out, meta, rows, markdown(meta, rows, args.top))
        return rows

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("profile_peers: --device cuda but CUDA is not available")
    names = [n.strip() for n in args.contenders.split(",")]
    unknown = set(names) - {"fold", *pb.PEERS}
    if unknown:
        raise SystemExit(f"--contenders: unknown {sorted(unknown)}")
    kernel_settings = [{"on": True, "off": False}[k.strip()] for k in args.kernels.split(",")]
    peer_runs.settle_precision(args, device)
    backends = ensure_kernels(device, needed=device.type == "cuda")
    meta = {"device": device_name(device),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": peer_runs.versions(names), "fold_attention_backends": backends,
            "mode": args.mode, "eager": args.eager, "fold_precision": args.fold_precision,
            "peer_weights": str(args.peer_dtype), "mask": args.mask,
            "protenix_layernorm": args.protenix_layernorm, "params": args.params,
            "groups": dict(GROUPS)}
    print(json.dumps(meta), flush=True)
    sizes = pb.fold_sizes(args.tiny)
    rows: list[dict[str, Any]] = []
    for shape in peer_runs.parse_rows(args.blocks):
        for name, kernels in peer_runs.contenders(names, shape, kernel_settings):
            label = name if kernels is None else f"{name} (kernels {'on' if kernels else 'off'})"
            row: dict[str, Any] = {"shape": shape.label(), "contender": label}
            try:
                case = peer_runs.build(name, kernels, shape, sizes,
                                   pb.base_inputs(shape, sizes, args.mask), device, args)
                row.update(profile_case(case, device, args.mode, args.warmup, args.eager))
                del case
            except Exception as e:  # noqa: BLE001  (a peer's failure is a result, not a crash)
                row["error"] = f"{type(e).__name__}: {e}"[:600]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
    publish(args.out, meta, rows, markdown(meta, rows, args.top))
    return rows


if __name__ == "__main__":
    main()
