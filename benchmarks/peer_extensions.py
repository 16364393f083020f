"""Build the peers' own CUDA extensions on the GPU machine, for the GPU's architecture only.

Their build scripts compile for 5-6 architectures (minutes each); the benchmarks need one:

- OpenFold's ``attn_core_inplace_cuda`` (the in-place softmax OpenFold imports at import time;
  its extra-MSA row attention calls it by default), from the sources and flags of OpenFold's
  ``setup.py``, into ``$PEERS_SITE``;
- Protenix's ``fast_layer_norm_cuda_v2`` (its default ``LAYERNORM_TYPE``), by its own ``compile``,
  with nvcc's architecture list read as this GPU's only.

Usage (benchmarks/peer_setup.sh runs it):
``python3 -m benchmarks.peer_extensions openfold|protenix``.
Exits 1 with the error when a build fails; the benchmark then records that peer's import error.
"""

from __future__ import annotations

import os
import subprocess
import sys


def _arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def build_openfold(site: str) -> None:
    from torch.utils.cpp_extension import load

    csrc = os.path.join(site, "openfold", "utils", "kernel", "csrc")
    macros = ["-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5"]
    arch = _arch()
    load(name="attn_core_inplace_cuda",
         sources=[f"{csrc}/softmax_cuda.cpp", f"{csrc}/softmax_cuda_kernel.cu"],
         extra_include_paths=[csrc], extra_cflags=["-O3", *macros],
         extra_cuda_cflags=["-O3", "--use_fast_math", *macros, "-std=c++17", "-maxrregcount=50",
                            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                            "--expt-relaxed-constexpr", "--expt-extended-lambda",
                            "-gencode", f"arch=compute_{arch},code=sm_{arch}"],
         build_directory=site, verbose=False)


def build_protenix() -> None:
    arch = _arch()
    real = subprocess.check_output

    def check_output(cmd, *args, **kwargs):  # Protenix asks nvcc which architectures it has
        if "--list-gpu-arch" in cmd:
            return f"compute_{arch}\n"
        return real(cmd, *args, **kwargs)

    subprocess.check_output = check_output
    os.environ["LAYERNORM_TYPE"] = "fast_layernorm"
    import protenix.model.layer_norm.layer_norm  # noqa: F401  (builds on first import)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        if which == "openfold":
            build_openfold(os.environ.get("PEERS_SITE", "/tmp/site"))
        elif which == "protenix":
            build_protenix()
        else:
            raise SystemExit("usage: python3 -m benchmarks.peer_extensions openfold|protenix")
    except Exception as e:  # noqa: BLE001  (reported, and the benchmark records the peer's error)
        print(f"peer_extensions: {which} FAILED: {type(e).__name__}: {e}"[:3000], file=sys.stderr)
        raise SystemExit(1) from e
    print(f"peer_extensions: {which} built")
