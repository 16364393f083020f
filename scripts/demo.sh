#!/usr/bin/env bash
# The main job on the bundled real data (data/demo), on CPU in a few minutes: build the
# ahead-of-time feature cache, train the 'tiny' AF2 preset on every chain except 4zey_A, then
# predict 4zey_A (mmCIF + MSAs in, mmCIF with pLDDT out) with the averaged (EMA) weights, and
# print the training losses and the lDDT-Ca / TM-score / GDT of the prediction.
# Extra arguments go to `fold-train demo` (e.g. --steps 200, or key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
# One intra-op thread: the tiny model's ops are too small to split, the loader worker uses the
# other core, and extra threads only stall on a busy machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# --overwrite: each demo replaces the previous one's runs/demo (a run directory holds one run)
fold-train demo --data data/demo --cache .fold_cache --run-dir runs/demo --overwrite "$@"
