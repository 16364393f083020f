"""Kernels tests: on a machine without a GPU, Triton runs every kernel in its CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence here at import time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # On a GPU the tests check correctness with each kernel's default launch configuration;
    # timing every candidate (compiling each) per shape and dtype would take many minutes.
    # test_tuning.py covers the autotuner itself.
    os.environ.setdefault("FOLD_KERNELS_AUTOTUNE", "0")


def pytest_configure(config):
    # also registered by the repository's conftest.py, which pytest skips when run from here
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (nox 'gpu' session)")
