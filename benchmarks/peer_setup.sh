# Peers for benchmarks/kernels/attention.py and benchmarks/model/peers.py on a GPU machine without
# a package index: cuEquivariance (triangle attention / multiplication kernels), trifast, Boltz,
# Protenix, and OpenFold's Evoformer modules, installed --no-deps into $PEERS_SITE (default
# /tmp/site), which is put first on PYTHONPATH. Source it from the repository root:
#   source benchmarks/peer_setup.sh [WHEEL_DIR]   (WHEEL_DIR defaults to .whl; then
#   source benchmarks/gpu_setup.sh and run the benchmark)
# Returns 1 and says what when a required file is missing or the install fails.
#
# Download side (once, on a machine with pip and network; WHEEL_DIR is an ignored folder that the
# device call names in `carry`; the whole carry must stay under 64 MiB, tracked tree included):
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   python3 -m pip download $P -d .whl/wheels cuequivariance==0.13.0 \
#     cuequivariance-torch==0.13.0 trifast==0.1.13 boltz==2.2.1 protenix==2.0.0 \
#     platformdirs==4.3.8 optree==0.17.0
#   # the two compiled cuEquivariance wheels are 73 MB: carry them unpacked and xz-compressed
#   python3 -m pip download $P -d /tmp/cueq cuequivariance-ops-cu13==0.13.0 \
#     cuequivariance-ops-torch-cu13==0.13.0
#   mkdir -p /tmp/cueq/site && for w in /tmp/cueq/*.whl; do unzip -q -o "$w" -d /tmp/cueq/site; done
#   tar -C /tmp/cueq/site -cJf .whl/cuequivariance_ops_cu13-0.13.0.tar.xz .   (~28 MiB)
# platformdirs: cuequivariance-ops and trifast import it; optree: protenix.model.utils imports it.
# Everything else the block modules import at import time (torch, triton, numpy, scipy, einops,
# jaxtyping, networkx, sympy, opt-einsum, tqdm) is on the GPU image. Optional, for
# benchmarks/model/peers.py only: WHEEL_DIR/openfold/ (OpenFold's source at a commit, its COMMIT
# file naming it: `git archive COMMIT openfold setup.py | tar -x -C WHEEL_DIR/openfold`); the
# kernels benchmark needs none of it, so a lighter carry of WHEEL_DIR/wheels and the tar suffices.
# The peers' own CUDA extensions are built here for this GPU only (benchmarks/peer_extensions.py,
# about a minute): OpenFold's in-place attention softmax, which OpenFold imports at import time
# (its ExtraMSABlock's row attention calls it; its EvoformerBlock does not), and Protenix's fast
# LayerNorm, its default LAYERNORM_TYPE. A failed build is reported;
# Protenix then runs LAYERNORM_TYPE=torch and the results say why (PEERS_PROTENIX_LAYERNORM_ERROR).
_peer_setup() {
  local dir site w
  dir="${1:-.whl}"
  site="${PEERS_SITE:-/tmp/site}"
  local wheels=(cuequivariance-0.13.0-py3-none-any.whl cuequivariance_torch-0.13.0-py3-none-any.whl
    trifast-0.1.13-py3-none-any.whl platformdirs-4.3.8-py3-none-any.whl)
  local optional=(boltz-2.2.1-py3-none-any.whl protenix-2.0.0-py3-none-any.whl
    optree-0.17.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl)
  local paths=()
  for w in "${wheels[@]}"; do
    [ -f "$dir/wheels/$w" ] || { echo "peer_setup.sh: MISSING $dir/wheels/$w" >&2; return 1; }
    paths+=("$dir/wheels/$w")
  done
  for w in "${optional[@]}"; do
    if [ -f "$dir/wheels/$w" ]; then paths+=("$dir/wheels/$w"); else
      echo "peer_setup.sh: $w not carried (its peer rows will say not installed)"; fi
  done
  [ -f "$dir/cuequivariance_ops_cu13-0.13.0.tar.xz" ] \
    || { echo "peer_setup.sh: MISSING $dir/cuequivariance_ops_cu13-0.13.0.tar.xz" >&2; return 1; }
  mkdir -p "$site" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${paths[@]}" 2>&1 | grep -v -i "running pip as"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "peer_setup.sh: pip install FAILED" >&2; return 1; }
  tar -xJf "$dir/cuequivariance_ops_cu13-0.13.0.tar.xz" -C "$site" \
    || { echo "peer_setup.sh: unpacking the cuEquivariance ops FAILED" >&2; return 1; }
  if [ -d "$dir/openfold/openfold" ]; then
    cp -r "$dir/openfold/openfold" "$site/" || return 1
    export PEERS_OPENFOLD_COMMIT="$(cat "$dir/openfold/COMMIT")"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  if python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    local of_pid=""
    if [ -d "$site/openfold" ]; then
      PEERS_SITE="$site" python3 -m benchmarks.peer_extensions openfold > /tmp/peer_ext_openfold.log 2>&1 &
      of_pid=$!
    fi
    if [ -d "$site/protenix" ]; then
      if python3 -m benchmarks.peer_extensions protenix > /tmp/peer_ext_protenix.log 2>&1; then
        echo "peer_setup.sh: Protenix's fast LayerNorm built"
      else
        export PEERS_PROTENIX_LAYERNORM=torch
        export PEERS_PROTENIX_LAYERNORM_ERROR="$(tail -c 500 /tmp/peer_ext_protenix.log)"
        echo "peer_setup.sh: WARNING Protenix's fast LayerNorm did not build: $PEERS_PROTENIX_LAYERNORM_ERROR"
      fi
    fi
    if [ -n "$of_pid" ]; then
      if wait "$of_pid"; then echo "peer_setup.sh: OpenFold's attn_core_inplace_cuda built"
      else echo "peer_setup.sh: WARNING OpenFold's extension did not build: $(tail -c 500 /tmp/peer_ext_openfold.log)"; fi
    fi
  fi
  python3 - <<'PY'
import importlib
for m in ("cuequivariance_torch", "cuequivariance_ops_torch", "trifast"):
    try:
        importlib.import_module(m)
        print(f"peer_setup.sh: {m} imports")
    except Exception as e:  # noqa: BLE001  (the benchmark records the row's error)
        print(f"peer_setup.sh: WARNING {m} does not import: {type(e).__name__}: {e}")
PY
}
_peer_setup "$@"
