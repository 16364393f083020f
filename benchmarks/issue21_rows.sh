#!/usr/bin/env bash
# Re-measure issue 21's goal rows on one GPU, against the peers as their users run them, in
# calls that each fit the device tool's 10 minutes (peer setup included). From the repo root,
# with the peers' wheels in WHEEL_DIR (default .whl; see benchmarks/peer_setup.sh):
#   bash benchmarks/issue21_rows.sh GROUP      (OUT=dir for the results, default ./issue21_out)
# GROUP:
# Every contender of a row in one precision (model.peers' --peer-weights match): the Pairformer
# in bf16 (the issue's setting), the rows with Boltz or OpenFold with fp32 streams under bf16
# autocast (Boltz rejects bf16 LayerNorm weights), as fold-train runs them.
#   pairformer  Pairformer training replays at 256-768 tokens vs Protenix + cuEquivariance
#   eager       eager rows pinned to one core (every contender alike): diffusion 384 x 48 vs
#               Protenix and Boltz, triangle multiplication N 256 / 384 vs cuEquivariance,
#               Evoformer (128, 256) vs OpenFold
#   evoformer   the Evoformer at its four shapes vs OpenFold, eager and replays, pinned; a run
#               cut short by its timeout goes on in a later call with FROM=<the first call's
#               evoformer.json, carried>: only the rows missing there are measured
#   masks       the same rows with the masks users' inputs have (MASK=none, the default: every
#               key kept, a training crop of a longer chain; MASK=padded: the last tenth padded,
#               a prediction padded to its bucket): EvoAttention against FlexAttention (which
#               takes the mask as its users would: no term, or a BlockMask), cuEquivariance and
#               trifast for ATTN_GROUPS (default "msa"; "triangle" runs to N 1536), then the
#               Pairformer at 256 / 512 tokens against Protenix + cuEquivariance
#   replays     whether each contender's replays hold all its work (model.peers' replay check
#               of the forward and the training step): the Pairformer at 256 / 768 tokens
#               against Protenix with its default fast LayerNorm (its forward and input-gradient
#               kernels go to the legacy default stream, outside a capture), the diffusion
#               transformer against Protenix and Boltz
#   kernel_sums the summed kernel time of each contender's eager step (model.peers' train_kernels
#               mode: every kernel, whatever its stream, without the host's gaps) beside its
#               replay: what a replay holding all the work would take, for the rows whose
#               replays do not (the Pairformer at 256-768 tokens, the diffusion transformer)
#   params      the Pairformer at 256 / 768 tokens with the blocks' parameters as initialised
#               and noised (model.peers --params), both contenders alike
#   node        triangle multiplication as one autograd node (FOLD_KERNELS_TRI_MUL_NODE): its tests
#               on the GPU, the layer's training step composed / one node in one process
#               (tools.switch_ab, pinned), then the layer against cuEquivariance, pinned
#   node_blocks the integration tests of the node on the GPU, the same switch on the Evoformer (128, 256) and Pairformer 256 training steps
#               (mixed precision as fold-train trains), then the Evoformer (128, 256) eager row
#               against OpenFold, pinned
#   rounds      the Evoformer's eager rows at (128, 256) and (512, 384) against OpenFold in
#               alternating rounds, pinned (tools.peers_rounds: the host's drift reaches both),
#               then fold against a second fold block at (128, 256) (A/A: the rounds' spread)
#   tests       fold-kernels' tests on the GPU (TESTS=test files or node ids to narrow
#               them; default: the whole suite), no peers needed
# Pinning: eager steps bound by host time moved by 1.3-1.8x between unpinned runs on the H200
# host (results/model/model_peers_h200_pinning.md, results/tools/pin_ab_h200.md); replays do not
# depend on it. Each step has its own timeout; rc of each goes to $OUT/summary.txt. Every log
# (setup and steps, each under an "== name ==" line) goes to the one $OUT/run.log, so that a
# group's files (run.log, summary.txt, a JSON and a Markdown table per step) stay within the
# 8 files the device tool returns.
set -u
GROUP=${1:?"usage: bash benchmarks/issue21_rows.sh pairformer|eager|evoformer|masks|replays|kernel_sums|params|node|node_blocks|rounds|tests"}
OUT=${OUT:-issue21_out}
PIN=${PIN:-2}  # the CPU the eager rows are pinned to
mkdir -p "$OUT"
echo "== setup ==" > "$OUT/run.log"
if [ "$GROUP" = tests ]; then
  source benchmarks/gpu_setup.sh >> "$OUT/run.log" 2>&1
  echo "== tests ==" >> "$OUT/run.log"
  # shellcheck disable=SC2086  # TESTS is a list of pytest arguments
  timeout 540 python3 -m pytest -q -p no:cacheprovider ${TESTS:-packages/fold-kernels/tests} \
    >> "$OUT/run.log" 2>&1
  echo "tests rc $?" | tee "$OUT/summary.txt"
  tail -3 "$OUT/run.log"
  exit 0
fi
source benchmarks/peer_setup.sh "${WHEEL_DIR:-.whl}" >> "$OUT/run.log" 2>&1 || {
  echo "peer setup failed: see $OUT/run.log"; exit 1; }
source benchmarks/gpu_setup.sh >> "$OUT/run.log" 2>&1
run() {  # name timeout cmd...
  local name=$1 t=$2; shift 2
  echo "== $name ==" >> "$OUT/run.log"
  timeout "$t" "$@" >> "$OUT/run.log" 2>&1
  echo "$name rc $?" >> "$OUT/summary.txt"
}
P="python3 -m benchmarks"
case $GROUP in
  pairformer)
    run pairformer 420 $P.model.peers --contenders fold,protenix --kernels on --modes train_graph \
      --blocks pairformer:256,pairformer:384,pairformer:512,pairformer:768 \
      --out "$OUT/pairformer.json" ;;
  eager)
    run diffusion 150 $P.model.peers --blocks diffusion:384x48 --contenders fold,protenix,boltz \
      --fold-precision mixed --modes train_eager,fwd_eager,train_graph --pin-cpu "$PIN" \
      --out "$OUT/diffusion.json"
    run triangle_mult 150 taskset -c "$PIN" $P.kernels.triangle_mult --n 256 384 \
      --out "$OUT/triangle_mult.json"
    # 150 s ran out pinned (2026-11-29): OpenFold's eager steps on one core are slow to warm up.
    # The group took ~245 s before this step then (setup, diffusion, triangle multiplication)
    run evoformer 300 $P.model.peers --blocks evoformer:128x256 --contenders fold,openfold \
      --fold-precision mixed --modes train_eager,fwd_eager,train_graph --pin-cpu "$PIN" \
      --out "$OUT/evoformer.json" ;;
  rounds)
    run rounds 240 $P.tools.peers_rounds evoformer:128x256,evoformer:512x384 --peer openfold \
      --kernels off --modes train_eager,fwd_eager --rounds 7 --pin-cpu "$PIN" \
      --out "$OUT/evoformer_rounds.json"
    run rounds_aa 120 $P.tools.peers_rounds evoformer:128x256 --peer fold --rounds 7 \
      --pin-cpu "$PIN" --out "$OUT/evoformer_rounds_aa.json" ;;
  evoformer)
    [ -n "${FROM:-}" ] && cp "$FROM" "$OUT/evoformer.json"
    run evoformer 470 $P.model.peers --contenders fold,openfold --pin-cpu "$PIN" \
      --fold-precision mixed \
      --blocks evoformer:128x256,evoformer:512x384,evoformer:512x512,evoformer:1024x384 \
      --modes train_eager,fwd_eager,train_graph,fwd_graph --append --out "$OUT/evoformer.json" ;;
  masks)
    M=${MASK:-none}
    # shellcheck disable=SC2086  # ATTN_GROUPS is a list of group names
    run attention 330 $P.kernels.attention --groups ${ATTN_GROUPS:-msa} --mask "$M" \
      --contenders sdpa flex cueq trifast ours_atomic --out "$OUT/attention_$M.json"
    run pairformer 200 $P.model.peers --contenders fold,protenix --kernels on \
      --modes train_graph,fwd_graph --blocks pairformer:256,pairformer:512 --mask "$M" \
      --out "$OUT/pairformer_$M.json" ;;
  replays)
    # each check captures the forward and the training step in eval mode, whose kernels (no
    # dropout) fold autotunes anew: 256 tokens alone took ~175 s with both contenders (H200)
    run pairformer 300 $P.model.peers --contenders fold,protenix --kernels on \
      --modes train_graph --blocks pairformer:256,pairformer:768 --mask none \
      --out "$OUT/pairformer_check.json"
    run diffusion 150 $P.model.peers --contenders fold,protenix,boltz --fold-precision mixed \
      --modes train_graph --blocks diffusion:384x48 --out "$OUT/diffusion_check.json" ;;
  kernel_sums)
    run pairformer 320 $P.model.peers --contenders fold,protenix --kernels on \
      --modes train_kernels,train_graph --mask none \
      --blocks pairformer:256,pairformer:384,pairformer:512,pairformer:768 \
      --out "$OUT/pairformer_kernels.json"
    run diffusion 160 $P.model.peers --contenders fold,protenix,boltz --fold-precision mixed \
      --modes train_kernels,train_graph --blocks diffusion:384x48 \
      --out "$OUT/diffusion_kernels.json" ;;
  params)
    # the same rows with the blocks as initialised (zero output layers: no gradient reaches
    # upstream of them) and with every parameter noised, as trained weights are: whether the
    # zeros flatter anyone's timings (power, not work: the kernels are the same)
    for p in init noised; do
      run "pairformer_$p" 220 $P.model.peers --contenders fold,protenix --kernels on \
        --modes train_graph,train_kernels --mask none --params "$p" \
        --blocks pairformer:256,pairformer:768 --out "$OUT/pairformer_params_$p.json"
    done ;;
  node)
    echo "== node_tests ==" >> "$OUT/run.log"
    timeout 150 python3 -m pytest -q -p no:cacheprovider \
      packages/fold-kernels/tests/test_triangle_multiplication.py \
      tests/integration/test_triangle_multiplication_node.py >> "$OUT/run.log" 2>&1
    echo "node_tests rc $?" >> "$OUT/summary.txt"
    run node_ab 200 taskset -c "$PIN" $P.tools.switch_ab FOLD_KERNELS_TRI_MUL_NODE=0,1 \
      trimul:256,1 trimul:256,0 trimul:384,1 trimul:384,0 --rounds 5 --out "$OUT/node_ab.json"
    run triangle_mult 120 taskset -c "$PIN" $P.kernels.triangle_mult --n 256 384 \
      --out "$OUT/triangle_mult.json" ;;
  node_blocks)
    echo "== node_tests ==" >> "$OUT/run.log"
    # each kernel's default launch (the fold-kernels tests' setting): tuning every candidate of
    # every kernel met here took over 120 s
    FOLD_KERNELS_AUTOTUNE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider \
      tests/integration/test_triangle_multiplication_node.py \
      tests/integration/test_grouped_casts_kernels.py >> "$OUT/run.log" 2>&1
    echo "node_tests rc $?" >> "$OUT/summary.txt"
    run node_blocks_ab 240 taskset -c "$PIN" $P.tools.switch_ab FOLD_KERNELS_TRI_MUL_NODE=0,1 \
      evoformer:128,256@mixed pairformer:256@mixed --rounds 5 --out "$OUT/node_blocks_ab.json"
    run evoformer 220 $P.model.peers --blocks evoformer:128x256 --contenders fold,openfold \
      --fold-precision mixed --modes train_eager,train_graph --pin-cpu "$PIN" \
      --out "$OUT/evoformer.json" ;;
  *) echo "unknown group $GROUP: pairformer, eager, evoformer, masks, replays, kernel_sums, params, node, node_blocks or tests"; exit 2 ;;
esac
cat "$OUT/summary.txt"
