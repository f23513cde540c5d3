# Issue 16's batch-1 decode floor: the decode's first tile from its early plan. With PDL the decode read its plan and
# page ids before its wait only to aim an L2 prefetch, then read them again after the wait and only then issued its
# K / V loads: three dependent round trips (plan, page ids, K / V) after the wait. Now q and the first tile's K / V
# loads go out right after the wait at the early plan's addresses, with the plan's re-reads in the same round trip,
# and the tile is used only if every re-read equals its early read (else the split runs from its first tile as
# before). decode-read/ (2026-12-06e) showed the read itself owes nothing to the gathers: what is left is the chain.
#   1  carry [".gpu/fk", ".old", ".prev"], ~7 min warm:
#      - GPU tests: the decode's early reads bit for bit against PDL off (eager, graphs), a plan written by the launch
#        just before the decode (the fallback), PDL, the fused merge's races, triton's gpu cases;
#      - before / after on one card, two rounds interleaved, 200 runs a replay then 5 (the floor's method):
#        c101f91 (.old, the floor's before), efbe5b5 (.prev, the chain before this change) and today, arms the merge
#        launch, the fused merge, and the fused merge with 128x4x1 tiles (bench.kernels --quick: batch 1 / 16 x 4k).
#      .old:  mkdir -p .old && git archive c101f91 attnlab | tar -x -C .old
#      .prev: mkdir -p .prev && git archive efbe5b5 attnlab ":(exclude)attnlab/heads" | tar -x -C .prev
#      (both untracked, git-excluded)
#   2  carry [".gpu/fk", ".prev"], ~5 min warm: the fallback test again, then: part 1 found the early tile's gain or
#      loss to follow the launch (1.03x slower to 0.84x at batch 1; 1.08-1.22x slower at batch 16 with 3 stages,
#      1.00x with 1). The decode's tile, warps and stages again (decode_tiles; 2026-12-06d's sweep ran without the
#      early tile), merge launch and fused, batch 1 x 4k, efbe5b5 and today interleaved, one process a shape and a code.
#   3  carry [".gpu/fk", ".old", ".prev"], ~7 min warm: the change as it lands (the early tile on one-stage launches
#      only; the heuristic's one-tile splits take one stage): the GPU tests of part 1 (the fallback test now on one-tile
#      splits), then part 1's floor rounds with the arms default, fused, fused + 128x4x1 and 64x4x1.
#   4  carry [".gpu/fk", ".old", ".prev"], ~6 min warm: part 3 with the kernel's non-early path restored to efbe5b5's
#      order (part 3: the fused merge at Llama-8B's batch 16, 3 stages, no early tile, ran 1.13x slower; its sm_90a SASS
#      now matches efbe5b5's but for register names): the same tests, one round at 200 runs a replay.
#   5  carry [".gpu/fk", ".prev"], ~2 min warm: part 4 found the early tile 1.02-1.03x slower at 128 x 128 tiles
#      (Llama-8B's fused + 128x4x1, three calls); it is now off there (EARLY_TILE_MAX_ELEMS). Batch 1 x 4k, efbe5b5
#      and today: the default and fused + 128x4x1, both shapes, 200 runs a replay.
#   6  carry [".gpu/fk", ".old", ".prev"], ~6 min warm (2026-12-06f): the review's mends of 2026-12-06e on a GPU
#      (experiments/README lead 0: the early tile's masked page ids, the fallback test's pages-only case, a trailing
#      padding request; test_decode_early.py compiled); then one of part 3's floor rounds (c101f91,
#      efbe5b5, today; default, fused, fused + 128x4x1) on whatever card comes (an H200 is the card the floor's
#      figures came from); then the stream rows with kv_stream's new rows mode (every kv head of a token in one
#      program) beside the gathers and contig, both shapes.
#   7  carry [".gpu/fk"], ~2 min warm: the one-stage rule where it was not measured (decode-early/README "Not
#      measured"): PDL off and on, the rule's launch (one stage) against the same tile with 3 stages (decode_tiles), at
#      the cells where the heuristic gives a split of one tile (SmolLM2 batch 1 / 16 / 64 x 128, batch 1 / 16 x 512,
#      batch 1 x 4k; Llama-8B batch 1 / 4 x 512) and three controls of 3 stages in both arms (SmolLM2 batch 16 x 4k,
#      batch 64 x 512 / 4k), one process a model.
#   8  carry [".gpu/fk"], ~3 min warm: part 7 found one stage 2-8% slower without the early tile (PDL off, engine.pdl's
#      default) at SmolLM2 shapes; the rule now applies only where the early tile does (c257429, at plan time; since
#      f62d1f5 per launch: decode.early_launch).
#      The early-read GPU tests (PDL off's reference now has 3 stages at one-tile splits, PDL on 1), then part 7 again.
#   9  carry [".gpu/fk", ".old", ".prev"], ~5 min warm (2026-12-06g): part 8 (its +pdl arms planned outside PDL ran 3
#      stages; since f62d1f5 the launch decides), then one of part 6's floor rounds (c101f91, efbe5b5, today) and the
#      stream rows (gathers, contig, rows at 1x / 4x the programs) on whatever card comes (the floor was set on an H200).
#  10  carry [".gpu/fk"], ~2 min warm (2026-12-06g): the heuristic's decode tile at head dim 128 over the grid. At
#      Llama-8B's batch 1 x 4k 128-token tiles of 8 warps in one stage (merge launch) took 0.92-0.93x the heuristic's
#      64x4x3 (h100-2026-12-05 dtiles2, decode-early call 2); never measured elsewhere. Llama-8B shapes, batch 1 / 4 /
#      16 x 512 / 4k / 16k, PDL off (engine.pdl's default) and on: the heuristic, 128x8x1, 128x8x2, 128x4x1.
#  11  carry [".gpu/fk", ".old"], ~3 min warm: part 10's one winning shape as the heuristic's (a split of two 64-token
#      tiles at head dim 128 runs one 128-token tile of 8 warps in one stage): the early-read GPU tests and triton's
#      decode GPU cases (one of them takes it), the rule against the old tile (decode_tiles=64x4x3) where it fires
#      (batch 1 x 4k, batch 2 x 2k) and a control (batch 1 x 2k), PDL off and on; then c101f91 against today.
#  12  carry [".gpu/fk"], ~1 min warm: the rule's other cells (any batch at 65-128 tokens, unsplit; batch 4 at
#      577-1,152 tokens, 8 at 321-640, 16 at 257-384) beside controls: Llama-8B shapes, batch 1 / 4 / 8 / 16 x 128 /
#      320 / 512 / 1,024, the rule against 64x4x3, PDL off and on.
#  13  carry [".gpu/fk"], ~2 min warm: the review's mends of the rule (no forced split count, head dim 128 only) on a
#      GPU: its GPU test (132 SMs set, the fused merge too) and CPU cases; then what the program bound rests on: batch
#      16 x 384 (384 programs, full splits) and batch 1 x 2,200 (144 programs, a last split of 24 tokens), the
#      heuristic against 64x4x3 and 128x8x1, PDL off and on; and page 64 at batch 1 x 4k (per-token page ids at 128).
#  14  carry [".gpu/fk", ".old", ".prev"], ~4 min warm (2026-12-06h), for an H200 (the card the floor's figures came
#      from; none came in sessions 18-25): part 6 without its GPU tests (they passed on H100s, calls 6-10): one floor
#      round (c101f91, efbe5b5, today; default, fused, fused + 128x4x1; today's +early16384 arms) and the stream rows,
#      both shapes. Run after 13
#      in the same call:  bash experiments/decode-early/run.sh 13; OUT=$OUT/f bash experiments/decode-early/run.sh 14
#  15  carry [".gpu/fk", ".old"], ~3 min warm (2026-12-06h): the early first tile at the two-tile rule's 128 x 128 tile
#      of 8 warps (bench arm +early16384, decode.early_tile_limit). The size gate (128 x 64) came from 128x4x1, 4 warps:
#      1.01-1.03x slower with it, 128 elements of K and of V a thread; 8 warps hold 64, as the gate's own tiles do. The
#      GPU tests (the rule's tile bit for bit with and without it), then Llama-8B batch 1 / 2 / 4 / 8 / 16 x 128 / 512
#      / 1k / 2k / 4k with PDL: the default, +early16384, fused, fused +early16384, fused + 128x4x1; then c101f91
#      against today's default and the gate's arms at batch 1 x 4k (bench.kernels --quick).
#      After 13 in one call:  bash experiments/decode-early/run.sh 13; OUT=$OUT/g bash experiments/decode-early/run.sh 15
#  16  carry [".gpu/fk", ".old"], ~3 min warm (2026-12-06h): with PDL on the default decode has been 2-9% slower than
#      c101f91 at batch 16 x 4k since the KV prefetch came (SmolLM2 26.2 against 24.3 us, call 15). Is it the prefetch
#      before the wait (4 tiles a program, a split's whole KV at batch 16)? Both models, batch 1 / 16 / 64 x 512 / 4k:
#      PDL off, PDL on, and PDL on with 0 / 1 / 2 prefetched tiles (bench arms +kvpf<tiles>); c101f91's --quick cells
#      (batch 1 / 16 x 4k) in the same call.
#  17  carry [".gpu/fk"], ~3 min warm (2026-12-06h): part 16 found 1 prefetched tile as fast as 4 at batch 1 and up to
#      1.12x faster at batch 16 / 64, so KV_PREFETCH_TILES is now 1. The early-read GPU tests (4 / 1 / 0 tiles bit for
#      bit, the early tile's fallback, the rule's tile), then part 16's grid again, plain and after one layer's MLP
#      (--between gemm: the engine's kernel before the attention is a projection): PDL off, on (1 tile), +kvpf4,
#      +kvpf2.
#  18  carry [".gpu/fk"], ~1.5 min warm (2026-12-06h): the session's last commit on a GPU: the rule's tile and the
#      prefetch bit-for-bit tests, and bench.kernels' arm switches with --launches at Llama-8B's batch 1 x 4k (+early,
#      +kvpf, and +early without +pdl, which must be refused).
# (part 5 as it ran on 2026-12-06e named its files gate-<code>-<random>: their order is in run5.log)
# Output: $OUT/runPART.log (the console) and resultsPART.tgz (the tables as .md / .json, the test logs).
set -u -o pipefail
PART=${1:?part 1 to 18}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, c101, pack, the environment, the call's log, PY
K="$PY -m attnlab.bench.kernels --phases decode --quick"
ARMS=triton+pdl,triton/fused_merge=true+pdl,triton/fused_merge=true/decode_tiles=128x4x1+pdl
case $PART in
1|3|4|6|9|14)
  for d in .old .prev; do test -d $d/attnlab || { echo "$d/attnlab missing: carry it (see the header)"; exit 1; }; done
  [ $PART = 9 ] && OUT=$OUT/p8 bash experiments/decode-early/run.sh 8 && echo "=== part 8 done: the floor round next"
  [ $PART = 9 ] || FB=.gpu/fk install_fb
  case $PART in 3|4) ARMS=$ARMS,triton/decode_tiles=64x4x1+pdl ;; esac
  ROUNDS="1 2"; REPS="200 5"; [ $PART = 4 ] && ROUNDS=1 && REPS=200; [ $PART -ge 6 ] && ROUNDS=1
  if [ $PART = 9 ] || [ $PART = 14 ]; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  elif [ $PART = 6 ]; then
    step "GPU tests: the early tile's mends (bit for bit compiled, the fallback's pages-only case), PDL"
    gpu_tests lead0 240 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_decode_early.py
  else
    step "GPU tests: early plan reads (bit for bit, the fallback), PDL, fused merge races, triton's gpu cases"
    gpu_tests early 300 tests/integration/test_gpu_decode_prefetch.py tests/integration/test_gpu_pdl.py \
      tests/backends/test_fused_merge.py tests/backends/test_triton.py -m gpu
  fi
  for r in $ROUNDS; do
    for reps in $REPS; do
      step "round $r, $reps runs a replay: c101f91, efbe5b5, today"
      c101 old-r$r-$reps $reps
      (cd .prev && PYTHONPATH=/opt/site:$PWD timeout 90 $K --backends $ARMS --reps $reps --repeats 3 \
        --out "$OUT/prev-r$r-$reps" > $LOGS/prev-r$r-$reps.log 2>&1; echo "efbe5b5 exit code $?")
      grep -E "^decode" $LOGS/prev-r$r-$reps.log
      timeout 90 $K --backends $ARMS --reps $reps --repeats 3 --out "$OUT/new-r$r-$reps" > $LOGS/new-r$r-$reps.log 2>&1
      echo "today exit code $?"; grep -E "^decode" $LOGS/new-r$r-$reps.log
    done
  done
  if [ $PART = 14 ]; then
    step "today's early tile at the two-tile rule's 128 x 128 tile (+early16384), merge launch and fused"
    timeout 90 $K --backends triton+pdl+early16384,triton/fused_merge=true+pdl+early16384 --reps 200 --repeats 3 \
      --out "$OUT/early14" > $LOGS/early14.log 2>&1
    echo "today exit code $?"; grep -E "^decode" $LOGS/early14.log
  fi
  if [ $PART -ge 6 ]; then
    for m in llama8b smollm2; do
      layers=8; [ $m = smollm2 ] && layers=64
      step "bench.launch_floor, $m, $layers layers: the decode grid's read as gathers, contiguous, every head a program"
      timeout 200 $PY -m attnlab.bench.launch_floor --models $m --contexts 4096 --stream-modes contig,rows \
        --stream-splits 16,64 --layers $layers --out "$OUT/lfm-$m" > $LOGS/lfm-$m.log 2>&1
      echo "exit code $?"; grep -E "^\||Error|skipped" $LOGS/lfm-$m.log
    done
  fi
  ;;
2)
  FB=.gpu/fk install_fb
  test -d .prev/attnlab || { echo ".prev/attnlab missing: carry it (see the header)"; exit 1; }
  step "GPU test: a plan written by the launch just before the decode (its reference check mended after part 1)"
  gpu_tests fallback 120 tests/integration/test_gpu_decode_prefetch.py -k plan_written
  for m in smollm2 llama8b; do
    if [ $m = smollm2 ]; then tiles="128x4x3 128x4x1 64x4x1 64x2x1 128x2x1 128x8x1 256x4x1"
    else tiles="64x4x3 128x4x1 64x4x1 128x8x1 256x8x1 128x4x2 64x2x1"; fi
    specs=""
    for t in $tiles; do specs="$specs,triton/decode_tiles=$t+pdl,triton/fused_merge=true/decode_tiles=$t+pdl"; done
    for r in 1 2; do
      for code in prev new; do
        step "round $r, $code: the decode's launch, merge launch and fused, $m shapes, batch 1 x 4k"
        dir=.; [ $code = prev ] && dir=.prev
        (cd $dir && PYTHONPATH=/opt/site:$PWD timeout 120 $PY -m attnlab.bench.kernels --phases decode \
          --backends "${specs#,}" --batches 1 --contexts 4096 --models $m --reps 200 --repeats 3 \
          --out "$OUT/tiles-$m-$code-r$r" > $LOGS/tiles-$m-$code-r$r.log 2>&1; echo "exit code $?")
        grep -E "^decode|Error" $LOGS/tiles-$m-$code-r$r.log
      done
    done
  done
  ;;
5)
  FB=.gpu/fk install_fb
  n=0
  for code in prev new prev new; do
    n=$((n + 1)); dir=.; [ $code = prev ] && dir=.prev
    step "$code: batch 1 x 4k, the default and fused + 128x4x1"
    (cd $dir && PYTHONPATH=/opt/site:$PWD timeout 60 $PY -m attnlab.bench.kernels --phases decode --batches 1 \
      --contexts 4096 --models smollm2,llama8b --backends triton+pdl,triton/fused_merge=true/decode_tiles=128x4x1+pdl \
      --reps 200 --repeats 3 --out "$OUT/gate-$n-$code" > $LOGS/gate-$n.log 2>&1; echo "exit code $?")
    grep -E "^decode|Error" $LOGS/gate-$n.log
  done
  ;;
7|8)
  FB=.gpu/fk install_fb
  if [ $PART = 8 ]; then
    step "GPU tests: the early reads bit for bit (PDL off's reference of 3 stages at one-tile splits), the fallback"
    gpu_tests early8 240 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_decode_early.py
  fi
  for m in smollm2 llama8b; do
    if [ $m = smollm2 ]; then t=128x4x3; cells="--batches 1,16,64 --contexts 128,512,4096"
    else t=64x4x3; cells="--batches 1,4 --contexts 512"; fi
    step "$m: the one-stage rule against 3 stages ($t), PDL off and on"
    timeout 200 $PY -m attnlab.bench.kernels --phases decode --models $m $cells \
      --backends triton,triton/decode_tiles=$t,triton+pdl,triton/decode_tiles=$t+pdl --reps 200 --repeats 3 \
      --out "$OUT/stages-$m" > $LOGS/stages-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/stages-$m.log
  done
  ;;
10)
  FB=.gpu/fk install_fb
  for pdl in "" "+pdl"; do
    specs=triton$pdl
    for t in 128x8x1 128x8x2 128x4x1; do specs="$specs,triton/decode_tiles=$t$pdl"; done
    step "llama8b, PDL $([ -n "$pdl" ] && echo on || echo off): the heuristic's tile against 128-token tiles over the grid"
    timeout 200 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1,4,16 \
      --contexts 512,4096,16384 --backends "$specs" --reps 200 --repeats 3 --out "$OUT/grid128${pdl:+-pdl}" \
      > $LOGS/grid128$pdl.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/grid128$pdl.log
  done
  ;;
11)
  FB=.gpu/fk install_fb
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  step "GPU tests: the early reads bit for bit (a 32-split head-dim-128 case takes the rule), triton's decode cases"
  gpu_tests rule11 200 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_triton.py -m gpu -k decode
  step "llama8b: the rule (128x8x1 where a split held two 64-token tiles) against 64x4x3, PDL off and on"
  timeout 120 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1,2 --contexts 2048,4096 \
    --backends triton,triton/decode_tiles=64x4x3,triton+pdl,triton/decode_tiles=64x4x3+pdl --reps 200 --repeats 3 \
    --out "$OUT/rule" > $LOGS/rule.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/rule.log
  step "c101f91 against today, 200 runs a replay"
  c101 old11 200
  timeout 90 $K --backends $ARMS --reps 200 --repeats 3 --out "$OUT/new11" > $LOGS/new11.log 2>&1
  echo "today exit code $?"; grep -E "^decode" $LOGS/new11.log
  ;;
12)
  FB=.gpu/fk install_fb
  step "llama8b: the rule against 64x4x3 at its other cells and controls, PDL off and on"
  timeout 200 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1,4,8,16 \
    --contexts 128,320,512,1024 --backends triton,triton/decode_tiles=64x4x3,triton+pdl,triton/decode_tiles=64x4x3+pdl \
    --reps 200 --repeats 3 --out "$OUT/rule12" > $LOGS/rule12.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/rule12.log
  ;;
13)
  FB=.gpu/fk install_fb
  step "GPU tests: the heuristic's 128-token tile bit for bit (merge launch and fused), the rule's CPU cases"
  gpu_tests rule13 200 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_triton.py \
    -k "128_token_tile or two_tile"
  a=triton,triton/decode_tiles=64x4x3,triton/decode_tiles=128x8x1
  step "llama8b: batch 16 x 384 and batch 1 x 2,200, the heuristic against 64x4x3 and 128x8x1, PDL off and on"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1,16 --contexts 384,2200 \
    --backends "$a,${a//,/+pdl,}+pdl" --reps 200 --repeats 3 --out "$OUT/bound13" > $LOGS/bound13.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/bound13.log
  step "llama8b, page 64: batch 1 x 4k, the rule against 64x4x3, PDL off and on"
  timeout 120 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1 --contexts 4096 --page-size 64 \
    --backends triton,triton/decode_tiles=64x4x3,triton+pdl,triton/decode_tiles=64x4x3+pdl --reps 200 --repeats 3 \
    --out "$OUT/page64" > $LOGS/page64.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/page64.log
  ;;
15)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  step "GPU tests: the rule's 128 x 128 tile bit for bit, the early-tile gate at its default and at 128 x 128"
  gpu_tests gate15 240 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_triton.py \
    -k "128_token_tile or two_tile or gate"
  a=triton+pdl,triton+pdl+early16384,triton/fused_merge=true+pdl,triton/fused_merge=true+pdl+early16384
  step "llama8b: the early tile at the rule's 128 x 128 tile (+early16384) against none, merge launch and fused, PDL on"
  timeout 240 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1,2,4,8,16 \
    --contexts 128,512,1024,2048,4096 --backends "$a,triton/fused_merge=true/decode_tiles=128x4x1+pdl" --reps 200 \
    --repeats 3 --out "$OUT/gate15" > $LOGS/gate15.log 2>&1
  echo "exit code $?"; grep -E "^decode|Error" $LOGS/gate15.log
  step "floor round, 200 runs a replay: c101f91, then today's default and the gate's arms"
  c101 old15 200
  timeout 120 $K --backends "$a" --reps 200 --repeats 3 --out "$OUT/new15" > $LOGS/new15.log 2>&1
  echo "today exit code $?"; grep -E "^decode" $LOGS/new15.log
  ;;
16)
  test -d .old/attnlab || { echo ".old/attnlab missing: carry it (see the header)"; exit 1; }
  FB=.gpu/fk install_fb
  a=triton,triton+pdl,triton+pdl+kvpf0,triton+pdl+kvpf1,triton+pdl+kvpf2
  for m in smollm2 llama8b; do
    step "$m: the decode's KV prefetch with PDL, batch 1 / 16 / 64 x 512 / 4k"
    timeout 200 $PY -m attnlab.bench.kernels --phases decode --models $m --batches 1,16,64 --contexts 512,4096 \
      --backends "$a" --reps 200 --repeats 3 --out "$OUT/kvpf16-$m" > $LOGS/kvpf16-$m.log 2>&1
    echo "exit code $?"; grep -E "^decode|Error" $LOGS/kvpf16-$m.log
  done
  step "c101f91, 200 runs a replay (batch 1 / 16 x 4k)"
  c101 old16 200
  ;;
17)
  FB=.gpu/fk install_fb
  step "GPU tests: the early reads bit for bit at 4 / 1 / 0 tiles, the fallback, the rule's tile"
  gpu_tests kvpf17 240 tests/integration/test_gpu_decode_prefetch.py tests/backends/test_decode_early.py
  a=triton,triton+pdl,triton+pdl+kvpf4,triton+pdl+kvpf2
  for between in none gemm; do
    for m in smollm2 llama8b; do
      b=(); [ $between = gemm ] && b=(--between gemm)
      step "$m, between: $between: KV_PREFETCH_TILES 1 against 4 and 2, batch 1 / 16 / 64 x 512 / 4k"
      timeout 200 $PY -m attnlab.bench.kernels --phases decode --models $m --batches 1,16,64 --contexts 512,4096 \
        --backends "$a" --reps 200 --repeats 3 "${b[@]}" --out "$OUT/kvpf17-$m-$between" > $LOGS/kvpf17-$m-$between.log 2>&1
      echo "exit code $?"; grep -E "^decode|Error" $LOGS/kvpf17-$m-$between.log
    done
  done
  ;;
18)
  FB=.gpu/fk install_fb
  step "GPU tests: the rule's tile and the prefetch, bit for bit"
  gpu_tests smoke18 200 tests/integration/test_gpu_decode_prefetch.py -k "128_token_tile or prefetch_changes_no_bit"
  step "llama8b b1 x 4k: arm switches with --launches (+early16384 without +pdl must be skipped)"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode --models llama8b --batches 1 --contexts 4096 \
    --backends triton+pdl,triton+pdl+early16384,triton+pdl+kvpf4,triton+early16384 --reps 200 --repeats 3 \
    --launches --out "$OUT/smoke18" > $LOGS/smoke18.log 2>&1
  echo "exit code $?"; grep -E "^decode|skipping|Error" $LOGS/smoke18.log
  ;;
*) echo "part 1 to 18"; exit 2 ;;
esac
pack
