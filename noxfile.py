"""Sessions that build, test, lint, benchmark and demo fold.

    nox -s tests        every package's tests + tests/integration + tests/benchmarks on CPU
                        (what CI runs)
    nox -s ops data model kernels parallel chunk train   one package alone, installed alone
                        (kernels: the Triton kernels under TRITON_INTERPRET=1 on CPU)
    nox -s gpu          GPU-marked tests in the *current* environment (no install step)
    nox -s lint         ruff
    nox -s demo         the main job: short training run + prediction on the bundled data
    nox -s bench        the benchmark entry points of BENCHMARKS in the current environment

CPU installs pin torch==2.13.0 (a CPU wheel; an unpinned torch would pull a multi-GB CUDA build).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ["fold-ops", "fold-data", "fold-kernels", "fold-model", "fold-chunk", "fold-parallel",
            "fold-train"]
# Which siblings each package needs installed next to it (dependencies point one way). fold-ops
# is the op contract that fold-kernels and fold-model share (neither imports the other).
SIBLINGS = {
    "fold-ops": [],
    "fold-data": [],
    "fold-kernels": ["fold-ops"],
    "fold-chunk": [],
    "fold-model": ["fold-ops", "fold-data"],
    "fold-parallel": ["fold-ops", "fold-data", "fold-model"],
    "fold-train": ["fold-ops", "fold-data", "fold-kernels", "fold-model", "fold-chunk",
                   "fold-parallel"],
}
TORCH_CPU = "torch==2.13.0"
TEST_DEPS = ["pytest>=8", "pytest-xdist>=3"]
# No GPU in CI: Triton kernels run in its interpreter on CPU tensors. LAYERNORM_TYPE=torch:
# Protenix's plain LayerNorm (its default compiles a CUDA extension when imported).
CPU_ENV = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
           "LAYERNORM_TYPE": "torch"}
# Protenix 2.0.0 (Apache-2.0), the reference of the Protenix importer's parity tests (fold-model
# tests/af3/test_af3_protenix_parity.py, fold-train tests/test_init_from_protenix.py): its wheel
# (0.5 MB) without its declared dependencies (they pin torch 2.7, CUDA kernels, DeepSpeed, ESM,
# wandb), plus the few that its model modules and config system import. RDKit, numpy and tqdm
# come with fold-data. (The wheel also installs top-level `configs`, `runner`, `scripts` and
# `tests` packages; fold imports none of these names.)
PROTENIX = "protenix==2.0.0"
PROTENIX_DEPS = ["optree==0.17.0", "ml_collections==1.1.0", "absl-py==2.5.1", "PyYAML==6.0.4",
                 "scipy>=1.9"]

# What `nox -s bench` runs, each as `python -m benchmarks.<entry>` with its default options (one
# GPU, or the CPU for data.*); `nox -s bench -- model.evoformer train.af3` runs the named ones.
# Helpers (benchmarks/common) and one-off tools (benchmarks/tools) are not entry points here.
BENCHMARKS = [
    "kernels.attention", "kernels.attention_fwd_sweep", "kernels.elementwise",
    "kernels.launch_overhead", "kernels.layer_norm_bwd_sweep", "kernels.triangle_mult",
    "model.evoformer", "model.af3_blocks", "model.full", "model.loss_af3_pairs", "model.peers",
    "train.ablation", "train.af3", "train.af3_msa", "train.predict_graphs",
    "chunk.evoformer", "chunk.longest_input",
    "predict.structure_checks",
    "data.loader", "data.cache", "data.af3_cache", "data.search_msa",
]
# Multi-GPU entry points and their ranks: run under torchrun, only when named
# (`nox -s bench -- parallel.dap_bp`), since they need that many GPUs.
DISTRIBUTED_BENCHMARKS = {"parallel.dap_bp": 2, "parallel.scaling": 4,
                          "parallel.predict_dap": 2}

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session, *packages: str) -> None:
    session.install(TORCH_CPU, *TEST_DEPS)
    session.install(*[str(ROOT / "packages" / p) for p in packages])
    if "fold-model" in packages:  # the Protenix parity tests (fold-model's and fold-train's)
        session.install(*PROTENIX_DEPS)
        session.install("--no-deps", PROTENIX)


def _pytest(session: nox.Session, *paths: str, marker: str = "not gpu") -> None:
    """One pytest process per test folder (module names repeat across packages); all folders
    run even when one fails, and the session fails at the end if any did."""
    args = list(session.posargs) or ["-q", "-n", os.environ.get("FOLD_TEST_WORKERS", "2")]
    config = ["-c", str(ROOT / "pytest.ini"), "--rootdir", str(ROOT)]
    failed = []
    for path in paths:
        try:
            session.run("pytest", *config, "-m", marker, *args, path, env=CPU_ENV)
        except nox.command.CommandFailed:
            failed.append(path)
    if failed:
        session.error(f"tests failed in: {', '.join(failed)}")


@nox.session
def tests(session: nox.Session) -> None:
    """Everything on CPU: each package's tests, the cross-package integration tests and the
    benchmarks' smoke tests."""
    _install(session, *PACKAGES)
    paths = [f"packages/{p}/tests" for p in PACKAGES] + ["tests/integration", "tests/benchmarks"]
    _pytest(session, *paths)


def _package_session(package: str):
    def run(session: nox.Session) -> None:
        _install(session, *SIBLINGS[package], package)
        _pytest(session, f"packages/{package}/tests")

    run.__doc__ = f"{package} alone: installed with only the siblings it declares, then its tests."
    if package == "fold-kernels":
        run.__doc__ += " The kernels run in Triton's interpreter (TRITON_INTERPRET=1) on CPU."
    return run


for _pkg in PACKAGES:
    nox.session(name=_pkg.removeprefix("fold-"))(_package_session(_pkg))


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """The kernels' tests and every GPU-marked test, on the GPU of the *current* environment.

    For machines that have PyTorch and Triton but no package registry (and maybe no gemmi or
    RDKit): the packages run from source through PYTHONPATH, nothing is installed. fold-kernels'
    tests all run (on CUDA/ROCm when a GPU is present, in the interpreter otherwise); elsewhere
    only the files that hold GPU-marked tests are collected, so test modules that need gemmi or
    RDKit are not imported on an image without them.
    """
    src = os.pathsep.join(str(ROOT / "packages" / p / "src") for p in PACKAGES)
    env = {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    config = ["-c", str(ROOT / "pytest.ini"), "--rootdir", str(ROOT), "-q", *session.posargs]
    session.run("python", "-m", "pytest", *config, "packages/fold-kernels/tests", env=env)
    marked = sorted(
        str(f.relative_to(ROOT))
        for f in [*ROOT.glob("packages/*/tests/**/test_*.py"), *ROOT.glob("tests/**/test_*.py")]
        if "fold-kernels" not in f.parts and "pytest.mark.gpu" in f.read_text()
    )
    for path in marked:  # one process each: test module names repeat across packages
        session.run("python", "-m", "pytest", *config, "-m", "gpu", path, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on the bundled real data (CPU when no GPU is present)."""
    _install(session, *PACKAGES)
    session.run("bash", str(ROOT / "scripts" / "demo.sh"), *session.posargs, external=True)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """The benchmark entry points of BENCHMARKS (or those named after --) in the current
    environment, from the repository root; see benchmarks/README.md for each one's options."""
    src = os.pathsep.join([str(ROOT)] + [str(ROOT / "packages" / p / "src") for p in PACKAGES])
    env = {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    entries = list(session.posargs) or BENCHMARKS
    unknown = sorted(set(entries) - set(BENCHMARKS) - set(DISTRIBUTED_BENCHMARKS))
    if unknown:
        session.error(f"unknown benchmarks {unknown}; choose from "
                      f"{BENCHMARKS + list(DISTRIBUTED_BENCHMARKS)}")
    failed = []
    for entry in entries:  # every one runs even when one fails; the session fails at the end
        module = f"benchmarks.{entry}"
        launcher = ["python"]
        if entry in DISTRIBUTED_BENCHMARKS:
            launcher = ["torchrun", "--nproc_per_node", str(DISTRIBUTED_BENCHMARKS[entry])]
        try:
            session.run(*launcher, "-m", module, env=env)
        except nox.command.CommandFailed:
            failed.append(entry)
    if failed:
        session.error(f"benchmarks failed: {', '.join(failed)}")
