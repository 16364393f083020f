#!/usr/bin/env bash
# Install the six packages without their dependencies into the current Python, for a GPU
# machine that has torch/triton/numpy but no package index (e.g. the device tool's image).
# Without the install, fold-kernels' entry point is missing and fold-model's "auto" backend
# would be the torch reference. Usage, from the repo root: source benchmarks/gpu_setup.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile \
  packages/fold-ops packages/fold-data packages/fold-kernels packages/fold-model packages/fold-chunk \
  packages/fold-parallel packages/fold-train 2>&1 | grep -v -i "warning: running pip as" \
  || true
python3 - <<'PY'
from fold_model import ops
found = ops.backends("attention")
print("fold packages installed; attention backends:", found)
PY
