"""Static census of EvoAttention's inner loops in Hopper machine code (no GPU needed).

Compiles a kernel of ``fold_kernels.evo_attention`` (or of another module with the same kernels,
``--module``: e.g. an older copy of it) for sm_90 with Triton's own ``ptxas``, disassembles
it with the ``cuobjdump`` that ships with Triton, finds the key loop (the longest backward branch)
and counts its SASS instructions by opcode. At head dim 32 the forward is bound by instruction
issue (4 warp instructions per clock per SM), so instructions per logit element of the loop
(``loop instructions / logits per thread per iteration``) is the figure to drive down; MUFU.EX2
(16 per clock per SM) and HGMMA (the tensor cores) have headroom.

The launch is specialised as fold's cached launcher specialises the benchmark's inputs
(contiguous bf16 ``[1, R, H, N, D]`` with N and D multiples of 16, a contiguous bias, a bool
mask): 16-byte aligned pointers, every int divisible by 16 except R and H, the unit strides of the
bias and mask constant, and N a multiple of the blocks (``EVEN``).

    python -m benchmarks.tools.evo_sass --kernel fwd --configs candidates
    python -m benchmarks.tools.evo_sass --kernel fwd --configs 64x32:w4:s3:r2
    python -m benchmarks.tools.evo_sass --kernel dkdv --configs 64x64:w4:s3:r2:t

Configs: ``BMxBN:wW:sS:rR`` (``:t`` key-major dK/dV tiles) or ``candidates`` (the tuner's
candidates for bf16 at ``--head-dim``). Another Triton's code generation (the device image's 3.6,
say) is a ``pip install --no-deps --target DIR triton==3.6.0`` and ``PYTHONPATH=DIR:...`` away.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

KERNELS = {"fwd": "_fwd", "dkdv": "_bwd_dkdv", "dq": "_bwd_dq"}
TUNER = {"fwd": "fwd", "dkdv": "dkdv_atomic", "dq": "dq"}  # the candidates --configs names
POINTERS = {"Q", "K", "V", "G", "GB", "Bias", "Mask", "Runs", "O", "OPre", "LSE", "DO", "Delta",
            "DK", "DV", "DBias", "DQ"}
FP32_POINTERS = {"LSE", "Delta", "DBias", "DQ"}


def parse_config(text: str) -> dict:
    """``128x64:w8:s3:r2[:t]`` -> block sizes, warps, stages, rows, transpose."""
    parts = text.split(":")
    bm, bn = (int(x) for x in parts[0].split("x"))
    cfg = {"block_m": bm, "block_n": bn, "num_warps": 4, "num_stages": 3, "rows": 1,
           "transpose": False}
    for p in parts[1:]:
        if p == "t":
            cfg["transpose"] = True
        else:
            cfg[{"w": "num_warps", "s": "num_stages", "r": "rows"}[p[0]]] = int(p[1:])
    return cfg


def compile_kernel(module, kernel: str, cfg: dict, head_dim: int, has_mask: bool,
                   runs: bool = False):
    """The Triton-compiled kernel (sm_90) for this launch configuration (``runs``: with the
    mask's key runs, whose loop over unmasked blocks is then a second loop)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, KERNELS[kernel])
    jit = getattr(fn, "jit", fn)  # fold_kernels.launch.FastKernel wraps the JIT function
    names = jit.arg_names
    if "ROWS" not in names and cfg["rows"] > (2 if "TWO_ROWS" in names else 1):
        raise SystemExit(f"evo_sass: {module.__name__}.{KERNELS[kernel]} runs at most "
                         f"{2 if 'TWO_ROWS' in names else 1} rows per program")
    block_d = max(16, triton.next_power_of_2(head_dim))
    consts = dict(HAS_BIAS=True, HAS_MASK=has_mask, HAS_RUNS=has_mask and runs, HAS_GATE=False,
                  HAS_GATE_BIAS=False,
                  ROWS=cfg["rows"], TWO_ROWS=cfg["rows"] == 2, EVEN=True,
                  EVEN_D=head_dim == block_d, DBIAS_ATOMIC=True, DQ_ATOMIC=False,
                  TRANSPOSE=cfg["transpose"], STAGGER=True, BLOCK_M=cfg["block_m"],
                  BLOCK_N=cfg["block_n"],
                  BLOCK_D=block_d, PRECISION="tf32", PDL=True, sbj=1, smj=1)
    sig, const, attrs = {}, {}, {}
    for p in jit.params:
        i = (names.index(p.name),)
        if p.is_constexpr or p.name in ("sbj", "smj"):
            sig[p.name] = "constexpr"
            const[i] = consts[p.name]
        elif p.name in POINTERS:
            sig[p.name] = ("*u8" if p.name == "Mask" else "*i32" if p.name == "Runs" else
                           "*fp32" if p.name in FP32_POINTERS else "*bf16")
            attrs[i] = [["tt.divisibility", 16]]
        elif p.name in ("scale", "qk_scale"):
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "i32"
            if p.name not in ("R", "H"):
                attrs[i] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(jit, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"],
                                   "num_stages": cfg["num_stages"]})


def _cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else "cuobjdump"


_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/")
_OP = re.compile(r"\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def loop_census(cubin: bytes) -> dict:
    """Registers, stack and the opcode counts of the longest loop of the cubin's kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        tool = _cuobjdump()
        usage = subprocess.run([tool, "--dump-resource-usage", str(path)], check=True,
                               capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", str(path)], check=True, capture_output=True,
                              text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    lines = [ln for ln in sass.splitlines() if _ADDR.search(ln)]
    addr = [int(_ADDR.search(ln).group(1), 16) for ln in lines]
    where = {a: i for i, a in enumerate(addr)}
    best = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i] and int(m.group(1), 16) in where:
            j = where[int(m.group(1), 16)]
            if best is None or i - j > best[1] - best[0]:
                best = (j, i)
    if best is None:
        raise SystemExit("evo_sass: no loop found in the kernel's SASS")
    ops = collections.Counter()
    for ln in lines[best[0]:best[1] + 1]:
        m = _OP.search(ln)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return {"regs": regs, "stack": stack, "loop_instructions": sum(ops.values()),
            "opcodes": dict(ops.most_common())}


def census(module_name: str, kernel: str, configs: list[dict], head_dim: int,
           has_mask: bool, runs: bool = False) -> list[dict]:
    module = importlib.import_module(module_name)
    rows = []
    for cfg in configs:
        ck = compile_kernel(module, kernel, cfg, head_dim, has_mask, runs)
        res = loop_census(ck.asm["cubin"])
        threads = 32 * cfg["num_warps"]
        # logits per thread per loop iteration: one [BLOCK_M, BLOCK_N] tile for each row
        per_thread = cfg["block_m"] * cfg["block_n"] * cfg["rows"] / threads
        rows.append({"module": module_name, "kernel": kernel, "config": cfg,
                     "head_dim": head_dim, "mask": has_mask, "runs": has_mask and runs,
                     "shared_bytes": ck.metadata.shared, **res,
                     "logits_per_thread": per_thread,
                     "instructions_per_logit": round(res["loop_instructions"] / per_thread, 2)})
        c = cfg
        print(f"{module_name.rsplit('.', 1)[-1]} {kernel} {c['block_m']}x{c['block_n']} "
              f"w{c['num_warps']} s{c['num_stages']} r{c['rows']}{' t' if c['transpose'] else ''}"
              f": {res['regs']} regs, stack {res['stack']} B, {ck.metadata.shared // 1024} KiB "
              f"shared, loop {res['loop_instructions']} instr / {per_thread:.0f} logits = "
              f"{rows[-1]['instructions_per_logit']} per logit; MUFU "
              f"{res['opcodes'].get('MUFU', 0)}, HGMMA {res['opcodes'].get('HGMMA', 0)}",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel", choices=list(KERNELS), default="fwd")
    p.add_argument("--configs", nargs="+", default=["candidates"])
    p.add_argument("--module", default="fold_kernels.evo_attention")
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--no-mask", action="store_true", help="no key mask (HAS_MASK off)")
    p.add_argument("--runs", action="store_true",
                   help="with the mask's key runs (HAS_RUNS): the unmasked blocks get a loop of "
                        "their own, and the census counts the longest loop")
    p.add_argument("--out", type=Path, help="write every count as JSON here")
    args = p.parse_args(argv)
    # compile for the GPU: Triton decides interpreter or compiler when a kernel is decorated
    os.environ.pop("TRITON_INTERPRET", None)
    configs = []
    for text in args.configs:
        if text == "candidates":
            from fold_kernels import tuning

            configs += [{"block_m": c.block_m, "block_n": c.block_n, "num_warps": c.num_warps,
                         "num_stages": c.num_stages, "rows": c.rows, "transpose": c.transpose}
                        for c in tuning.attention_configs(TUNER[args.kernel], "sm90",
                                                          args.head_dim, 2)]
        else:
            configs.append(parse_config(text))
    rows = census(args.module, args.kernel, configs, args.head_dim, not args.no_mask,
                  args.runs)
    if args.out:
        from benchmarks.common.results import write_atomic

        write_atomic(args.out, json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
