#!/usr/bin/env bash
# Re-measure the AF2/AF3 blocks' host overhead and copies on one GPU, eager vs CUDA-graph replay,
# torch vs auto (Triton) backend; about 5-7 minutes on an H100 (first-call autotuning included;
# every step has its own timeout, 670 s in all at worst). Results go to $OUT (default
# ./overhead_out). Usage, from the repo root: source .whl/setup.sh && bash benchmarks/overhead_gpu.sh
# (TESTS=1 also runs the touched kernels' GPU tests first.)
set -u
OUT=${OUT:-overhead_out}
mkdir -p "$OUT"
B=benchmarks  # entry points run as modules: python3 -m $B.<suite>.<name>
run() {  # name timeout cmd...
  local name=$1 t=$2; shift 2
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc $?" >> "$OUT/summary.txt"
}
if [ "${TESTS:-0}" = 1 ]; then  # the touched kernels' GPU tests first (about 2 more minutes)
  run kernel_tests 150 python3 -m pytest -c pytest.ini -q -x -p no:cacheprovider \
    packages/fold-kernels/tests/test_evo_attention.py packages/fold-kernels/tests/test_host_path.py \
    packages/fold-kernels/tests/test_elementwise_softmax.py \
    packages/fold-kernels/tests/test_layer_norm_and_fused_linear.py
fi
run profile_eager 120 python3 -m $B.tools.profile_block evoformer:128,256 pairformer:256 \
  --backends torch auto --host --top 25 --out "$OUT/profile_eager.txt"
run profile_graphs 90 python3 -m $B.tools.profile_block evoformer:128,256 pairformer:256 \
  --backends torch auto --graphs --top 25 --out "$OUT/profile_graphs.txt"
for backend in auto torch; do
  for g in "" "--graphs"; do
    run "evo_${backend}${g:+_graphs}" 70 python3 -m $B.model.evoformer --orders af2 \
      --shapes "128,256;512,384" --reps 10 --backend $backend $g \
      --out "$OUT/evo_${backend}${g:+_graphs}.json"
  done
done
for g in "" "--graphs"; do
  run "af3${g:+_graphs}" 90 python3 -m $B.model.af3_blocks --compare $g \
    --blocks pairformer:256,pairformer:384,diffusion_transformer:384:48 \
    --out "$OUT/af3${g:+_graphs}.json"
done
cat "$OUT/summary.txt"
