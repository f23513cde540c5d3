# Issue 16's batch-1 decode floor: one-stage decode launches loading each tile's V before its K (decode.set_v_first,
# paged.attend_tile's V_FIRST). Compiled by Triton 3.6 with K first, K's conversion to the dot's layout (shared-memory
# stores that wait for K's data) sits between K's and V's loads, so every program of a one-tile split waits on two
# round trips one after the other (experiments/decode-vfirst/README.md: the SASS). The same bits either way.
# Calls 1-2 ran at 3161153, where V first was the default and +vfirst0 the old order; it measured slower and K first is
# the default again, so the arms below are now named the other way round (+vfirst1 for V first): the same launches.
#   1  carry [".gpu/fk", ".old"], ~5 min warm:
#      - GPU tests: V first against K first bit for bit (PDL off / on, the heuristic's one-tile launches at head dim 64
#        and 128, decode_tiles overrides that loop), then the early reads' and the fused merge's GPU tests;
#      - bench.kernels decode, both shapes, batch 1 / 4 / 16 / 64 x 512 / 4k / 16k, 200 runs a replay, median of 3:
#        V first (+vfirst1) against the default (K first), PDL off and on, and +early16384 (the early first tile at
#        Llama-8B's 128 x 128 tile, gated off until now) with PDL on;
#      - the floor round: c101f91 (.old, the floor's before), then today's arms (--quick, batch 1 / 16 x 4k).
#      .old: mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old   (untracked, git-excluded)
#   2  carry [".gpu/fk", ".old"], ~2 min warm: the floor round again (a second sample of the same card).
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test logs).
set -u -o pipefail
PART=${1:?part 1 or 2}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, c101, pack, the environment, the call's log, PY
B="$PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3"
FLOOR=triton+pdl+vfirst1,triton+pdl,triton+pdl+vfirst1+early16384,triton+vfirst1,triton
test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
FB=.gpu/fk install_fb
floor_round() {
  step "floor round $1, 200 runs a replay: c101f91, then today's $FLOOR"
  c101 old$1 200
  timeout 90 $B --quick --backends "$FLOOR" --out "$OUT/new$1" > $LOGS/new$1.log 2>&1
  echo "today exit code $?"; grep -E "^decode" $LOGS/new$1.log
}
case $PART in
1)
  step "GPU tests: V first bit for bit; the early reads; the fused merge (auto, PDL)"
  gpu_tests vfirst 240 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_fused_merge.py \
    -m gpu -k "v_first or prefetch or 128_token or plan_written or auto or pdl"
  for m in llama8b smollm2; do
    step "$m: V first / K first, PDL off and on, +early16384; batch 1 / 4 / 16 / 64 x 512 / 4k / 16k"
    timeout 150 $B --models $m --batches 1,4,16,64 --contexts 512,4096,16384 \
      --backends triton+vfirst1,triton,triton+pdl+vfirst1,triton+pdl,triton+pdl+vfirst1+early16384 \
      --out "$OUT/grid-$m" > $LOGS/grid-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-$m.log
  done
  floor_round 1
  ;;
2)
  floor_round 2
  ;;
*) echo "part 1 or 2"; exit 2 ;;
esac
pack
