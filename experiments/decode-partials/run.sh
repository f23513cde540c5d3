# Issue 16's batch-1 decode floor at Llama-8B shapes: the split decode's partial outputs in bf16 (the triton backend's
# decode_partials=out, FlashInfer's choice: its split-KV tmp_v is DTypeO) instead of fp32. At batch 1 x 4k the split
# that arrives last merges 32 partials of 4 heads x 128 fp32 a kv head, 64 KB read by one program after every other
# finished (the merge's tail); bf16 halves that and the splits' partial writes. README.md says what it found.
#   1  carry [".gpu/fk", ".old"], ~7 min on a fresh machine (ordered for a call that may be cut):
#      - three floor rounds (fused-merge-auto/run.sh 8: c101f91, the floor's before, in the same call), PDL on and off,
#        fp32 (the default) against out, 200 runs a replay, batch 1 / 16 x 4k, both shapes;
#      - GPU tests: test_decode_partials.py (raced, eager and graphed, PDL off / on, both shapes' floor cells);
#      - bench.kernels decode, the same four arms, batch 1 / 4 / 16 x 512 / 4k, both shapes.
#      .old: mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old   (untracked, git-excluded)
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test log).
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
OUTP=triton/decode_partials=out
ARMS=triton+pdl,$OUTP+pdl,triton,$OUTP
case $PART in
1)
  FLOOR_SECS=90 floor_rounds $ARMS
  step "GPU tests: bf16 partials raced, eager and graphed, at both shapes' floor cells"
  gpu_tests partials 150 -m gpu tests/backends/test_decode_partials.py
  for m in smollm2 llama8b; do
    step "$m: $ARMS, batch 1 / 4 / 16 x 512 / 4k"
    timeout 120 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --models $m --batches 1,4,16 \
      --contexts 512,4096 --backends "$ARMS" --out "$OUT/grid-$m" > $LOGS/grid-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-$m.log
  done
  ;;
*) echo "part 1"; exit 2 ;;
esac
pack
