#!/usr/bin/env bash
# Install the six packages without their dependencies into the current Python, for a GPU
# machine that has torch/triton/numpy but no package index (e.g. the device tool's image).
# Without the install, fold-kernels' entry point is missing and fold-model's "auto" backend
# would be the torch reference. Usage, from the repo root: source benchmarks/gpu_setup.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile \
  packages/fold-ops packages/fold-data packages/fold-kernels packages/fold-model packages/fold-chunk \
  packages/fold-parallel packages/fold-train 2>&1 | grep -v -i "warning: running pip as" \
  || true
# gemmi (mmCIF reading/writing: every predict that writes a structure, AF2 mmCIF inputs) and
# RDKit (AF3 reference conformers) are not on the device image: carry their cp312 wheels in
# .whl/data (an ignored folder; name `.whl/data` in the call's carry, ~35 MiB) and they are
# installed into /tmp/site-data. Download side, once, where pip has an index:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     -d .whl/data gemmi==0.7.5 rdkit==2026.9.1
if compgen -G ".whl/data/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site-data .whl/data/*.whl 2>&1 | grep -v -i "running pip as" || true
  export PYTHONPATH="/tmp/site-data${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_setup.sh: carried data libraries installed: $(ls .whl/data | tr '\n' ' ')"
fi
python3 - <<'PY'
from fold_model import ops
found = ops.backends("attention")
print("fold packages installed; attention backends:", found)
PY
