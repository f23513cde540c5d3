# Issue 16's batch-1 decode floor: fused_merge=auto, the triton backend's new default. The decode's split merge runs
# inside the kernel (the last split to arrive merges) where every split holds one KV tile, and as its own launch
# elsewhere; verify (the extend kernel) and engine.invariant keep the merge launch. decode-early/ call 13 (H100,
# Llama-8B shapes, PDL on) had the fused merge at 0.72-0.91x the merge launch's time in all ten split cells of one tile
# (batch 1-8 x 512-4k), and 0.87-1.27x where a split loops over several; fused-merge/ call 3 (SmolLM2 shapes) the same
# split: 0.90-0.95x at its four one-tile cells, 0.86-1.06x elsewhere.
#   1  carry [".gpu/fk", ".old"], ~5-6 min warm (one call: the device budget left for it):
#      - GPU tests: the fused merge racing, auto's batch-1 4k cells with PDL off / on and the PDL cases (the other
#        race cases set fused_merge=true: their kernels did not change);
#      - bench.kernels decode, both shapes, batch 1 / 2 / 4 / 8 / 16 x 512 / 1k / 2k / 4k, 200 runs a replay:
#        fused_merge=false (the old default) and auto with PDL off (engine.pdl's default) and on, and true with PDL on
#        (128 tokens are unsplit, no merge; batch 64 splits hold several tiles: auto is false's launch there);
#      - the floor round: c101f91 (.old, the floor's before) and today's default and fused_merge=false (--quick);
#      - after one layer's MLP (--between gemm), false against auto, PDL off and on, batch 1 / 4 / 16 x 512 / 4k;
#      - if the call has the time (t < 330 s): inside the engine's CUDA graphs (bench.spec --kernel-profile, random
#        weights, PDL off so CUPTI's kernel times hold no wait), SmolLM2-135M (triton GEMMs), batch 1, prompts of 3,960
#        tokens: the target-only rows' decode and the n-gram rows' verify (a control: auto does not touch it).
#      .old: mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old   (untracked, git-excluded)
#   2  carry [".gpu/fk"], ~3 min warm: part 1's kernel profile at Llama-3.1-8B (cuBLAS GEMMs); with SMOL=1 SmolLM2's
#      too (when part 1 had no time for it).
#   3  carry [".gpu/fk", ".old"], ~2.5 min warm: part 1 at its least, for a call with little device time left: auto's
#      GPU tests; false against auto, PDL off and on, batch 1 / 2 / 4 / 8 x 512 / 4k, both shapes; the floor round.
#   4  carry [".gpu/fk"], ~5 min warm (2026-12-07, after part 1 found auto 1.06-1.15x slower than the merge launch at
#      one-tile cells after the MLP with PDL on): part 2, then end to end with PDL on (timed, not profiled: CUPTI's
#      kernel times would hold the PDL wait), SmolLM2-135M on random weights, prompts of 3,960 tokens, batch 1,
#      target-only and n-gram rows, false against auto in the same rounds.
#   5  carry [".gpu/fk"], ~4 min warm (2026-12-07): splits of several tiles, where auto keeps the merge launch. Call 1
#      had fused_merge=true (PDL on) at 0.85-0.96x auto's time at Llama-8B's cells of 512 programs and 0.90x at
#      SmolLM2's one of 528, 0.96-1.21x at every cell of at most 384; call 13 (a 4-tile KV prefetch) differed. So:
#      auto against true, PDL off and on, batch 2-64 x 1k / 4k / 16k, both shapes, then batch 4 / 16 / 64 x 4k after
#      one layer's MLP; with .old carried, a floor round of the default (PDL on and off) too.
#   6  carry [".gpu/fk"], ~2.5 min warm (2026-12-07): is it the registers? Call 3's fused Llama-8B tile without PDL
#      holds 155 registers (3 programs a SM; regs.py). The merge launch against fused_merge=true, PDL off and on,
#      batch 4-32 x 4k / 16k, as bench.kernels runs them and with the fused launches capped at 128 registers
#      (capped.py, the same arms in another process); SmolLM2's cells capped too (the cap spills there without PDL).
#   7  carry [".gpu/fk"], ~4 min warm (2026-12-07, after call 4 found the capped fused Llama-8B tile faster than the
#      merge launch in both PDL modes): auto now fuses that tile's loops (at most 16 splits) under the cap. Its GPU
#      tests (raced and replayed at batch 4 x 4k and 16 x 16k, PDL off / on; and, at commit 79ca901, the two-level
#      merge's, removed since with its +mgroup arms: run at that commit to reproduce call 5); with ARMS2
#      set, those arms at both shapes' batch 1 x 4k / 16k; then auto against fused_merge=false, Llama-8B, batch 1 / 2 /
#      4 / 8 / 16 x 4k / 16k, PDL off and on (cells past 16 splits or of one tile are controls: their launch did not
#      change). Ordered for a call that may be cut: the device budget left for it was under 300 s.
#   8  carry [".gpu/fk", ".old"], ~1.5-2 min warm: a floor round of ARMS against c101f91, 200 runs a replay (FLOOR_SECS
#      for today's arms, 150 unless set). By default today's decode with PDL on, with the early tile's old gate
#      (+early8192), and with PDL off. Calls 6-7 (2026-12-07, H200) set ARMS: call 6 the two-level merge's arms (commit
#      79ca901) with PDL on, +early16384 (the default gate since), and 64 splits of one 64-token tile (T64 below).
#   9  carry [".gpu/fk", ".old"], ~5 min on a fresh machine (lead 0 of experiments/README.md, after 2026-12-07's gate):
#      the early tile's gate at 128 x 128 as the default on a GPU: its GPU tests (test_gpu_decode_prefetch.py's
#      128-token-tile cases at gate-128x64 / gate-default, triton's decode cases, and test_fused_merge.py: the merge's
#      one-level code since the two-level merge's removal, same registers, not yet run), then part 8's floor round,
#      with two arms of 16 splits (decode-early/ call 17's stream rows: on the H200 Llama-8B's K / V read over 16 splits took
#      6.73 us against 7.47 on the decode's 32): the heuristic's 64-token tiles (auto fuses them under the register
#      cap) and 128 x 128 tiles of 8 warps, 2 stages, fused.
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test logs).
set -u -o pipefail
PART=${1:?part 1 to 9}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, c101, pack, the environment, the call's log, PY, S
B="$PY -m attnlab.bench.kernels --phases decode --reps 200 --repeats 3"
# grid NAME SECS BATCHES CONTEXTS ARMS [BENCH-FLAGS...]: bench.kernels' decode over both shapes, one process a shape,
# NAME-<shape> in $OUT
grid() {
  local name=$1 secs=$2 batches=$3 contexts=$4 arms=$5 m; shift 5
  for m in smollm2 llama8b; do
    step "$m: $arms, batch $batches x $contexts $*"
    timeout "$secs" $B --models $m --batches "$batches" --contexts "$contexts" --backends "$arms" "$@" \
      --out "$OUT/$name-$m" > $LOGS/$name-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/$name-$m.log
  done
}
# floor_round ARMS: c101f91's decode (.old, the floor's before) then today's ARMS, --quick, 200 runs a replay
floor_round() {
  step "floor round, 200 runs a replay: c101f91, then today's $1"
  c101 old 200
  timeout "${FLOOR_SECS:-60}" $B --quick --backends "$1" --out "$OUT/new" > $LOGS/new.log 2>&1
  echo "today exit code $?"; grep -E "^decode" $LOGS/new.log
}
# profile MODEL GEMM: the kernel profile inside the engine's graphs, PDL off, false against auto (the rows' attention
# and split-merge kernels on the console, the log as kp-MODEL.log in $OUT)
profile() {
  step "in the engine's graphs, PDL off: $1, gemm $2, kernel profile, fused_merge false / auto"
  timeout 150 $S --model $1 --gemm $2 --weights random --drafters ngram --k 4 --batch 1 --prompt-lengths 3960 \
    --backends triton/fused_merge=false,triton --num-prompts 2 --new 128 --repeats 2 --same-rounds --ignore-eos \
    --kernel-profile 6 --out "$OUT/kp-$1" > $LOGS/kp-$1.log 2>&1
  echo "exit code $?"; grep -E "^\| (attention|split merge|role)|iterations \(|^### |Error" $LOGS/kp-$1.log
  cp $LOGS/kp-$1.log "$OUT/"
}
case $PART in
1)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  step "GPU tests: the fused merge racing (auto at batch 1 x 4k, PDL off / on; the PDL cases)"
  gpu_tests auto1 120 tests/backends/test_fused_merge.py -m gpu -k "auto or pdl"
  grid grid 100 1,2,4,8,16 512,1024,2048,4096 \
    triton/fused_merge=false,triton,triton/fused_merge=false+pdl,triton+pdl,triton/fused_merge=true+pdl
  floor_round triton+pdl,triton/fused_merge=false+pdl,triton,triton/fused_merge=false
  step "after one layer's MLP (--between gemm): fused_merge false / auto, PDL off and on"
  grid gemm 60 1,4,16 512,4096 triton/fused_merge=false,triton,triton/fused_merge=false+pdl,triton+pdl --between gemm
  if [ $(( $(date +%s) - T0 )) -lt 330 ]; then profile smollm2-135m triton
  else echo "=== no time left for the kernel profile (SMOL=1 part 2)"; fi
  ;;
2)
  FB=.gpu/fk install_fb
  profile llama-3.1-8b cublas
  [ "${SMOL:-0}" = 1 ] && profile smollm2-135m triton
  ;;
3)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  step "GPU tests: auto at batch 1 x 4k racing, PDL off / on"
  gpu_tests auto3 70 tests/backends/test_fused_merge.py -m gpu -k auto
  grid small 50 1,2,4,8 512,4096 triton/fused_merge=false,triton,triton/fused_merge=false+pdl,triton+pdl
  floor_round triton+pdl,triton/fused_merge=false+pdl
  ;;
4)
  FB=.gpu/fk install_fb
  profile llama-3.1-8b cublas
  step "end to end, PDL on, timed: SmolLM2-135M (random weights), 3,960-token prompts, fused_merge false / auto"
  timeout 200 $S --gemm triton --pdl --weights random --backends triton/fused_merge=false,triton --drafters ngram \
    --k 4 --batch 1 --prompt-lengths 3960 --num-prompts 2 --new 128 --repeats 5 --same-rounds --ignore-eos \
    --out "$OUT/e2e-pdl" > $LOGS/e2e-pdl.log 2>&1
  echo "exit code $?"; grep -vE "^\s*$|it/s|%\|" $LOGS/e2e-pdl.log | tail -n 20
  ;;
5)
  FB=.gpu/fk install_fb
  A=triton,triton/fused_merge=true,triton+pdl,triton/fused_merge=true+pdl
  grid multi 150 2,4,8,16,32,64 1024,4096,16384 $A
  grid multigemm 90 4,16,64 4096 $A --between gemm
  if [ -d .old/attnlab ]; then floor_round triton+pdl,triton; else echo "=== no .old: no floor round"; fi
  ;;
6)
  FB=.gpu/fk install_fb
  A=triton/fused_merge=false,triton/fused_merge=true,triton/fused_merge=false+pdl,triton/fused_merge=true+pdl
  C="--phases decode --reps 200 --repeats 3 --batches 4,8,16,32 --contexts 4096,16384 --backends $A"
  for run in "llama8b uncapped" "llama8b capped" "smollm2 capped"; do
    set -- $run
    step "$1, fused launches $2"
    if [ $2 = capped ]; then X="experiments/fused-merge-auto/capped.py --maxnreg 128"; else X="-m attnlab.bench.kernels"; fi
    timeout 100 $PY $X $C --models $1 --out "$OUT/$2-$1" > $LOGS/$2-$1.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/$2-$1.log
  done
  ;;
7)
  FB=.gpu/fk install_fb
  step "GPU tests: auto's fused loops under the register cap, raced and replayed"
  gpu_tests capped 150 tests/backends/test_fused_merge.py -m gpu -k capped
  if [ -n "${ARMS2:-}" ]; then
    step "both shapes, batch 1 x 4k / 16k: $ARMS2"
    timeout 90 $B --models llama8b,smollm2 --batches 1 --contexts 4096,16384 --backends "$ARMS2" \
      --out "$OUT/arms2" > $LOGS/arms2.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/arms2.log
  fi
  step "llama8b: auto (the cap's rule) against the merge launch, PDL off and on"
  timeout 120 $B --models llama8b --batches 1,2,4,8,16 --contexts 4096,16384 \
    --backends triton/fused_merge=false,triton,triton/fused_merge=false+pdl,triton+pdl --out "$OUT/rule-llama8b" \
    > $LOGS/rule-llama8b.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/rule-llama8b.log
  ;;
8)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  T64=triton/num_splits=64/decode_tiles=64x4x1/fused_merge=true  # call 6: ARMS=...,$T64+pdl,$T64+pdl+mgroup8
  : "${FLOOR_SECS:=150}"
  floor_round "${ARMS:-triton+pdl,triton+pdl+early8192,triton}"
  ;;
9)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  step "GPU tests: the early tile's gate (its 128 x 128 tile bit for bit), triton's decode cases, the fused merge"
  gpu_tests gate 360 -m gpu tests/integration/test_gpu_decode_prefetch.py tests/backends/test_fused_merge.py \
    tests/backends/test_triton.py -k "decode or early or tile or merge or fused or capped or auto or pdl"
  : "${FLOOR_SECS:=120}"
  S16=triton/num_splits=16  # 128 programs of 256 tokens at Llama-8B's batch 1 x 4k: the fastest read on the H200
  floor_round "${ARMS:-triton+pdl,triton+pdl+early8192,triton,$S16+pdl,$S16/decode_tiles=128x8x2/fused_merge=true+pdl}"
  ;;
*) echo "part 1 to 9"; exit 2 ;;
esac
pack
