# Issue 16's batch-1 decode floor: the early first tile loaded into registers before the PDL wait (decode.PRELOAD,
# bench arms +preload1: its K; +preload2: its K and V), all rows but the current token's, which is loaded after it.
# Until now the tile was prefetched into L2 before the wait and loaded after it: DRAM -> L2 overlaps the launch
# before, L2 -> registers does not. README.md says what it found.
#   1  carry [".gpu/fk", ".old"], ~8 min on a fresh machine (ordered for a call that may be cut):
#      - three floor rounds (fused-merge-auto/run.sh 8: c101f91, the floor's before, in the same call) of the default
#        (PDL on), +preload1 and +preload2, 200 runs a replay, batch 1 / 16 x 4k, both shapes;
#      - bench.kernels decode, the same arms, batch 1 / 4 / 16 x 128 / 512 / 4k, both shapes (the cells where a split
#        or an unsplit launch is one early tile, and controls);
#      - GPU tests: the decode's early reads bit for bit (test_gpu_decode_prefetch.py: the preloads at every early-tile
#        case, a plan and the current token's K / V written late by the launch before, on purpose), the forced early
#        tile compiled without PDL (test_decode_early.py).
#      .old: mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old   (untracked, git-excluded)
#   2  carry [".gpu/fk", ".old"], ~8 min on a fresh machine (after part 1: the preload is the default, K and V on tiles
#      of at most 128 x 64, K past them): three floor rounds of the default against +preload0 (part 1's default) and
#      PDL off, c101f91 in the same call, with two arms for Llama-8B's cell, whose 256 programs of 128 registers fill
#      the register file so that the next decode cannot start early (README): 16 splits of two 128 x 128 tiles in one
#      stage (128 programs, one a SM; the first tile preloaded, both prefetched: +kvpf2) and 64 splits of one 64-token
#      tile (K and V preloaded); then the GPU tests of the decode with PDL (part 1's, the fused merge's, and triton's
#      decode cases). Call 4 (ROUNDS=1) cut those tests at 330 s on a fresh machine (their compiles): 450 s since;
#      with three rounds the call needs ~9.5 min, so run it with ROUNDS=1 on a fresh machine.
#   3  carry [".gpu/fk", ".old"], ~3 min on a fresh machine: for an H200, the card the floor was set on (lead 0 of
#      experiments/README.md): three floor rounds of the default against +preload0, PDL off, 16 splits (on the H200
#      the read over 16 splits was the fastest, decode-early/ call 17: the heuristic's tile for them, and two 128-token
#      tiles of 8 warps fused) and bf16 partials (decode-partials/).
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test logs).
set -u -o pipefail
PART=${1:?part 1, 2 or 3}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
ARMS3=triton+pdl,triton+pdl+preload1,triton+pdl+preload2
case $PART in
1)
  FLOOR_SECS=90 floor_rounds $ARMS3
  for m in smollm2 llama8b; do
    step "$m: $ARMS3, batch 1 / 4 / 16 x 128 / 512 / 4k"
    timeout 150 $PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3 --models $m --batches 1,4,16 \
      --contexts 128,512,4096 --backends "$ARMS3" --out "$OUT/grid-$m" > $LOGS/grid-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid-$m.log
  done
  step "GPU tests: the early reads and the preloads bit for bit, the late plan and K / V, the forced early tile"
  gpu_tests preload 330 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_decode_early.py
  ;;
2)
  S16=triton/num_splits=16/decode_tiles=128x8x1/fused_merge=true
  T64=triton/num_splits=64/decode_tiles=64x4x1/fused_merge=true
  FLOOR_SECS=90 floor_rounds triton+pdl,triton+pdl+preload0,triton,$S16+pdl+kvpf2,$T64+pdl
  step "GPU tests: the decode's early reads, the preloads, the fused merge, triton's decode cases"
  gpu_tests default 450 -m gpu tests/integration/test_gpu_decode_prefetch.py \
    tests/backends/test_fused_merge.py tests/backends/test_triton.py -k "decode or early or tile or merge or fused or \
capped or auto or pdl or preload"
  ;;
3)
  S16=triton/num_splits=16
  A=triton+pdl,triton+pdl+preload0,triton,$S16+pdl,$S16/decode_tiles=128x8x2/fused_merge=true+pdl
  FLOOR_SECS=90 floor_rounds $A,triton/decode_partials=out+pdl
  ;;
*) echo "part 1, 2 or 3"; exit 2 ;;
esac
pack
