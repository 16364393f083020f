#!/usr/bin/env bash
# The main job on the bundled real data (data/demo): build the ahead-of-time feature cache,
# then prepare training samples through the non-blocking loader and report what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
fold-data demo data/demo --cache .fold_cache "$@"
